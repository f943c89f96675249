"""`cure analyze TRACE.jsonl [...]`: can repair utility be predicted before verification? (paper Table 5)"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cure_core.analysis import BUDGETS, analyze as run_analysis
from cure_core.trace import read_trace

from .common import friendly_errors


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def print_report(console: Console, res: dict, paths: list[Path]) -> None:
    console.print(
        f"[bold]repair-utility ranking[/] over {', '.join(map(str, paths))}\n"
        f"{res['blocks']} cure blocks with a repair tree from {res['generations']} generation(s) "
        f"({res['no_repair_blocks']} cure blocks without a repair left out); "
        f"{res['useful']} useful (delta_a > 0, base rate {res['base_rate']:.1%}), {res['extra_tokens']} extra tokens; "
        f"scorer {res['model']}, {res['folds']}-fold split by generation, seed {res['seed']}", highlight=False)
    t = Table(title="admitted-block budget r (paper Table 5): held-out blocks ranked before verification",
              title_justify="left")
    for col in ("r", "ranking", "admitted", "precision", "recall", "extra-token recall"):
        t.add_column(col, justify="left" if col == "ranking" else "right")
    labels = (("scorer", f"scorer ({res['model']})"), ("margin", "margin-only"), ("chance", "chance"))
    for i, row in enumerate(res["budgets"]):
        for j, (key, label) in enumerate(labels):
            m = row[key]
            t.add_row(f"{row['r']:.2f}" if j == 0 else "", label, str(m["admitted"]), _pct(m["precision"]),
                      _pct(m["recall"]), _pct(m["extra_token_recall"]),
                      end_section=(j == len(labels) - 1 and i < len(res["budgets"]) - 1))
    console.print(t)
    a = res["auc"]
    console.print(f"ROC AUC (useful vs not): scorer {a['scorer']:.3f}, margin-only {a['margin']:.3f}"
                  if a["scorer"] is not None else "ROC AUC: n/a", highlight=False)
    if res["feature_weights"]:
        top = ", ".join(f"{w['feature']} {w['weight']:+.2f}" for w in res["feature_weights"][:5])
        console.print(f"[dim]largest standardised logistic weights (all blocks, descriptive): {top}[/]",
                      highlight=False)
    if res["skipped_ablation_generations"]:
        console.print(f"[dim]{res['skipped_ablation_generations']} ablation generation(s) (no branch 0 / no resync) "
                      f"left out[/]", highlight=False)


@friendly_errors
def analyze(
    traces: Annotated[list[Path], typer.Argument(help="Trace files (or run folders holding trace.jsonl) from `cure bench` or `cure generate --trace`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed for the generation split and tie-breaking.")] = 0,
    model: Annotated[str, typer.Option("--model", help="Scorer: logreg (logistic regression) or hgb (gradient boosting).")] = "logreg",
    folds: Annotated[int, typer.Option("--folds", help="Cross-validation folds (split by generation).", min=2)] = 5,
) -> None:
    """Rank CURE blocks by predicted repair utility; report precision / recall / extra-token recall."""
    gens = []
    for i, path in enumerate(traces):
        trace = read_trace(path)
        for g in trace.generations:
            gens.append((f"{i}:{g.id}", g.config, g.blocks))
    res = run_analysis(gens, seed=seed, model=model, n_folds=folds, budgets=BUDGETS)
    res["traces"] = [str(p) for p in traces]
    if as_json:
        print(json.dumps(res))
        return
    print_report(Console(), res, traces)
