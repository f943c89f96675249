"""Greedy agreement with float32 `ar` across runs (llamacpp.py --json, full files with `results`): the first file
holds the float32 row (cure_ar:dtype=float32; float32 is bitwise the same in every process), and every row of
every file is compared with it: how many prompts' outputs are identical, and the mean share of float32's tokens
matched before the first difference.

    python3 agreement.py REF_RUN.json [RUN.json ...] > agreement.json
"""
import json
import sys
from collections import defaultdict

from cure_core.metrics import common_prefix

REFERENCE = "cure_ar:dtype=float32"


def rows(path: str) -> dict:
    by = defaultdict(dict)
    for x in json.load(open(path))["results"]:
        by[x["method"]][x["prompt_index"]] = x["tokens"]
    return by


if __name__ == "__main__":
    base = rows(sys.argv[1])[REFERENCE]
    out = {}
    for path in sys.argv[1:]:
        out[path.rsplit("/", 1)[-1]] = {
            method: {"identical": f"{sum(outs[i] == b for i, b in base.items())}/{len(base)}",
                     "prefix_share": round(sum(common_prefix(outs[i], b) / max(len(b), 1)
                                               for i, b in base.items()) / len(base), 3)}
            for method, outs in rows(path).items() if method != REFERENCE}
    print(json.dumps({"reference": f"{REFERENCE} of {sys.argv[1].rsplit('/', 1)[-1]}", "runs": out}, indent=1))
