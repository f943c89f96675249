"""Greedy agreement with float32 `ar` of the other rows of a llama.cpp run (llamacpp.py --json): per row, how
many of the prompts' outputs are identical to float32's, and the mean share of float32's tokens matched before
the first difference.

    python3 agreement.py llamacpp18_qwen05b_auto.json [REFERENCE_METHOD]
"""
import json
import sys
from collections import defaultdict


def main(path: str, ref: str = "cure_ar:dtype=float32") -> None:
    rows = json.load(open(path))["results"]
    by = defaultdict(dict)
    for x in rows:
        by[x["method"]][x["prompt_index"]] = x["tokens"]
    base = by[ref]
    for method, outs in by.items():
        if method == ref:
            continue
        same = sum(outs[i] == base[i] for i in base)
        shares = []
        for i, b in base.items():
            o = outs[i]
            n = next((k for k, (u, v) in enumerate(zip(o, b)) if u != v), min(len(o), len(b)))
            shares.append(n / max(len(b), 1))
        print(f"{method:26} identical {same}/{len(base)}   prefix matched {sum(shares) / len(shares):.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
