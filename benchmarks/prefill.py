"""Prefill time with the output head over one row (what CachedLM.prefill runs) against every prompt row
(what it ran before: a [rows, vocab] matmul whose logits nothing reads), in one process, interleaved.

    python benchmarks/prefill.py --target qwen-coder-1.5b --threads 2 --lengths 64,128,256 --reps 5 \
        --json benchmarks/results/prefill_head_cpu/qwen15b.json
    python benchmarks/prefill.py --tiny                          # smoke run (the test does this)

The target loads as `cure generate` loads it (its --dtype auto, packed kernels where they apply). For each prompt
length: a fresh CachedLM prefilled both ways in alternation, --reps times; medians in ms.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import common  # noqa: E402
from cure_core.lm import CachedLM  # noqa: E402
from cure_core.options import EngineArgs  # noqa: E402


def prefill_ms(model, ids: list[int], all_rows: bool) -> float:
    """One prefill of `ids` into a fresh static cache: the head over one row, or (all_rows) over every row."""
    lm = CachedLM(model, kv="static", capacity=len(ids) + 8)
    t0 = time.perf_counter()
    if all_rows:
        fwd = lm.forward(ids, [-1] + list(range(len(ids) - 1)))
        lm.commit(fwd.nodes)
    else:
        lm.prefill(ids)
    return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> dict:
    ap = common.timing_parser(__doc__)
    ap.add_argument("--lengths", default="64,128,256", help="prompt lengths in tokens")
    args = common.check(ap, ap.parse_args(argv))
    common.set_threads(args.threads)
    lengths = [int(s) for s in args.lengths.split(",")]
    if args.tiny:
        from cure_core.tiny import tiny_target
        model, name = tiny_target(seed=0), "tiny"
    else:
        from cure_core.api import open_pair
        loaded = open_pair(EngineArgs(target=args.target, strategy="ar"), strategies=["ar"])
        model, name = loaded.pair.target, loaded.pair.names.get("target")
    gen = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    result = {"schema": "cure.prefill/1", "target": name, "reps": args.reps,
              "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(),
                              "cpu_count": os.cpu_count(), "platform": platform.platform(),
                              "load_average_start": common.load_average()},
              "lengths": {}}
    print(f"{'tokens':>7} {'head over every row, ms':>24} {'over one row, ms':>17} {'saved':>7}")
    for n in lengths:
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        prefill_ms(model, ids, True), prefill_ms(model, ids, False)          # warm-up: this shape once each
        times = {True: [], False: []}
        for _ in range(args.reps):
            for all_rows in (True, False):                                    # alternate: drift hits both
                times[all_rows].append(prefill_ms(model, ids, all_rows))
        every, one = statistics.median(times[True]), statistics.median(times[False])
        result["lengths"][str(n)] = {"every_row_ms": round(every, 3), "one_row_ms": round(one, 3),
                                     "saved": round(1 - one / every, 4)}
        print(f"{n:>7} {every:>24.1f} {one:>17.1f} {1 - one / every:>7.1%}")
    result["environment"]["load_average_end"] = common.load_average()
    return common.write_json(args.json, result, indent=1)


if __name__ == "__main__":
    common.entry(main)
