"""Best-first cure over the 0.5B drafting for itself (float32 exact copy, AR), K=16, V=16: the blocks whose tree
left out part of the drafted chain. Run from the repository root:

    python3 benchmarks/results/lookup_own_nodes_s43_cpu/chain_cuts.py [--lookup N] [--tokens 480] [--per-set 2]
"""
import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import drafter_sweep  # noqa: E402
from cure_core.api import open_pair  # noqa: E402
from cure_core.config import DecodeConfig  # noqa: E402
from cure_core.engine import Engine  # noqa: E402
from cure_core.options import EngineArgs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lookup", type=int, default=None)
ap.add_argument("--tokens", type=int, default=480)
ap.add_argument("--per-set", type=int, default=2)
a = ap.parse_args()
torch.set_num_threads(1)
alias = "qwen-coder-0.5b"
exact = open_pair(EngineArgs(target=alias, draft=alias, drafter="ar", strategy="sd", draft_dtype="float32"),
                  strategies=["sd", "cure", "ddtree"])
prompts, _ = drafter_sweep.held_out(exact, a.per_set)
cfg = DecodeConfig.of(strategy="cure", k=16, v_max=16, max_new_tokens=a.tokens, stop_at_eos=False)
if a.lookup is not None:
    cfg = cfg.with_(lookup=a.lookup)
engine, blocks = Engine(exact.pair), 0
for i, prompt in enumerate(prompts):
    for b in engine.generate(prompt, cfg):
        blocks += 1
        chain = sum(1 for n in b.nodes if n.branch == 0)
        if chain < len(b.draft):
            print(f"prompt {i} block {b.index}: chain {chain} of {len(b.draft)} drafted, {len(b.nodes)} nodes, "
                  f"accepted {len(b.accepted)} (branch {b.winner})", flush=True)
print("blocks", blocks)
