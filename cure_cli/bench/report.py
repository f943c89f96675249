"""Benchmark output: results.json, samples.jsonl and the rich tables printed at the end."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from cure_core.files import atomic_write_text

from .runner import PairResult, RunSpec

RESULTS_SCHEMA = 1
RESULTS_FILE = "results.json"
SAMPLES_FILE = "samples.jsonl"
TRACE_FILE = "trace.jsonl"


def per_prompt_rows(pairs: Sequence[PairResult]) -> list[dict]:
    rows = []
    for p in sorted(pairs, key=lambda x: (x.prompt_index, x.run)):
        new = len(p.token_ids)
        decode = sum(b.timings.total_ms for b in p.blocks)
        rows.append({"prompt_index": p.prompt_index, "task_id": p.task_id, "run": p.run, "new_tokens": new,
                     "blocks": len(p.blocks), "tau": new / len(p.blocks) if p.blocks else 0.0,
                     "tpot_ms": decode / new if new else 0.0,
                     "prefill_ms": sum(b.timings.prefill_ms for b in p.blocks),
                     "stop": p.blocks[-1].stop if p.blocks else None,
                     "passed": p.score.get("passed") if p.score else None})
    return rows


def build_results(*, status: str, dataset: str, data_path: str | None, limit: int | None, prompts: int,
                  models: dict, versions: dict, device: dict, base_config: dict, runs: Sequence[RunSpec],
                  order: str, warmup: int, chat: bool, computed: dict, scoring: dict, skipped: list[dict],
                  pairs: Sequence[PairResult], output_dir: Path, skipped_prompts: Sequence[str] = ()) -> dict:
    return {
        "schema": RESULTS_SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": status,                                # complete | interrupted
        "output_dir": str(output_dir),
        "dataset": dataset, "data_path": data_path, "limit": limit, "prompts": prompts, "chat": chat,
        "models": models, "versions": versions,
        "device": {**device, "ar_dtype": ar_dtype(device)},   # what every speedup divides by: ar in this dtype
        "config": base_config,                           # shared engine settings (temperature, seed, k, ...)
        "runs": {r.name: r.config.to_dict() for r in runs},
        "order": order, "warmup": warmup,
        "skipped": skipped,                              # [{"strategy", "reason"}]: runs that could not run
        "skipped_prompts": list(skipped_prompts),        # task ids longer than the target's context
        "finished_pairs": len(pairs),
        **computed,                                      # compared_prompts, metrics, lossless, ablation
        "scoring": scoring,                              # {"metric", "note", "runs": {run: {...}|None}}
        "per_prompt": per_prompt_rows(pairs),
    }


def summary(results: dict) -> dict:
    """What --json prints: results.json without the per-prompt rows."""
    return {k: v for k, v in results.items() if k != "per_prompt"}


def write_outputs(out_dir: Path, results: dict, pairs: Sequence[PairResult]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    lines = [json.dumps({"task_id": p.task_id, "completion": p.completion, "strategy": p.run})
             for p in sorted(pairs, key=lambda x: (x.prompt_index, x.run))]
    atomic_write_text(out_dir / SAMPLES_FILE, "".join(line + "\n" for line in lines))


# ---------------------------------------------------------------- tables

def _f(x, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _table(title: str, *cols: tuple[str, str]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
              title_style="bold")
    for name, just in cols:
        t.add_column(name, justify=just, no_wrap=(name == "run"))
    return t


def ar_dtype(device: dict) -> str:
    """The dtype of the ar run speedups divide by: the target's (every run shares the target object)."""
    return device.get("ar_dtype") or device.get("dtype") or "?"


def _x_ar(results: dict, prefix: str = "") -> str:
    """A speedup column's name, naming the ar it divides by: 'x ar (float32)'."""
    return f"{prefix}x ar ({ar_dtype(results['device'])})"


def _draft_dtype_note(device: dict) -> str:
    """', drafter bfloat16' when the drafters ran in another dtype than the target."""
    dd = device.get("draft_dtype")
    return f", drafter {dd}" if dd and dd != device.get("dtype") else ""


def print_tables(console: Console, results: dict) -> None:
    metrics: dict = results["metrics"]
    names = list(metrics)
    n = results["compared_prompts"]
    with_sd = "sd" in metrics
    title = (f"cure bench {results['dataset']}: {n} prompt(s), temperature {results['config']['temperature']}, "
             f"seed {results['config']['seed']}, K={results['config']['k']}, {results['device']['device']} "
             f"{results['device']['dtype']}" + _draft_dtype_note(results['device']))
    cols = [("run", "left"), ("tau", "right"), ("TPOT ms", "right"), ("tok/s", "right"), (_x_ar(results), "right")]
    cols += [("x sd", "right")] if with_sd else []
    cols += [("match vs ar", "right")]
    t = _table(title, *cols)
    for name in names:
        m = metrics[name]
        match = m["match_vs_ar"]
        match_s = "-" if match is None else ("100%" if match == 1.0 else f"[bold red]{match:.1%}[/]")
        row = [name, f"{m['tau']:.2f}", f"{m['tpot_ms']:.1f}", f"{m['tokens_per_s']:.1f}",
               _f(m["speedup_vs_ar"], "{:.2f}x")]
        row += [_f(m["speedup_vs_sd"], "{:.2f}x")] if with_sd else []
        row += [match_s]
        t.add_row(*row)
    vllm = (results.get("engines") or {}).get("vllm") or {}
    for name, m in (vllm.get("runs") or {}).items():
        match = m["match_vs_ar"]
        match_s = "-" if match is None else ("100%" if match == 1.0 else f"[bold red]{match:.1%}[/]")
        row = [f"{name} [CPU]", f"{m['tau']:.2f}", _f(m["tpot_ms"], "{:.1f}"), f"{m['tokens_per_s']:.1f}",
               _f(m["speedup_vs_ar"], "{:.2f}x")]
        row += ["-"] if with_sd else []
        t.add_row(*row, match_s)
    console.print(t)
    if vllm.get("runs"):
        console.print(f"[dim]vllm-* rows: {vllm['label']}; same prompts, max new tokens, K={vllm['k']}, stop ids "
                      f"and dtype ({vllm['dtype']}); tau = {vllm['definitions']['tau']}; TPOT = "
                      f"{vllm['definitions']['tpot_ms']}[/]", highlight=False)
        for note in vllm.get("export_notes") or []:
            console.print(f"[dim]vLLM drafter export: {note}[/]", highlight=False)
    if vllm.get("error"):
        console.print(f"[bold red]vLLM run failed:[/] {vllm['error']}", highlight=False)

    t = _table("trees", ("run", "left"), ("repair win", "right"), ("extra tokens", "right"),
               ("blocks with UFP", "right"), ("tree mean", "right"), ("tree max", "right"))
    for name in names:
        m = metrics[name]
        t.add_row(name, f"{m['repair_win_rate']:.1%}", str(m["extra_tokens"]), str(m["blocks_with_ufp"]),
                  f"{m['mean_tree_size']:.1f}", str(m["max_tree_size"]))
    console.print(t)

    t = _table("time split (share of decode time; prefill excluded) and the ceiling: tau x ar TPOT / verify ms "
               "per block", ("run", "left"), ("ms/block", "right"),
               ("draft", "right"), ("tree", "right"), ("verify", "right"), ("commit", "right"), ("learn", "right"),
               (_x_ar(results, "ceiling "), "right"), ("of ceiling", "right"))
    for name in names:
        m = metrics[name]
        sp = m["time_split"]
        t.add_row(name, f"{m['ms_per_block']:.1f}", *(f"{sp.get(k, 0.0):.0%}" for k in ("draft", "tree", "verify", "commit", "learn")),
                  _f(m.get("ceiling_speedup_vs_ar"), "{:.2f}x"), _f(m.get("share_of_ceiling"), "{:.0%}"))
    console.print(t)

    budgets = {k: v["budget"] for k, v in metrics.items() if v.get("budget")}
    if budgets:
        t = _table("cost-aware budget (--v-max auto): chosen V and predicted vs measured speedup",
                   ("run", "left"), ("mean V", "right"), ("V range", "right"),
                   (_x_ar(results, "predicted "), "right"), (_x_ar(results, "measured "), "right"))
        for name, b in budgets.items():
            t.add_row(name, f"{b['mean_v_max']:.1f}", f"{b['min_v_max']}-{b['max_v_max']}",
                      _f(b["predicted_speedup_vs_ar"], "{:.2f}x"), _f(metrics[name]["speedup_vs_ar"], "{:.2f}x"))
        console.print(t)

    accept = {k: v["per_position_acceptance"] for k, v in metrics.items() if v["per_position_acceptance"]}
    if accept:
        depth = max(len(v) for v in accept.values())
        name_w = max(len(k) for k in accept)
        shown = max(1, min(depth, (console.width - name_w - 1) // 5))
        rest = f"d{depth}" if shown + 1 == depth else f"d{shown + 1}-d{depth}"
        more = f"; {rest} in results.json" if shown < depth else ""
        t = _table(f"per-position acceptance, % (winning path reached depth d{more})", ("run", "left"),
                   *((f"d{d}", "right") for d in range(1, shown + 1)))
        for name, rates in accept.items():
            t.add_row(name, *(f"{100 * r:.0f}" for r in rates[:shown]))
        console.print(t)

    if results.get("ablation"):
        c = metrics["cure"]
        t = _table("ablation vs full CURE (paper Table 4; TPOT ratio = run TPOT / cure TPOT)",
                   *((col, "left" if col == "run" else "right") for col in
                     ("run", "tau", "d tau", _x_ar(results), _x_ar(results, "d "), "TPOT ms", "TPOT ratio")))
        t.add_row("cure", f"{c['tau']:.2f}", "", _f(c["speedup_vs_ar"], "{:.2f}x"), "", f"{c['tpot_ms']:.1f}", "1.00")
        for name, a in results["ablation"].items():
            t.add_row(name, f"{a['tau']:.2f}", _f(a["delta_tau_pct"], "{:+.1f}%"), _f(a["speedup_vs_ar"], "{:.2f}x"),
                      _f(a["delta_speedup_pct"], "{:+.1f}%"), f"{a['tpot_ms']:.1f}", _f(a["tpot_ratio_vs_cure"]))
        console.print(t)

    scoring = results["scoring"]
    if any(scoring["runs"].values()):
        t = _table(f"task correctness ({scoring['metric']}, paper Table 3)", ("run", "left"), ("passed", "right"),
                   ("rate", "right"))
        for name, s in scoring["runs"].items():
            t.add_row(name, "-" if not s else f"{s['passed']}/{s['scored']}", "-" if not s else f"{s['rate']:.1%}")
        console.print(t)
    if scoring.get("note"):
        console.print(f"[yellow]note:[/] {scoring['note']}", highlight=False)

    print_lossless(console, results)
    for s in results.get("skipped", []):
        console.print(f"[yellow]skipped {s['strategy']}:[/] {s['reason']}", highlight=False)
    if results["status"] != "complete":
        console.print(f"[yellow]run {results['status']}: {results['finished_pairs']} finished pair(s) kept; "
                      f"continue with --resume --output-dir {results['output_dir']}[/]", highlight=False)


def print_lossless(console: Console, results: dict) -> None:
    vllm = ((results.get("engines") or {}).get("vllm") or {}).get("runs") or {}
    for name, m in vllm.items():
        if m["match_vs_ar"] is not None and m["mismatches"]:
            first = m["mismatches"][0]
            console.print(f"[bold red]MISMATCH: {name} differs from our ar on {len(m['mismatches'])}/{m['prompts']} "
                          f"prompt(s) (first: {first['task_id']} at token {first['first_diff']})[/]", highlight=False)
        elif m["match_vs_ar"] is not None:
            console.print(f"[green]{name}: token-for-token identical to our ar on all {m['prompts']} prompt(s)[/]",
                          highlight=False)
    lossless = results.get("lossless") or {}
    if not lossless:
        if "ar" not in results["metrics"]:
            console.print("[yellow]note:[/] 'ar' did not run: token-level match against ar not checked",
                          highlight=False)
        return
    bad = {k: v for k, v in lossless.items() if v["identical"] < v["prompts"]}
    if not bad:
        console.print(f"[green]lossless: every run is token-for-token identical to ar on all "
                      f"{results['compared_prompts']} prompt(s)[/]", highlight=False)
        return
    sampled = results["config"]["temperature"] > 0
    for name, v in bad.items():
        first = v["mismatches"][0]
        msg = (f"{name} differs from ar on {v['prompts'] - v['identical']}/{v['prompts']} prompt(s), token match "
               f"{v['match_rate']:.1%} (first: {first['task_id']} at token {first['first_diff']})")
        if sampled:
            console.print(f"[yellow]note:[/] {msg}; expected at temperature > 0 (lossless in distribution, not "
                          f"token for token)", highlight=False)
        else:
            device = results["device"]
            exact = device.get("rows_exact", device.get("dtype") in ("float32", "fp32", "int8"))
            hint = "" if exact else (f"; the {device.get('dtype')} target's rows depend on their pass here, which "
                                     "can flip near-tied argmaxes")
            console.print(f"[bold red]MISMATCH: {msg}{hint}[/]", highlight=False)
