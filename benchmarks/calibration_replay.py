"""What ranking tree nodes by the target's acceptance wins (calibration.py), replayed on recorded blocks.

Blocks recorded by `tree_shapes.py --save-records` hold each block's full proposal and the target's greedy
continuation (the truth every tree is judged against), so any best-first tree can be replayed exactly at any
budget V (rows cut to min(V, K-1), as the engine drafts). Per V this replays, in recording order:

  ddtree       best-first on draft log-probs (weight 1, the reference rule)
  online       best-first cure's rule as the engine runs it: one NodeCalibration per V starts cold, learns
               from each replayed block's own tree (the nodes whose parent the truth reached) and weights the
               next blocks' lower candidates by its fit while that wins (NodeCalibration.uses, measured on the
               tree with the other weight)
  fitted       the weight fitted on other records (`--fit`, e.g. tuning prompts), fixed from the first block

Acceptance only (mean accepted tokens a block, tau - 1): speed comes from benchmarks/peers.py.

    python benchmarks/tree_shapes.py --target qwen-coder-1.5b --sets humaneval,gsm8k@20 --save-records tune.pt ...
    python benchmarks/tree_shapes.py --target qwen-coder-1.5b --sets humaneval@20,gsm8k,... --save-records held.pt ...
    python benchmarks/calibration_replay.py --records held.pt --fit tune.pt --json out.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Sequence


sys.path.insert(0, str(Path(__file__).resolve().parent))
from admission_replay import load_records  # noqa: E402
from tree_shapes import accept  # noqa: E402

from cure_core.files import atomic_write_json  # noqa: E402
from cure_core.calibration import NodeCalibration  # noqa: E402
from cure_core.strategies import Table, best_first, path_nodes  # noqa: E402


def block_tree(r, v: int, weight: float):
    """The best-first tree of budget v over the block's proposal, rows cut as the engine drafts them."""
    rows = min(len(r.proposal.tokens), v)
    width = max(v, 8)
    table = Table(r.proposal.top_ids[:rows, :width].tolist(), r.proposal.top_logprobs[:rows, :width].tolist())
    return best_first(table, v, weight=weight)


def truth_nodes(tree, truth: Sequence[int]) -> set[int]:
    nodes, node = set(), -1
    for tok in truth:
        node = tree._child.get((node, tok))
        if node is None:
            break
        nodes.add(node)
    return nodes


def run(records: list, v: int, weight: float | None, cal: NodeCalibration | None = None) -> list[int]:
    """Accepted tokens per block at budget v: a fixed weight, or (weight None) `cal`'s as the engine runs it:
    the fitted weight where its FlipGains allows it at v, the tree with the other weight measuring what it wins
    on the blocks the engine would measure it (FlipGains.measures)."""
    out = []
    for r in records:
        fitted = cal.weight() if weight is None else weight
        weighs = weight is not None or (fitted != 1.0 and cal.flips.allows(v))
        bf = block_tree(r, v, fitted if weighs else 1.0)
        got = accept(bf.tree, r.truth, r.complete)[0]
        out.append(got)
        if cal is not None:
            on = truth_nodes(bf.tree, r.truth)
            cal.observe(bf.ranks, bf.logq, bf.tree.parents, on)
            if weight is None and fitted != 1.0 and cal.flips.measures(v):
                alt = block_tree(r, v, 1.0 if weighs else fitted).tree
                cal.flips.observe(v, weighs, got, len(path_nodes(alt, r.truth[: got + 1])))
    return out


def fit_weight(records: list, v: int) -> tuple[float, tuple[float, float] | None]:
    """The weight NodeCalibration ends with after learning every block of `records` (its window: the last ones)."""
    cal = NodeCalibration(window=1 << 20)
    run(records, v, None, cal)
    return cal.weight(), cal.gammas


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", required=True, metavar="FILE.pt", help="blocks to replay (tree_shapes --save-records)")
    ap.add_argument("--fit", default=None, metavar="FILE.pt", help="other blocks to fit a fixed weight on")
    ap.add_argument("--budgets", default="3,4,5,6,8")
    ap.add_argument("--json", default=None, metavar="OUT.json")
    args = ap.parse_args(argv)
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        ap.error(f"--budgets {args.budgets!r}: want a comma list of node counts")
    records = load_records(args.records)
    fit_records = load_records(args.fit) if args.fit else None
    sets = sorted({r.set for r in records})
    report = {"records": args.records, "fit": args.fit, "blocks": len(records), "budgets": budgets, "rows": []}
    print(f"{len(records)} blocks; mean accepted tokens a block (tau - 1)")
    for v in budgets:
        cal = NodeCalibration()
        base, online = run(records, v, 1.0), run(records, v, None, cal)
        row = {"v": v, "ddtree": statistics.mean(base), "online": statistics.mean(online),
               "online_weight": cal.weight(), "online_gammas": cal.gammas, "per_set": {}}
        fixed = None
        if fit_records is not None:
            row["fitted_weight"], row["fitted_gammas"] = fit_weight(fit_records, v)
            fixed = run(records, v, row["fitted_weight"])
            row["fitted"] = statistics.mean(fixed)
        for s in sets:
            idx = [i for i, r in enumerate(records) if r.set == s]
            row["per_set"][s] = {"blocks": len(idx), "ddtree": statistics.mean(base[i] for i in idx),
                                 "online": statistics.mean(online[i] for i in idx),
                                 **({"fitted": statistics.mean(fixed[i] for i in idx)} if fixed else {})}
        report["rows"].append(row)
        line = f"V={v}: ddtree {row['ddtree']:.4f}  online {row['online']:.4f} (x{row['online'] / row['ddtree']:.4f}, " \
               f"weight {row['online_weight']:.3f})"
        if fixed:
            line += f"  fitted {row['fitted']:.4f} (x{row['fitted'] / row['ddtree']:.4f}, weight {row['fitted_weight']:.3f})"
        print(line)
        for s, d in row["per_set"].items():
            print(f"    {s:24s} ddtree {d['ddtree']:.4f}  online {d['online']:.4f}"
                  + (f"  fitted {d['fitted']:.4f}" if "fitted" in d else ""))
    if args.json:
        atomic_write_json(args.json, report, indent=1)
    return report


if __name__ == "__main__":
    main()
