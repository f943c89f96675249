"""tau of best-first cure over the int8 default pair at fixed budgets (no tuner, re-draft pass off, so nothing
depends on the clock), with the target's activation rows in one int8 level and in two, in one process; 6 held-out
prompts each of HumanEval 21.., GSM8K 1.. and chat20, 64 tokens, a fresh engine per (level, budget, set).

    python3 benchmarks/results/int8_activations_s46_cpu/fixed_budget_tau.py [8,16]
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quality import TWO_LEVELS, one_level  # noqa: E402

from cure_core import cpu_kernels, int8_decoder, load  # noqa: E402
from cure_core.engine import Engine  # noqa: E402
from cure_tasks import load_set, raw_by_default  # noqa: E402

torch.set_num_threads(2)
budgets = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "8,16").split(",")]
m = load(strategy="cure", dtype="int8")
sets = {}
for spec in ("humaneval@20", "gsm8k", os.path.join("benchmarks", "prompts", "chat20.jsonl")):
    name, task, problems = load_set(spec, 6)
    sets[name] = [m.encode(p.prompt, chat=not raw_by_default(task)) for p in problems]
out = {}
for level, rule in (("one level", one_level), ("two levels", TWO_LEVELS)):
    cpu_kernels.row_int8_matmul = int8_decoder.row_int8_matmul = rule
    for v in budgets:
        cfg = m.config_for(strategy="cure", v_max=v, max_new_tokens=64, redrafts=0)
        assert not cfg.auto_budget
        for name, prompts in sets.items():
            engine = Engine(m.engine.pair)
            toks = blocks = 0
            for p in prompts:
                for b in engine.generate(p, cfg):
                    toks, blocks = toks + len(b.emitted), blocks + 1
            out[f"{level} V={v} {name}"] = {"tokens": toks, "blocks": blocks, "tau": round(toks / blocks, 3)}
            print(level, v, name, out[f"{level} V={v} {name}"], flush=True)
print(json.dumps(out, indent=1))
