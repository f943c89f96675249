"""pass@1 on HumanEval 1-40 and 21-40 of `cure bench humaneval` runs, one column per run's target dtype.

    python3 pass_at_1.py RESULTS_JSON [RESULTS_JSON ...]     # each a run's results.json
"""
import json
import sys


def main(paths: list[str]) -> None:
    for path in paths:
        res = json.load(open(path))
        passed = {int(p["task_id"].split("/")[1]): bool(p["passed"]) for p in res["per_prompt"]}
        print(f"{res['device']['dtype']:>9}: HumanEval 1-40 {sum(v for k, v in passed.items() if k < 40)}/"
              f"{sum(1 for k in passed if k < 40)}, 21-40 {sum(v for k, v in passed.items() if 20 <= k < 40)}/"
              f"{sum(1 for k in passed if 20 <= k < 40)}   ({path})")


if __name__ == "__main__":
    main(sys.argv[1:])
