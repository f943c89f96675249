"""Greedy agreement with float32 `ar` of the other rows of a llama.cpp run (llamacpp.py --json, with its
per-prompt `results`): per row, how many of the prompts' outputs are identical to float32's, and the mean share
of float32's tokens matched before the first difference.

    python3 agreement.py RUN.json [RUN.json ...] > agreement.json     # the full files run.sh writes
"""
import json
import sys
from collections import defaultdict

from cure_core.metrics import common_prefix

REFERENCE = "cure_ar:dtype=float32"


def agreement(path: str) -> dict:
    by = defaultdict(dict)
    for x in json.load(open(path))["results"]:
        by[x["method"]][x["prompt_index"]] = x["tokens"]
    base = by[REFERENCE]
    return {method: {"identical": f"{sum(outs[i] == b for i, b in base.items())}/{len(base)}",
                     "prefix_share": round(sum(common_prefix(outs[i], b) / max(len(b), 1)
                                               for i, b in base.items()) / len(base), 3)}
            for method, outs in by.items() if method != REFERENCE}


if __name__ == "__main__":
    print(json.dumps({"reference": REFERENCE, "runs": {p.rsplit("/", 1)[-1]: agreement(p) for p in sys.argv[1:]}},
                     indent=1))
