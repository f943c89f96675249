"""tau of best-first cure on the default pair at fixed budgets, re-draft pass off (so nothing depends on timing
and two code versions compare exactly), on 6 held-out prompts each of HumanEval 21.., GSM8K 1.. and chat20, 64
tokens. Run from the repository root (PYTHONPATH=<other checkout> for the other version):

    python3 benchmarks/results/lookup_own_nodes_s43_cpu/default_pair_tau.py 8,16
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

from cure_core import load  # noqa: E402
from cure_tasks import load_set, raw_by_default  # noqa: E402

torch.set_num_threads(1)
budgets = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "8,16").split(",")]
m = load(strategy="cure")
sets = {}
for spec in ("humaneval@20", "gsm8k", os.path.join("benchmarks", "prompts", "chat20.jsonl")):
    name, task, problems = load_set(spec, 6)
    sets[name] = [m.encode(p.prompt, chat=not raw_by_default(task)) for p in problems]
out = {}
for v in budgets:
    cfg = m.config_for(strategy="cure", v_max=v, max_new_tokens=64, redrafts=0)
    for name, prompts in sets.items():
        toks = blocks = 0
        for p in prompts:
            for b in m.engine.generate(p, cfg):
                toks, blocks = toks + len(b.emitted), blocks + 1
        out[f"{name} V={v}"] = {"tokens": toks, "blocks": blocks, "tau": round(toks / blocks, 3)}
        print(name, v, out[f"{name} V={v}"], flush=True)
print(json.dumps(out))
