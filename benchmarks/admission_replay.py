"""Nodes past the budget, replayed: what best-first trees of fixed budgets and the admission rule would have
earned on recorded blocks, priced with the machine's cached verification cost curve.

The admission rule (`BudgetTuner.admission`): past budget V the (n+1)-th node of the best-first heap joins while
p^gamma >= rate x (C_v(n+1) - C_v(n)), p its joint draft probability. Here `rate` is the best fixed budget's
modelled rate on the same blocks and gamma the maximum-likelihood fit over the blocks' branch-0 chains (as
`BudgetTuner.calibration` fits it online), or the values given. Each block's tree is `strategies.best_first` over
its recorded proposal (ddtree's tree; cure's re-draft pass is left out), cut to `--depth` rows (the drafted
block: the budget's rows where the engine drafts only those, K-1 where it drafts the whole block), and judged
against the lossless output (strategies.path_nodes: the truth's nodes the tree holds). Modelled time per block:
`--draft-ms` + C_v(tree size).

    python benchmarks/tree_shapes.py --target qwen-coder-1.5b --k 8 --sets humaneval,gsm8k@20 --limit 20 \\
        --max-new-tokens 48 --budgets 4,16 --redrafts 2 --threads 2 --save-records records.pt
    python benchmarks/admission_replay.py records.pt --curve qwen-coder-1.5b --draft-ms 53 --budget 4
    python benchmarks/admission_replay.py records.pt --tiny     # records of `tree_shapes.py --tiny`
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import pickle
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tree_shapes  # noqa: E402  (the records' own module: torch.load unpickles its Recorded)

from cure_core.files import atomic_write_json  # noqa: E402
from cure_core.budget import CostCurve, fit_calibration  # noqa: E402
from cure_core.strategies import Table, best_first, path_nodes  # noqa: E402

FIXED = (1, 2, 3, 4, 5, 6, 8, 12, 16)


class _Records(pickle.Unpickler):
    """tree_shapes' Recorded, whichever module name it was pickled under (`__main__` when run as a script)."""

    def find_class(self, module, name):
        return tree_shapes.Recorded if name == "Recorded" else super().find_class(module, name)


class _PickleModule:
    Unpickler = _Records
    load = staticmethod(pickle.load)


def load_records(path: str) -> list:
    try:
        return torch.load(path, weights_only=False, pickle_module=_PickleModule)["records"]
    except (OSError, RuntimeError, KeyError, pickle.UnpicklingError) as e:
        raise SystemExit(f"cannot read records from {path}: {e}")


def cached_curve(target: str) -> CostCurve:
    """The cost curve `cure` measured for `target` on this machine (the disk cache), the first key naming it."""
    from cure_core.embedded import cache_root
    path = cache_root() / "cost_curves.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    for key, curve in data.items():
        if target in key:
            return CostCurve(tuple(curve["sizes"]), tuple(curve["verify_ms"]), key)
    raise SystemExit(f"no cached cost curve names {target!r} in {path}; run `cure generate --target {target}` once")


def fit_gamma(records) -> float:
    """gamma over the blocks' branch-0 chains (budget.fit_calibration, what BudgetTuner.calibration fits online):
    depth d counts as accepted iff the top-1 chain matches the truth through d."""
    chains = []
    for r in records:
        lps = list(itertools.accumulate(r.proposal.top_logprobs[:, 0].tolist()))
        a = next((d for d, (t, u) in enumerate(zip(r.proposal.tokens, r.truth)) if t != u), min(len(lps), len(r.truth)))
        chains.append((lps, a))
    return fit_calibration(chains)


def heap_order(records, depth: int, cap: int) -> list[tuple[list[float], set[int]]]:
    """Per block: the best-first scores of its first `cap` nodes (pop order) and the nodes on the truth path."""
    out = []
    for r in records:
        t = Table.of(r.proposal)
        bf = best_first(Table(t.ids[:depth], t.logp[:depth]), cap)
        out.append((bf.scores, set(path_nodes(bf.tree, r.truth))))
    return out


def modelled(blocks, size, curve: CostCurve, draft_ms: float) -> tuple[float, float, float]:
    """(tokens per second, accepted tokens a block, mean tree size) with `size(scores)` nodes a block."""
    tokens = ms = nodes = 0.0
    for scores, path in blocks:
        n = size(scores)
        tokens += 1 + sum(1 for i in range(n) if i in path)
        ms += draft_ms + curve.verify(n)
        nodes += n
    return tokens / ms * 1e3, tokens / len(blocks) - 1, nodes / len(blocks)


def admitted(scores, budget: int, cap: int, bar: list[float]) -> int:
    n = min(budget, len(scores))
    while n < min(cap, len(scores)) and scores[n] >= bar[n]:
        n += 1
    return n


def replay(records, curve: CostCurve, draft_ms: float, budget: int, depth: int, cap: int,
           gamma: float | None = None) -> dict:
    gamma = gamma if gamma is not None else fit_gamma(records)
    blocks = heap_order(records, depth, cap)
    fixed = {v: modelled(blocks, lambda s, v=v: min(v, len(s)), curve, draft_ms) for v in FIXED if v <= cap}
    best_v = max(fixed, key=lambda v: fixed[v][0])
    rate = fixed[best_v][0] / 1e3                                    # tokens per ms
    bar = [-math.inf] * budget + [
        -math.inf if (price := rate * (curve.verify(n + 1) - curve.verify(n))) <= 0 else math.log(price) / gamma
        for n in range(budget, cap)]
    rule = modelled(blocks, lambda s: admitted(s, budget, cap, bar), curve, draft_ms)
    return {"blocks": len(records), "gamma": gamma, "budget": budget, "depth": depth, "cap": cap,
            "fixed": {v: {"tok_s": r, "accepted": a} for v, (r, a, _) in fixed.items()}, "best_fixed": best_v,
            "admission": {"tok_s": rule[0], "accepted": rule[1], "tree": rule[2]},
            "vs_best_fixed": rule[0] / fixed[best_v][0]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", help="blocks saved by tree_shapes.py --save-records")
    ap.add_argument("--curve", default="qwen-coder-0.5b", help="the model alias whose cached cost curve prices the trees")
    ap.add_argument("--tiny", action="store_true", help="price with a synthetic curve (tiny-model records)")
    ap.add_argument("--draft-ms", type=float, default=50.0, help="drafter ms a block")
    ap.add_argument("--budget", type=int, default=4, help="the tuner's budget the rule admits past")
    ap.add_argument("--depths", default="", help="comma list of drafted rows to compare (default: the budget, K-1)")
    ap.add_argument("--cap", type=int, default=16, help="nodes at most (the engine: the warm-up budget)")
    ap.add_argument("--gamma", type=float, default=None, help="calibration (default: fitted on the records)")
    ap.add_argument("--json", default=None, metavar="OUT.json")
    args = ap.parse_args(argv)
    records = load_records(args.records)
    if not records:
        raise SystemExit("no blocks in the records")
    curve = CostCurve((0, 4, 8, 64), (100.0, 104.0, 144.0, 704.0)) if args.tiny else cached_curve(args.curve)
    full = max(len(r.proposal.tokens) for r in records)
    depths = [int(d) for d in args.depths.split(",")] if args.depths else sorted({min(args.budget, full), full})
    sets = sorted({r.set for r in records})
    out = {"curve": curve.key or "synthetic", "draft_ms": args.draft_ms, "runs": []}
    for name in sets + (["all"] if len(sets) > 1 else []):
        part = [r for r in records if name == "all" or r.set == name]
        for depth in depths:
            rep = {"set": name, **replay(part, curve, args.draft_ms, args.budget, depth, args.cap, args.gamma)}
            out["runs"].append(rep)
            best = rep["fixed"][rep["best_fixed"]]
            print(f"{name:>12} depth {depth}: best fixed V={rep['best_fixed']} {best['tok_s']:.3f} tok/s; admission "
                  f"past {args.budget} (gamma {rep['gamma']:.2f}) {rep['admission']['tok_s']:.3f} tok/s, tree "
                  f"{rep['admission']['tree']:.2f}: x{rep['vs_best_fixed']:.4f}")
    if args.json:
        atomic_write_json(args.json, out, indent=2)
        print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
