"""`cure bench DATASET`: AR vs naive SD vs parallel vs CURE vs DDTree on the same prompts, one run.

Four steps, one function each:
    plan    the prompts (cure_tasks), the runs (a DecodeConfig per strategy and ablation)
    load    the models, once (cure_core.api.open_pair: the same opener as generate and chat)
    run     warm-up, then every (prompt, run) pair interleaved prompt by prompt, so machine drift hits
            every run alike (in a balanced order: each run in each position and after each other alike); finished pairs go to progress.jsonl (--resume) and the trace
    report  metrics, scores, results.json / samples.jsonl, plots, the tables
See cure_cli/bench/ for the pieces.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from cure_core.cpu_kernels import cpu_info, rows_exact, run_dtype
from cure_core.metrics import ORDERS
from cure_core.options import EngineArgs

from .bench import report, stats
from .bench.runner import (BenchPrompt, PairResult, ProgressLog, RunSpec, build_runs, interleave, parse_list,
                           run_interleaved, warm_up)
from .bench.scoring import REFUSAL, Scorer, needs_exec, summarize_scores
from .common import LoggedProgress, err_console, fail, friendly_errors, phase_lines, quiet_transformers, sigterm_as_interrupt
from .options import engine_options, with_flags

if TYPE_CHECKING:
    from cure_core.models import LoadedPair

WARMUP_TOKENS = 32                              # tokens per warm-up generation


class _BenchProgress(LoggedProgress):
    """A progress bar with one extra line: running tau and tok/s per run."""

    stats_line: Text = Text("")

    def get_renderables(self):
        yield Group(self.make_tasks_table(self.tasks), self.stats_line)

    def log_extra(self) -> str:
        return self.stats_line.plain


class _Running:
    """Running tau / tok/s per run for the progress line."""

    def __init__(self, names):
        self.acc = {n: [0, 0, 0.0] for n in names}      # emitted, blocks, decode ms

    def add(self, pair: PairResult) -> None:
        a = self.acc[pair.run]
        a[0] += len(pair.token_ids)
        a[1] += len(pair.blocks)
        a[2] += sum(b.timings.total_ms for b in pair.blocks)

    def line(self) -> Text:
        parts = []
        for n, (tok, blocks, ms) in self.acc.items():
            if blocks:
                parts.append(f"{n} tau {tok / blocks:.2f} {1e3 * tok / ms if ms else 0:.1f} tok/s")
        return Text(" | ".join(parts), style="dim")


def _device_info(args: EngineArgs, pair: LoadedPair) -> dict:
    """What ran: the target's dtype, whether its rows are exact (cpu_kernels.rows_exact), the drafters' dtype
    (`--draft-dtype` auto resolved by load_pair) ..."""
    import torch
    info = {"device": args.device, "dtype": args.target_dtype(), "rows_exact": rows_exact(pair.pair.target),
            "draft_dtype": pair.draft_dtype,
            "device_map": args.device_map,
            "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "processor": platform.processor(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None, **cpu_info()}
    if args.device.startswith("cuda") and torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(torch.device(args.device))
    return info


def _latest_run_dir() -> Path:
    base = Path("runs")
    dirs = sorted((d for d in base.glob("*") if (d / "progress.jsonl").exists()), key=lambda d: d.stat().st_mtime)
    if not dirs:
        fail("--resume needs --output-dir DIR (no earlier run found under runs/)")
    return dirs[-1]


# ---------------------------------------------------------------- 1. plan

@dataclass
class Plan:
    dataset: str
    data: Path | None
    limit: int | None
    problems: list                  # cure_tasks.Problem
    strategies: list[str]           # the runs: one per strategy, then CURE per ablation
    ablations: list[str]
    notes: list[str] = field(default_factory=list)
    order: str = "balanced"         # the runs' order within a prompt (runner.interleave)


def plan(dataset: str | None, prompts: Path | None, data: Path | None, limit: int | None, strategies: str,
         ablate: str | None, args: EngineArgs, order: str = "balanced") -> Plan:
    from cure_core.config import DecodeConfig
    from cure_tasks import DatasetError
    from cure_tasks import load as load_task
    if prompts is not None:
        if dataset not in (None, "prompts"):
            fail(f"give a data set or --prompts, not both (got {dataset!r} and --prompts {prompts})")
        dataset, data = "prompts", prompts
    if order not in ORDERS:
        fail(f"--order must be one of {', '.join(ORDERS)} (got {order!r})")
    if dataset is None:
        fail("name a data set (humaneval, gsm8k, mbpp, lcb-lite) or pass --prompts FILE.jsonl")
    try:
        problems = load_task(dataset, data, limit)
    except DatasetError as e:
        fail(str(e))
    if not problems:
        fail(f"{dataset}: no prompts to run (empty file or --limit 0)")
    names, ablations, notes = parse_list(strategies), parse_list(ablate), []
    if not names:
        fail("--strategies is empty")
    if ablations and "cure" not in names:
        names.append("cure")
        notes.append("--ablate compares against full CURE: added 'cure' to the runs")
    build_runs(DecodeConfig(), names, ablations)                   # names checked now; configs once K is known
    return Plan(dataset, data, limit, problems, names, ablations, notes, order)


# ---------------------------------------------------------------- 2. load

@dataclass
class Loaded:
    pair: object                    # cure_core.models.LoadedPair
    runs: list[RunSpec]
    prompts: list[BenchPrompt]
    chat: bool
    skipped: list[dict]
    skipped_prompts: list[str]


def load(p: Plan, args: EngineArgs, chat: bool | None) -> Loaded:
    from cure_core.api import open_pair
    from cure_core.config import ConfigError
    from cure_tasks import raw_by_default
    loaded = open_pair(args.with_(strategy="ar"), strategies=p.strategies)
    p.notes.extend(loaded.notes)
    p.notes.extend(f"warning: {with_flags(w)}" for w in loaded.warnings)
    runs, skipped = [], []
    for r in build_runs(loaded.config, p.strategies, p.ablations):   # loaded.config: K is the drafter's
        try:
            loaded.pair.drafter_for(r.strategy)
            runs.append(r)
        except ConfigError as e:
            skipped.append({"strategy": r.name, "reason": str(e)})
    if not runs:
        fail("no strategy can run with these models: " + "; ".join(s["reason"] for s in skipped))
    tok = loaded.tokenizer
    use_chat = chat if chat is not None else (not raw_by_default(p.dataset) and bool(getattr(tok, "chat_template", None)))
    prompts = [BenchPrompt(i, q, tuple(loaded.encode(q.prompt, chat=use_chat))) for i, q in enumerate(p.problems)]
    empty = [q.task_id for q in prompts if not q.ids]
    if empty:
        fail(f"{len(empty)} prompt(s) encode to no tokens (first: {empty[0]})")
    limit_ctx = loaded.pair.context_limit
    too_long = [q for q in prompts if len(q.ids) + 2 > limit_ctx]
    if too_long:
        p.notes.append(f"{len(too_long)} prompt(s) do not fit the target's {limit_ctx}-token context and are "
                       f"skipped (first: {too_long[0].task_id}, {len(too_long[0].ids)} tokens)")
        prompts = [q for q in prompts if len(q.ids) + 2 <= limit_ctx]
        if not prompts:
            fail(f"no prompt fits the target's {limit_ctx}-token context")
    return Loaded(loaded, runs, prompts, use_chat, skipped, [q.task_id for q in too_long])


# ---------------------------------------------------------------- 3. run

def run(p: Plan, m: Loaded, log: ProgressLog, writer, scorer: Scorer, warmup: int) -> tuple[list[PairResult], str]:
    """Every unfinished pair in benchmark order. Returns (finished pairs, earlier ones included; status)."""
    runs, prompts = m.runs, m.prompts
    run_names = {r.name for r in runs}
    index_ok = {q.index: q.task_id for q in prompts}
    previous = [x for x in log.pairs if x.run in run_names and index_ok.get(x.prompt_index) == x.task_id]
    done = {x.key for x in previous}
    if previous:
        err_console.print(f"resuming {log.path.parent}: {len(previous)} finished pair(s) kept", highlight=False)
    by_name = {r.name: r for r in runs}
    prompt_text = {q.index: q.problem.prompt for q in prompts}

    def trace_pair(x: PairResult) -> None:
        writer.begin(x.prompt_ids, prompt_text.get(x.prompt_index), x.strategy, by_name[x.run].config.to_dict())
        for b in x.blocks:
            writer.block(b)
        writer.end()

    prev_by_key = {x.key: x for x in previous}
    for q, r in interleave(prompts, runs, order=p.order):   # earlier sessions' pairs first, in benchmark order
        if (q.index, r.name) in prev_by_key:
            trace_pair(prev_by_key[(q.index, r.name)])

    finished: list[PairResult] = list(previous)
    running = _Running([r.name for r in runs])
    for x in previous:
        running.add(x)
    done_keys = set(done)
    engine = m.pair.engine
    tok = m.pair.tokenizer
    progress = _BenchProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=err_console, transient=False)
    progress.stats_line = running.line()
    status = "complete"
    try:
        with progress:
            prompts_done = sum(all((q.index, r.name) in done for r in runs) for q in prompts)
            task = progress.add_task("warm-up", total=len(prompts), completed=prompts_done)
            if warmup and len(done) < len(prompts) * len(runs):
                warm_up(engine, runs, prompts, warmup, WARMUP_TOKENS)

            def on_start(q, r):
                progress.update(task, description=f"{q.task_id} [{r.name}]")

            def on_pair(x: PairResult):
                log.append(x)
                trace_pair(x)
                finished.append(x)
                running.add(x)
                progress.stats_line = running.line()
                done_keys.add(x.key)
                if all((x.prompt_index, r.name) in done_keys for r in runs):
                    progress.advance(task)

            run_interleaved(engine, runs, prompts, done, lambda ids: tok.decode(ids, skip_special_tokens=True),
                            score=scorer, on_start=on_start, on_pair=on_pair, order=p.order)
            progress.update(task, description="done")
    except KeyboardInterrupt:
        status = "interrupted"
    return finished, status


# ---------------------------------------------------------------- 4. report

def write_report(p: Plan, m: Loaded, args: EngineArgs, finished: list[PairResult], status: str, scorer: Scorer,
                 scoring_note: str | None, output_dir: Path, models: dict, plot: bool, warmup: int) -> dict:
    from cure_core.trace import versions
    names = [r.name for r in m.runs]
    depth = m.runs[0].config.depth
    computed = stats.compute(finished, m.runs, depth)
    compared = stats.complete_prompts(finished, names)
    score_runs = summarize_scores(finished, names, compared)
    metric_names = sorted({s["metric"] for s in score_runs.values() if s})
    scoring = {"metric": "/".join(metric_names) or None, "note": scoring_note, "allow_code_exec": scorer.allow,
               "runs": score_runs}
    base = m.runs[0].config
    results = report.build_results(
        status=status, dataset=p.dataset, data_path=str(p.data) if p.data else None, limit=p.limit,
        prompts=len(m.prompts), models=models, versions=versions(), device=_device_info(args, m.pair),
        base_config={kk: v for kk, v in base.to_dict().items() if kk != "strategy"}, runs=m.runs,
        order="interleaved: for each prompt, every run in turn (" + ", ".join(names) + ")"
              + ("; their order balanced over the prompts (Williams design)" if p.order == "balanced" else
                 ", in that order every prompt"),
        warmup=warmup, chat=m.chat, computed=computed, scoring=scoring, skipped=m.skipped,
        skipped_prompts=m.skipped_prompts, pairs=finished, output_dir=output_dir)
    report.write_outputs(output_dir, results, finished)
    if plot and computed["compared_prompts"]:
        from .bench.plots import PlotUnavailable, plot_all
        try:
            results["plots"] = [str(x) for x in plot_all(output_dir, results, finished)]
            report.write_outputs(output_dir, results, finished)
        except PlotUnavailable as e:
            err_console.print(f"[yellow]note:[/] {e}", highlight=False)
    return results


# ---------------------------------------------------------------- --engine vllm

def check_engine(engine: str, p: Plan, args: EngineArgs) -> str | None:
    """--engine: refuse what vLLM cannot run here before any model loads; the drafter's folder to export
    (None: no block strategy runs, so vLLM runs ar alone)."""
    from cure_core.catalog import BLOCK_STRATEGIES, choose_models

    from .bench.vllm_engine import check
    draft = None
    if engine == "vllm" and set(p.strategies) & set(BLOCK_STRATEGIES):
        choice = choose_models(args.target, args.draft, args.ar_draft, p.strategies)
        if choice.draft is not None:
            from cure_core.checkpoints import draft_folder_config
            draft, _ = draft_folder_config(choice.draft)
    check(engine, temperature=args.temperature, device=args.device, device_map=args.device_map,
          strategies=p.strategies, draft_folder=draft, dtype=args.target_dtype())
    return draft


def run_vllm_phase(p: Plan, m: Loaded, args: EngineArgs, results: dict, finished: list[PairResult], output_dir: Path,
                   draft: str | None, warmup: int, threads: int | None) -> str | None:
    """The same prompts through vLLM; its rows go to results["engines"]["vllm"] (rewritten to disk).
    Returns the error line when vLLM failed (our results are kept either way)."""
    import torch

    from .bench.vllm_engine import BenchInputs, VllmError, bench_vllm
    position = {q.index: i for i, q in enumerate(m.prompts)}
    ar = {position[x.prompt_index]: list(x.token_ids) for x in finished if x.run == "ar" and x.prompt_index in position}
    base = m.runs[0].config
    pair = m.pair.pair
    inp = BenchInputs(target=pair.names.get("target") or args.target, draft=draft, dtype=args.target_dtype(), k=base.k,
                      max_new_tokens=base.max_new_tokens, stop_ids=tuple(pair.eos_ids),
                      prompts=[list(q.ids) for q in m.prompts], task_ids=[q.task_id for q in m.prompts],
                      ar_tokens=ar, ar_tpot_ms=(results["metrics"].get("ar") or {}).get("tpot_ms"), warmup=warmup,
                      warmup_tokens=WARMUP_TOKENS, threads=threads or torch.get_num_threads(),
                      context_limit=pair.context_limit)
    say = lambda line: err_console.print(f"[dim]{line}[/]", highlight=False, soft_wrap=True)  # noqa: E731
    say(f"vLLM phase: {len(inp.prompts)} prompt(s) through vLLM ar" + (" and vLLM dflash" if draft else "")
        + " (a subprocess in the vLLM venv, on the CPU)")
    error = None
    try:
        results["engines"] = {"vllm": bench_vllm(inp, output_dir / "vllm", say)}
    except VllmError as e:
        error = str(e)
        results["engines"] = {"vllm": {"engine": "vllm", "error": error}}
    report.write_outputs(output_dir, results, finished)
    return error


@friendly_errors
@engine_options(exclude=("strategy",))
def bench(
    dataset: Annotated[Optional[str], typer.Argument(help="humaneval | gsm8k | mbpp | lcb-lite (or use --prompts).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Use the first N problems.")] = None,
    strategies: Annotated[str, typer.Option("--strategies", help="Comma list of runs: ar,sd,parallel,cure,ddtree.")] = "ar,sd,parallel,cure,ddtree",
    data: Annotated[Optional[Path], typer.Option("--data", help="Local data file (needed for mbpp and lcb-lite; overrides the packaged humaneval/gsm8k).")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Custom prompts: jsonl with 'prompt' (optional task_id, kind, tests, entry_point, answer).")] = None,
    ablate: Annotated[Optional[str], typer.Option("--ablate", help="Add CURE ablation runs: branch0, resync (comma list; paper Table 4; on the paper's tree).")] = None,
    paper: Annotated[bool, typer.Option("--paper", help="cure runs the paper's tree (branch 0 + repairs at UFPs), as the ablations do; same as --cure-tree paper.")] = False,
    allow_code_exec: Annotated[bool, typer.Option("--allow-code-exec", help="Run generated code in the sandbox to score pass@1.")] = False,
    output_dir: Annotated[Optional[Path], typer.Option("--output-dir", "-o", help="Where results go (default runs/<timestamp>/).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an output dir: skip finished (prompt, run) pairs.")] = False,
    plot: Annotated[bool, typer.Option("--plot", help="Write PNG figures (needs matplotlib).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary JSON to stdout (tables go to stderr).")] = False,
    warmup: Annotated[int, typer.Option("--warmup", help="Throw-away generations per run before timing.", min=0)] = 1,
    engine: Annotated[str, typer.Option("--engine", help="cure: our strategies only | vllm: also run the same prompts through vLLM (ar, and dflash with the exported drafter) in its own venv, on the CPU, and add its rows to the table.")] = "cure",
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads for torch (and for vLLM with --engine vllm). Default: torch's.", min=1)] = None,
    order: Annotated[str, typer.Option("--order", help="Runs' order within a prompt: balanced (each run in each position and after each other run alike over the prompts) | fixed (the --strategies order every prompt, as before this option).")] = "balanced",
    *, args: EngineArgs,
) -> None:
    """Benchmark decoding strategies on one data set: speed, acceptance, losslessness, task score."""
    with sigterm_as_interrupt():                            # `kill` keeps finished work, like Ctrl+C
        quiet_transformers()
        from cure_core.trace import TraceWriter

        if allow_code_exec:
            from cure_tasks.isolation import isolation_problem
            if (problem := isolation_problem()):
                fail(problem)                                   # before any model loads
        if paper:
            args = args.with_(cure_tree="paper")
        if threads:
            import torch
            torch.set_num_threads(threads)
        from .bench.vllm_engine import VLLM_DTYPES
        if engine == "vllm" and args.dtype == "auto" and args.target_dtype() not in VLLM_DTYPES:
            # Rule: vLLM compares with our ar in one float dtype; auto's int8 target has no vLLM twin.
            args = args.with_(dtype="float32")
            err_console.print("[dim]--engine vllm: the target runs float32 (--dtype auto would pick "
                              "int8 here, which vLLM does not run)[/]", highlight=False)
        p = plan(dataset, prompts, data, limit, strategies, ablate, args, order)
        vllm_draft = check_engine(engine, p, args)                 # before any model loads
        with phase_lines():
            m = load(p, args, args.chat)
        pair = m.pair.pair
        if output_dir is None:
            output_dir = _latest_run_dir() if resume else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
        models = {"target": pair.names.get("target"), "draft": pair.names.get("draft"),
                  "ar_draft": pair.names.get("ar_draft"), "drafter": args.drafter, "drafter_kind": m.pair.drafter_kind,
                  "chain_strategies": sorted(pair.chain_strategies), "mask_token_id": args.mask_token_id}
        fingerprint = {"dataset": p.dataset, "data_path": str(p.data) if p.data else None, "models": models,
                       "device": args.device, "dtype": args.target_dtype(), "draft_dtype": m.pair.draft_dtype,
                       "device_map": args.device_map, "chat": m.chat,
                       "thinking": m.pair.thinking,
                       "runs": {r.name: r.config.to_dict() for r in m.runs}}
        log = ProgressLog(output_dir, fingerprint, resume)
        scorer = Scorer(allow_code_exec)
        scoring_note = REFUSAL if (needs_exec(p.problems) and not allow_code_exec) else None
        for n in p.notes:
            err_console.print(f"[yellow]note:[/] {n}", highlight=False)
        for s in m.skipped:
            err_console.print(f"[yellow]note:[/] {s['strategy']} skipped: {s['reason']}", highlight=False)
        if scoring_note:
            err_console.print(f"[yellow]note:[/] {scoring_note}", highlight=False)

        trace_path = output_dir / report.TRACE_FILE
        base = m.runs[0].config
        writer = TraceWriter(trace_path, models=pair.names, config=base.to_dict(),
                             extra={"thinking": m.pair.thinking, "dtype": run_dtype(pair.target),
                                    "bench": {"dataset": p.dataset, "runs": {r.name: r.config.to_dict() for r in m.runs}}})
        try:
            finished, status = run(p, m, log, writer, scorer, warmup)
        except BaseException:
            writer.close("interrupted")
            log.close()
            raise
        writer.close(status)
        log.close()

        results = write_report(p, m, args, finished, status, scorer, scoring_note, output_dir,
                               {**models, "names": pair.names}, plot, warmup)
        vllm_error = None
        if engine == "vllm" and status == "complete" and results["compared_prompts"]:
            vllm_error = run_vllm_phase(p, m, args, results, finished, output_dir, vllm_draft, warmup, threads)
        out_console = err_console if as_json else Console()
        if results["compared_prompts"]:
            report.print_tables(out_console, results)
        else:
            err_console.print("no prompt finished under every run: nothing to compare yet", highlight=False)
        err_console.print(f"[dim]results: {output_dir / report.RESULTS_FILE} | samples: "
                          f"{output_dir / report.SAMPLES_FILE} | trace: {trace_path}[/]", highlight=False)
        if as_json:
            print(json.dumps(report.summary(results)))
        if vllm_error:
            fail(vllm_error)
        if status == "interrupted":
            raise typer.Exit(130)
