"""pass@1 and greedy agreement of two `cure bench humaneval` runs in two dtypes (bfloat16 against float32).

    python3 compare_dtypes.py RUN_DIR_A RUN_DIR_B   # each written by `cure bench ... -o DIR`
Prints pass@1 on HumanEval 1-40 and 21-40, how many completions are identical, and the share of the first
256 positions where the two greedy outputs agree up to their first difference."""
import json
import sys
from pathlib import Path


def load(run: Path) -> dict:
    res = json.loads((run / "results.json").read_text())
    pairs = [json.loads(x) for x in (run / "progress.jsonl").read_text().splitlines()[1:]]
    tokens = {p["task_id"]: p["token_ids"] for p in pairs if p.get("type") == "pair"}
    passed = {p["task_id"]: p["passed"] for p in res["per_prompt"]}
    return {"dtype": res["device"]["dtype"], "tokens": tokens, "passed": passed}


def number(task_id: str) -> int:
    return int(task_id.split("/")[1])


def main(a: str, b: str) -> dict:
    x, y = load(Path(a)), load(Path(b))
    ids = sorted(set(x["passed"]) & set(y["passed"]), key=number)
    out = {}
    for name, lo in (("humaneval_1_40", 0), ("humaneval_21_40", 20)):
        sel = [t for t in ids if number(t) >= lo]
        out[name] = {x["dtype"]: sum(x["passed"][t] for t in sel), y["dtype"]: sum(y["passed"][t] for t in sel),
                     "problems": len(sel)}
    same = [t for t in ids if x["tokens"][t] == y["tokens"][t]]
    prefix = []
    for t in ids:
        p, q = x["tokens"][t], y["tokens"][t]
        n = next((i for i, (u, v) in enumerate(zip(p, q)) if u != v), min(len(p), len(q)))
        prefix.append(n / max(len(p), len(q)))
    out["identical_completions"] = f"{len(same)}/{len(ids)}"
    out["mean_common_prefix_share"] = round(sum(prefix) / len(prefix), 3)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(*sys.argv[1:3])
