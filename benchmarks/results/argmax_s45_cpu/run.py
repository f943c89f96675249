"""torch.argmax against max(-1).indices on a CPU, over a verify's logits (rows x Qwen2.5's 151936 ids).

    python3 benchmarks/results/argmax_s45_cpu/run.py --threads 2 --json benchmarks/results/argmax_s45_cpu/argmax.json

Both give the first maximal index (checked here on logits rounded to make ties common); the engine reads the
target's argmax through cure_core.tree.argmax, which is max(-1).indices.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch


def ms(f, reps: int) -> float:
    f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = {}
    for dtype in (torch.bfloat16, torch.float32):
        for n in (1, 8, 16, 32):
            x = (torch.randn(n, 151936, generator=gen) * 4).to(dtype)
            ties = x.round()                                  # many equal maxima: the first index must win
            assert torch.equal(ties.argmax(-1), ties.max(-1).indices)
            rows[f"{str(dtype).split('.')[1]} x{n}"] = {
                "argmax_ms": round(ms(lambda: x.argmax(-1), args.reps), 3),
                "max_indices_ms": round(ms(lambda: x.max(-1).indices, args.reps), 3)}
    for k, v in rows.items():
        print(f"{k:>16}  argmax {v['argmax_ms']:7.3f} ms   max(-1).indices {v['max_indices_ms']:7.3f} ms")
    out = {"torch": torch.__version__, "threads": args.threads, "platform": platform.platform(),
           "load_average": os.getloadavg(), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
