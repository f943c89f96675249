"""Engine overhead per block: wall time of a block minus the time spent inside model forwards.

Goal (engine issue): under 2 ms per block for trees up to V=64 on tiny models, i.e. tree
building, masks and KV compaction are vectorised, not per-node Python.

    python benchmarks/overhead.py [--blocks 200] [--threads 1] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from cure_core.config import DecodeConfig
from cure_core.engine import Engine
from cure_core.models import build_pair
from cure_core.tiny import BYTE_VOCAB, MASK_ID, perturbed_copy, tiny_target


class ForwardClock:
    """Accumulates seconds spent inside a module's forward (pre/post hooks)."""

    def __init__(self, *modules):
        self.total = 0.0
        self._start = 0.0
        for m in modules:
            m.register_forward_pre_hook(self._pre)
            m.register_forward_hook(self._post)

    def _pre(self, *_):
        self._start = time.perf_counter()

    def _post(self, *_):
        self.total += time.perf_counter() - self._start


def measure(pair, clock, cfg, prompt, blocks_wanted):
    per_block = []
    done = 0
    while done < blocks_wanted:
        engine = Engine(pair, cfg)
        gen = engine.generate(prompt)
        while True:
            before_model = clock.total
            t0 = time.perf_counter()
            try:
                block = next(gen)
            except StopIteration:
                break
            wall = time.perf_counter() - t0
            model = clock.total - before_model
            if block.index > 0:                      # block 0 includes prefill
                per_block.append({"overhead_ms": (wall - model) * 1e3, "wall_ms": wall * 1e3, "V": block.tree_size})
                done += 1
    return per_block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv-cache", default="static", choices=["static", "dynamic"],
                    help="KV layout (the K/V writes inside the forward count as model time; compaction as overhead)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = tiny_target(seed=0)
    draft = perturbed_copy(target, noise=0.3, seed=1)
    clock = ForwardClock(target, draft)
    pair, _ = build_pair(target, draft, drafter="pard", mask_token_id=MASK_ID, vocab_size=BYTE_VOCAB)
    prompt = list(b"def quicksort(xs):\n    ")
    rows = []
    for strategy, v_max, extra in [("parallel", 15, {}), ("cure", 32, {}), ("cure", 64, {"max_ufps": 3, "tau_margin": 5.0}),
                                   ("ddtree", 32, {}), ("ddtree", 64, {})]:
        cfg = DecodeConfig(strategy=strategy, v_max=v_max, max_new_tokens=64, kv_cache=args.kv_cache, **extra)
        measure(pair, clock, cfg, prompt, 10)        # warm-up
        res = measure(pair, clock, cfg, prompt, args.blocks)
        oh = [r["overhead_ms"] for r in res]
        rows.append({"strategy": strategy, "v_max": v_max, **extra, "blocks": len(res),
                     "mean_V": statistics.mean(r["V"] for r in res), "max_V": max(r["V"] for r in res),
                     "overhead_ms_median": statistics.median(oh),
                     "overhead_ms_p90": sorted(oh)[int(0.9 * len(oh))],
                     "block_ms_median": statistics.median(r["wall_ms"] for r in res)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"kv cache: {args.kv_cache}")
    print(f"{'strategy':10} {'v_max':>5} {'mean V':>7} {'max V':>6} {'overhead ms (median)':>21} {'p90':>7} "
          f"{'block ms (median)':>18}")
    for r in rows:
        print(f"{r['strategy']:10} {r['v_max']:>5} {r['mean_V']:>7.1f} {r['max_V']:>6} "
              f"{r['overhead_ms_median']:>21.2f} {r['overhead_ms_p90']:>7.2f} {r['block_ms_median']:>18.2f}")


if __name__ == "__main__":
    main()
