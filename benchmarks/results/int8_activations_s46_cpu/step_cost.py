"""What the second activation level costs: one forward of an int8 target (CachedLM, through Int8Decoder, as the
engine runs it) of N tree rows after a 300-token context, with each activation row in one int8 level (the rule
up to session 45) and in two (cpu_kernels.row_int8_matmul), in alternation; medians in ms.

    python3 benchmarks/results/int8_activations_s46_cpu/step_cost.py [--target qwen-coder-0.5b] [--rounds 15]
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

from cure_core import cpu_kernels, int8_decoder, load  # noqa: E402
from cure_core.lm import CachedLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quality import TWO_LEVELS, one_level  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from common import load_average  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen-coder-0.5b")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    m = load(target=args.target, strategy="ar", dtype="int8", draft="")
    lm = CachedLM(m.engine.pair.target)
    g = torch.Generator().manual_seed(0)
    context = torch.randint(100, 20000, (300,), generator=g).tolist()
    lm.reset(capacity=400)
    lm.prefill(context)
    rules = {"one level": one_level, "two levels": TWO_LEVELS}
    times = {(r, n): [] for r in rules for n in map(int, args.rows.split(","))}
    load0 = load_average()
    for i in range(args.rounds + 1):                       # round 0 warms up
        for (rule, n) in times:
            cpu_kernels.row_int8_matmul = int8_decoder.row_int8_matmul = rules[rule]
            tokens = torch.randint(100, 20000, (n,), generator=g).tolist()
            parents = [-1] + list(range(n - 1))              # a chain of n rows
            t0 = time.perf_counter()
            lm.forward(tokens, parents)
            dt = (time.perf_counter() - t0) * 1e3
            lm.rollback()
            if i:
                times[(rule, n)].append(dt)
    cpu_kernels.row_int8_matmul = int8_decoder.row_int8_matmul = TWO_LEVELS
    out = {"target": args.target, "threads": args.threads, "load": [load0, load_average()], "context": 300,
           "median_ms": {f"{r} @{n}": round(statistics.median(v), 2) for (r, n), v in times.items()}}
    for n in map(int, args.rows.split(",")):
        out["median_ms"][f"two/one @{n}"] = round(statistics.median(times[("two levels", n)])
                                                 / statistics.median(times[("one level", n)]), 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
