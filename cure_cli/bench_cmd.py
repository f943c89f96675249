"""`cure bench DATASET`: AR vs naive SD vs parallel vs CURE vs DDTree on the same prompts, one run.

Models load once; one Engine per run config is reused for every prompt. Runs are interleaved
prompt by prompt after a warm-up so machine drift cancels. See cure_cli/bench/ for the pieces.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from cure_core.config import ConfigError
from cure_core.errors import ModelLoadError
from cure_core.trace import TraceWriter, versions

from .bench import report, stats
from .bench.runner import (BenchPrompt, PairResult, ProgressLog, build_runs, interleave, parse_list,
                           run_interleaved, warm_up)
from .bench.scoring import REFUSAL, Scorer, needs_exec, summarize_scores
from .common import (DraftVocabN, resolve_draft_vocab, LoggedProgress, BMax, Compile, KVCache, Kernels, DType, Device, DeviceMap, Draft, DrafterKind, K, MaskTokenId, MaxNew, Seed, Target,
                     TauMargin, Temperature, VMax, decode_config, drafter_block_size, err_console, fail, friendly_errors, load_kernels,
                     quiet_transformers)
from .defaults import AR_DRAFT_FOR, default_models

BLOCK_STRATEGIES = ("parallel", "cure", "ddtree")
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


def _device_info(device: str, dtype: str, device_map: str | None) -> dict:
    import torch
    info = {"device": device, "dtype": dtype, "device_map": device_map, "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(torch.device(device))
    return info


def _latest_run_dir() -> Path:
    base = Path("runs")
    dirs = sorted((d for d in base.glob("*") if (d / "progress.jsonl").exists()), key=lambda d: d.stat().st_mtime)
    if not dirs:
        fail("--resume needs --output-dir DIR (no earlier run found under runs/)")
    return dirs[-1]


def _terminate(signum, frame):
    raise KeyboardInterrupt


@friendly_errors
def bench(
    dataset: Annotated[Optional[str], typer.Argument(help="humaneval | gsm8k | mbpp | lcb-lite (or use --prompts).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Use the first N problems.")] = None,
    strategies: Annotated[str, typer.Option("--strategies", help="Comma list of runs: ar,sd,parallel,cure,ddtree.")] = "ar,sd,parallel,cure,ddtree",
    target: Target = None,
    draft: Draft = None,
    drafter: DrafterKind = "auto",
    mask_token_id: MaskTokenId = None,
    ar_draft: Annotated[Optional[str], typer.Option("--ar-draft", help="Autoregressive draft model for 'sd' (default for qwen-coder-1.5b: qwen-coder-0.5b).")] = None,
    max_new_tokens: MaxNew = 256,
    temperature: Temperature = 0.0,
    seed: Seed = 0,
    k: K = None,
    tau_margin: TauMargin = 1.0,
    b_max: BMax = 5,
    v_max: VMax = "auto",
    kv_cache: KVCache = "static",
    compile: Compile = False,
    kernels: Kernels = "auto",
    draft_vocab: DraftVocabN = "auto",
    device: Device = "cpu",
    dtype: DType = "float32",
    device_map: DeviceMap = None,
    chat: Annotated[Optional[bool], typer.Option("--chat/--raw", help="Prompt encoding. Default: raw for humaneval/mbpp (completion style), the chat template otherwise when the tokenizer has one.")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="Local data file (needed for mbpp and lcb-lite; overrides the packaged humaneval/gsm8k).")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Custom prompts: jsonl with 'prompt' (optional task_id, kind, tests, entry_point, answer).")] = None,
    ablate: Annotated[Optional[str], typer.Option("--ablate", help="Add CURE ablation runs: branch0, resync (comma list; paper Table 4).")] = None,
    allow_code_exec: Annotated[bool, typer.Option("--allow-code-exec", help="Run generated code in the sandbox to score pass@1.")] = False,
    output_dir: Annotated[Optional[Path], typer.Option("--output-dir", "-o", help="Where results go (default runs/<timestamp>/).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an output dir: skip finished (prompt, run) pairs.")] = False,
    plot: Annotated[bool, typer.Option("--plot", help="Write PNG figures (needs matplotlib).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary JSON to stdout (tables go to stderr).")] = False,
    warmup: Annotated[int, typer.Option("--warmup", help="Throw-away generations per run before timing.", min=0)] = 1,
) -> None:
    """Benchmark decoding strategies on one data set: speed, acceptance, losslessness, task score."""
    from cure_core.engine import Engine                    # torch / transformers load here, not at --help
    from cure_core.models import encode_prompt, load_pair
    signal.signal(signal.SIGTERM, _terminate)               # `kill` keeps finished work, like Ctrl+C
    quiet_transformers()
    from cure_tasks import DatasetError, raw_by_default
    from cure_tasks import load as load_dataset

    # ---- prompts
    if prompts is not None:
        if dataset not in (None, "prompts"):
            fail(f"give a data set or --prompts, not both (got {dataset!r} and --prompts {prompts})")
        dataset, data = "prompts", prompts
    if dataset is None:
        fail("name a data set (humaneval, gsm8k, mbpp, lcb-lite) or pass --prompts FILE.jsonl")
    try:
        problems = load_dataset(dataset, data, limit)
    except DatasetError as e:
        fail(str(e))
    if not problems:
        fail(f"{dataset}: no prompts to run (empty file or --limit 0)")

    # ---- runs
    notes: list[str] = []
    names = parse_list(strategies)
    ablations = parse_list(ablate)
    if not names:
        fail("--strategies is empty")
    if ablations and "cure" not in names:
        names.append("cure")
        notes.append("--ablate compares against full CURE: added 'cure' to the runs")
    base = decode_config("cure", max_new_tokens, temperature, seed, k, tau_margin, b_max, v_max, kv_cache=kv_cache, compile=compile)
    runs = build_runs(base, names, ablations)

    # ---- models (loaded once)
    skipped: list[dict] = []
    target, draft, no_draft = default_models(target, draft, "cure")
    if no_draft is not None:
        for r in runs:
            if r.strategy in BLOCK_STRATEGIES:
                skipped.append({"strategy": r.name, "reason": no_draft.message})
        runs = [r for r in runs if r.strategy not in BLOCK_STRATEGIES]
    want_sd = any(r.strategy == "sd" for r in runs)
    ar_name = (ar_draft or AR_DRAFT_FOR.get(target)) if want_sd else None
    ar_given = ar_draft is not None
    ar_arg = None if ar_name == draft else ar_name
    kernels = load_kernels(kernels, compile)
    draft_vocab = resolve_draft_vocab(draft_vocab, device, device_map)     # "auto" -> a number of ids
    try:
        loaded = load_pair(target, draft, drafter=drafter, mask_token_id=mask_token_id, ar_draft=ar_arg,
                           device=device, dtype=dtype, device_map=device_map, kernels=kernels, draft_vocab=draft_vocab)
    except ModelLoadError as e:
        if ar_arg is None or ar_given:
            raise
        # the default AR draft is not installed: run everything else
        loaded = load_pair(target, draft, drafter=drafter, mask_token_id=mask_token_id, device=device,
                           dtype=dtype, device_map=device_map, kernels=kernels, draft_vocab=draft_vocab)
        notes.append(f"default AR draft {ar_name!r} unavailable ({e}); 'sd' skipped")
        ar_name = None
    pair = loaded.pair
    if k is None and (trained := drafter_block_size(pair)):
        # draft the block length the drafter was trained for (a DFlash checkpoint records it)
        base = base.with_(k=trained)
        runs = [dataclasses.replace(r, config=r.config.with_(k=trained)) for r in runs]
    if want_sd and pair.ar_drafter is None and ar_name is not None and ar_name == draft:
        # the same checkpoint as the block drafter, which loaded as PARD: load it again as an AR draft
        from cure_core.drafters.causal import ArDrafter
        from cure_core.models import apply_kernels, load_model
        model, _ = load_model(ar_name, device if not device_map else str(next(pair.target.parameters()).device), dtype)
        apply_kernels(loaded.kernels, [model])          # the same kernels as the rest of the pair
        from cure_core.drafters.vocab import lowest_ids
        vocab = len(loaded.tokenizer)
        pair.ar_drafter = ArDrafter(model, vocab_size=vocab, draft_vocab=lowest_ids(draft_vocab, vocab))
    if pair.ar_drafter is not None and want_sd:
        pair.names.setdefault("ar_draft", ar_name or draft)
    engines = {}
    for r in runs:
        try:
            engines[r.name] = Engine(pair, r.config)
        except ConfigError as e:
            reason = ("no autoregressive draft model (pass --ar-draft MODEL)" if r.strategy == "sd" else str(e))
            skipped.append({"strategy": r.name, "reason": reason})
    runs = [r for r in runs if r.name in engines]
    if not runs:
        fail("no strategy can run with these models: " + "; ".join(s["reason"] for s in skipped))

    # ---- prompt encoding
    tok = loaded.tokenizer
    has_template = bool(getattr(tok, "chat_template", None))
    use_chat = chat if chat is not None else (not raw_by_default(dataset) and has_template)
    bench_prompts = [BenchPrompt(i, p, tuple(encode_prompt(tok, p.prompt, use_chat))) for i, p in enumerate(problems)]
    empty = [p.task_id for p in bench_prompts if not p.ids]
    if empty:
        fail(f"{len(empty)} prompt(s) encode to no tokens (first: {empty[0]})")
    limit_ctx = pair.context_limit
    too_long = [p for p in bench_prompts if len(p.ids) + 2 > limit_ctx]
    if too_long:
        notes.append(f"{len(too_long)} prompt(s) do not fit the target's {limit_ctx}-token context and are skipped "
                     f"(first: {too_long[0].task_id}, {len(too_long[0].ids)} tokens)")
        bench_prompts = [p for p in bench_prompts if len(p.ids) + 2 <= limit_ctx]
        if not bench_prompts:
            fail(f"no prompt fits the target's {limit_ctx}-token context")

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    # ---- output dir and progress log
    if output_dir is None:
        output_dir = _latest_run_dir() if resume else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    device_info = _device_info(device, dtype, device_map)
    models = {"target": target, "draft": draft, "ar_draft": pair.names.get("ar_draft"), "drafter": drafter,
              "drafter_kind": loaded.drafter_kind, "mask_token_id": mask_token_id}
    fingerprint = {"dataset": dataset, "data_path": str(data) if data else None, "models": models,
                   "device": device, "dtype": dtype, "device_map": device_map, "chat": use_chat,
                   "runs": {r.name: r.config.to_dict() for r in runs}}
    log = ProgressLog(output_dir, fingerprint, resume)
    run_names = {r.name for r in runs}
    index_ok = {p.index: p.task_id for p in bench_prompts}
    previous = [p for p in log.pairs if p.run in run_names and index_ok.get(p.prompt_index) == p.task_id]
    done = {p.key for p in previous}

    # ---- scoring
    scorer = Scorer(allow_code_exec)
    scoring_note = REFUSAL if (needs_exec(problems) and not allow_code_exec) else None

    out_console = err_console if as_json else Console()
    for n in notes:
        err_console.print(f"[yellow]note:[/] {n}", highlight=False)
    for s in skipped:
        err_console.print(f"[yellow]note:[/] {s['strategy']} skipped: {s['reason']}", highlight=False)
    if scoring_note:
        err_console.print(f"[yellow]note:[/] {scoring_note}", highlight=False)
    if previous:
        err_console.print(f"resuming {output_dir}: {len(previous)} finished pair(s) kept", highlight=False)

    # ---- trace: earlier sessions' pairs first, then this session's, one generation per pair
    trace_path = output_dir / report.TRACE_FILE
    writer = TraceWriter(trace_path, models=pair.names, config=base.to_dict(),
                         extra={"bench": {"dataset": dataset, "runs": {r.name: r.config.to_dict() for r in runs}}})
    by_name = {r.name: r for r in runs}
    prompt_text = {p.index: p.problem.prompt for p in bench_prompts}

    def trace_pair(p: PairResult) -> None:
        writer.begin(p.prompt_ids, prompt_text.get(p.prompt_index), p.strategy, by_name[p.run].config.to_dict())
        for b in p.blocks:
            writer.block(b)
        writer.end()

    prev_by_key = {p.key: p for p in previous}
    for bp, r in interleave(bench_prompts, runs):
        if (bp.index, r.name) in prev_by_key:
            trace_pair(prev_by_key[(bp.index, r.name)])

    finished: list[PairResult] = list(previous)
    running = _Running([r.name for r in runs])
    for p in previous:
        running.add(p)
    total_prompts = len(bench_prompts)
    prompts_done = sum(all((bp.index, r.name) in done for r in runs) for bp in bench_prompts)
    done_keys = set(done)
    status = "complete"
    progress = _BenchProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=err_console, transient=False)
    progress.stats_line = running.line()
    try:
        with progress:
            task = progress.add_task("warm-up", total=total_prompts, completed=prompts_done)
            if warmup and len(done) < total_prompts * len(runs):
                # same code paths, shorter generations: warm-up is not worth a full generation per run
                warm = {r.name: Engine(pair, r.config.with_(max_new_tokens=min(r.config.max_new_tokens, WARMUP_TOKENS)))
                        for r in runs}
                warm_up(warm, runs, bench_prompts, warmup)
                del warm

            def on_start(bp, r):
                progress.update(task, description=f"{bp.task_id} [{r.name}]")

            def on_pair(p: PairResult):
                log.append(p)
                trace_pair(p)
                finished.append(p)
                running.add(p)
                progress.stats_line = running.line()
                done_keys.add(p.key)
                if all((p.prompt_index, r.name) in done_keys for r in runs):
                    progress.advance(task)

            run_interleaved(engines, runs, bench_prompts, done, decode, score=scorer, on_start=on_start,
                            on_pair=on_pair)
            progress.update(task, description="done")
    except KeyboardInterrupt:
        status = "interrupted"
    except BaseException:
        writer.close("interrupted")
        log.close()
        raise
    writer.close(status)
    log.close()

    # ---- results
    computed = stats.compute(finished, runs, base.depth)
    compared = stats.complete_prompts(finished, [r.name for r in runs])
    score_runs = summarize_scores(finished, [r.name for r in runs], compared)
    metric_names = sorted({s["metric"] for s in score_runs.values() if s})
    scoring = {"metric": "/".join(metric_names) or None, "note": scoring_note, "allow_code_exec": allow_code_exec,
               "runs": score_runs}
    results = report.build_results(
        status=status, dataset=dataset, data_path=str(data) if data else None, limit=limit,
        prompts=total_prompts, models={**models, "names": pair.names}, versions=versions(), device=device_info,
        base_config={kk: v for kk, v in base.to_dict().items() if kk != "strategy"}, runs=runs,
        order="interleaved: for each prompt, every run in turn (" + ", ".join(r.name for r in runs) + ")",
        warmup=warmup, chat=use_chat, computed=computed, scoring=scoring, skipped=skipped,
        skipped_prompts=[p.task_id for p in too_long],
        pairs=finished, output_dir=output_dir)
    report.write_outputs(output_dir, results, finished)
    if plot and computed["compared_prompts"]:
        from .bench.plots import PlotUnavailable, plot_all
        try:
            paths = plot_all(output_dir, results, finished)
            results["plots"] = [str(p) for p in paths]
            report.write_outputs(output_dir, results, finished)
        except PlotUnavailable as e:
            err_console.print(f"[yellow]note:[/] {e}", highlight=False)
    if computed["compared_prompts"]:
        report.print_tables(out_console, results)
    else:
        err_console.print("no prompt finished under every run: nothing to compare yet", highlight=False)
    err_console.print(f"[dim]results: {output_dir / report.RESULTS_FILE} | samples: "
                      f"{output_dir / report.SAMPLES_FILE} | trace: {trace_path}[/]", highlight=False)
    if as_json:
        print(json.dumps(report.summary(results)))
    if status == "interrupted":
        raise typer.Exit(130)
