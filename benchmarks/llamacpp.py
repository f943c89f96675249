"""llama.cpp as a peer: its greedy AR, speculative decoding and lookup on the very GGUF our embedded models are
built from, interleaved with cure's methods (benchmarks/peers.py's) in one process.

    python benchmarks/llamacpp.py [--target qwen-coder-1.5b] [--llama ar,spec,lookup] \\
        [--llama-bin /opt/llamacpp/bin] [--llama-draft-max 8] [--gguf-dir DIR] \\
        [any flag of benchmarks/peers.py: --sets, --limit, --max-new-tokens, --threads, --strategies, --hf
         (default here: generate, the reference), --json, --order, --dtype, engine flags ...]

How to build the binaries: benchmarks/README.md, section "llama.cpp". Not part of CI.

The llama.cpp rows (all greedy: --temp 0 --top-k 1; -t and -tb = --threads; -c --llama-ctx):
    llama_ar      llama-completion: the one-shot CLI, no conversation mode (-no-cnv), the prompt not echoed
    llama_spec    llama-speculative-simple with -md the draft GGUF (--llama-draft-model, default the 0.5B) and
                  --spec-type draft-simple --spec-draft-n-max --llama-draft-max; skipped when the target is
                  the draft itself (the 0.5B pair)
    llama_lookup  llama-lookup: prompt n-gram lookup, --spec-draft-n-max --llama-draft-max

Same inputs as ours: the GGUF is the target's embedded alias assembled from its PyPI part packages
(cure_core.embedded.assemble_gguf: the parts located through their installed RECORDs, never imported; size
and sha256 checked) into --gguf-dir, reused there on later runs; `--gguf PATH` names another file. The prompt
is the one peers.py encodes (HumanEval raw, the rest through the chat template), decoded back to text with
the special tokens kept and passed with -p and --no-escape, so llama.cpp tokenizes the same string (its
prompt token count is recorded next to ours: `prompt_tokens_llama`). Same -n (--max-new-tokens), threads
and the peers' warm-up; every row runs in peers.py's prompt-major, balanced order.

Timing: llama.cpp's own decode timings, prefill excluded, as cure's and transformers' are in peers.py:
  llama_ar      "eval time = X ms / N runs": N decode forwards after the prompt's, each one token
  llama_spec,   "decoded N tokens in S seconds" (prefill: "encoded ... in S seconds"); target forwards =
  llama_lookup  n_predict - n_accept (each verification yields its accepted tokens + 1)
tokens/s = decode tokens / decode seconds, summed over prompts. speculative-simple stops after the block
that passes -n, so it may decode a few tokens more than -n; its time covers them, so its rate is fair.

Output check: llama.cpp's text, re-encoded with our tokenizer, against hf_generate's tokens (the `= HF
greedy` column; where llama.cpp stopped at an end-of-generation token, which it does not print, against
them less that token). llama.cpp multiplies its 4-bit weights by 8-bit activations where we dequantize to the run's
dtype (or, in int8, re-quantize the weights per row and each activation row on one scale), so its argmax can flip:
a difference there is a different computation, not a lost token.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import peers  # noqa: E402
from cure_core.errors import CureError  # noqa: E402
from cure_core.options import EngineArgs, parse_list  # noqa: E402

SCHEMA = "cure.llamacpp/1"
BIN_ENV = "LLAMACPP_BIN"
DEFAULT_BIN = "/opt/llamacpp/bin"
DEFAULT_DRAFT = "qwen-coder-0.5b"
ROWS = {"ar": "llama_ar", "spec": "llama_spec", "lookup": "llama_lookup"}
BINARY = {"ar": "llama-completion", "spec": "llama-speculative-simple", "lookup": "llama-lookup"}


class LlamaCppError(CureError):
    """llama.cpp cannot run here or said something we cannot read."""


# ---------------------------------------------------------------- llama.cpp's output

@dataclass
class LlamaRun:
    text: str                       # the generated text (the prompt and llama.cpp's own markers removed)
    prompt_tokens: int              # the prompt as llama.cpp tokenized it
    prefill_ms: float
    decode_ms: float
    decode_tokens: int              # tokens the decode time covers
    new_tokens: int                 # tokens generated in all (the first one included)
    target_forwards: int            # target forwards that made them (the prefill's included)
    eog: bool                       # it stopped at an end-of-generation token (not written in `text`)
    drafted: int | None = None      # speculative rows: draft tokens offered, and accepted by the target
    accepted: int | None = None


_NUM = r"([0-9]+(?:\.[0-9]+)?)"


def _last(pattern: str, text: str, what: str) -> tuple[str, ...]:
    found = re.findall(pattern, text)
    if not found:
        raise LlamaCppError(f"llama.cpp's output has no {what} line (pattern {pattern!r})")
    last = found[-1]
    return last if isinstance(last, tuple) else (last,)


def parse_completion(stdout: str, stderr: str) -> LlamaRun:
    """llama-completion -no-cnv --no-display-prompt: stdout is the generated text, then " [end of text]\n" at an
    end-of-generation token, then "\n\n"; stderr ends with the perf lines "prompt eval time = X ms / N tokens"
    and "eval time = X ms / N runs"."""
    p_ms, p_n = _last(rf"prompt eval time =\s*{_NUM} ms /\s*(\d+) tokens", stderr, "'prompt eval time'")
    e_ms, e_n = _last(rf"(?<!prompt )eval time =\s*{_NUM} ms /\s*(\d+) runs", stderr, "'eval time'")
    text = stdout.removesuffix("\n\n")
    eog = text.endswith(" [end of text]\n")
    text = text.removesuffix(" [end of text]\n")
    runs = int(e_n)
    # the first token comes from the prompt's forward, every later one from one decode run
    return LlamaRun(text=text, prompt_tokens=int(p_n), prefill_ms=float(p_ms), decode_ms=float(e_ms),
                    decode_tokens=runs, new_tokens=runs + 1, target_forwards=runs + 1, eog=eog)


def parse_speculative(stdout: str, stderr: str, prompt: str, max_new: int) -> LlamaRun:
    """llama-speculative-simple and llama-lookup: stdout is "\\n\\n", the prompt as tokenized, the generated
    text, "\\n\\n" twice; stderr has "encoded N tokens in S seconds", "decoded N tokens in S seconds", n_predict,
    n_drafted and n_accept. Both stop once n_predict passes -n, or at an end-of-generation token: so
    n_predict <= -n means the latter."""
    enc_n, enc_s = _last(rf"encoded\s+(\d+) tokens in\s+{_NUM} seconds", stderr, "'encoded'")
    dec_n, dec_s = _last(rf"decoded\s+(\d+) tokens in\s+{_NUM} seconds", stderr, "'decoded'")
    predicted = int(_last(r"n_predict\s*=\s*(\d+)", stderr, "'n_predict'")[0])
    drafted = int(_last(r"n_drafted\s*=\s*(\d+)", stderr, "'n_drafted'")[0])
    accepted = int(_last(r"n_accept\s*=\s*(\d+)", stderr, "'n_accept'")[0])
    text = stdout[2:] if stdout.startswith("\n\n") else stdout
    if not text.startswith(prompt):
        raise LlamaCppError("llama.cpp echoed another prompt than the one passed: it tokenized the text "
                            "differently (a special token it does not know?)")
    text = text[len(prompt):].removesuffix("\n\n\n\n")
    return LlamaRun(text=text, prompt_tokens=int(enc_n), prefill_ms=1e3 * float(enc_s),
                    decode_ms=1e3 * float(dec_s), decode_tokens=int(dec_n), new_tokens=predicted,
                    target_forwards=max(predicted - accepted, 1), eog=predicted <= max_new, drafted=drafted,
                    accepted=accepted)


# ---------------------------------------------------------------- running it

def binary(folder: str | Path, row: str) -> Path:
    """The binary a row runs, checked before any model loads."""
    path = Path(folder) / BINARY[row]
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise LlamaCppError(f"no llama.cpp binary {path} (row {row}): build it as benchmarks/README.md "
                            f"says (section llama.cpp), or pass --llama-bin DIR / set ${BIN_ENV}")
    return path


def command(row: str, exe: Path, model: Path, prompt: str, max_new: int, threads: int, ctx: int,
            draft_model: Path | None = None, draft_max: int = 8) -> list[str]:
    """The argv of one greedy llama.cpp generation of `max_new` tokens at most."""
    argv = [str(exe), "-m", str(model), "-p", prompt, "--no-escape", "-n", str(max_new), "-t", str(threads),
            "-tb", str(threads), "-c", str(ctx), "--temp", "0", "--top-k", "1", "--seed", "0"]
    if row == "ar":
        argv += ["-no-cnv", "--no-display-prompt"]
    elif row == "spec":
        argv += ["-md", str(draft_model), "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max)]
    elif row == "lookup":
        argv += ["--spec-draft-n-max", str(draft_max)]
    return argv


def run_llama(row: str, argv: list[str], prompt: str, max_new: int, timeout: float = 1800.0) -> tuple[LlamaRun, float]:
    """Run one generation; (what it reports, the process's wall ms)."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LlamaCppError(f"{Path(argv[0]).name} ran past {timeout:.0f} s") from None
    wall = (time.perf_counter() - t0) * 1e3
    out, err = (done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"))
    if done.returncode != 0:
        tail = next((line for line in reversed(err.strip().splitlines()) if line.strip()), "no output")
        raise LlamaCppError(f"{Path(argv[0]).name} exited with {done.returncode}: {tail.strip()}")
    parsed = parse_completion(out, err) if row == "ar" else parse_speculative(out, err, prompt, max_new)
    return parsed, wall


def prompt_text(tokenizer, ids: Sequence[int]) -> str:
    """The prompt as text llama.cpp tokenizes back to the same ids: special tokens written out, no clean-up."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def llama_method(row: str, exe: Path, model: Path, tokenizer, threads: int, ctx: int,
                 draft_model: Path | None, draft_max: int) -> peers.Method:
    def run(ids: list[int], max_new: int) -> dict:
        prompt = prompt_text(tokenizer, ids)
        argv = command(row, exe, model, prompt, max_new, threads, ctx, draft_model, draft_max)
        got, wall = run_llama(row, argv, prompt, max_new)
        tokens = tokenizer.encode(got.text, add_special_tokens=False)[:max_new]
        rec = {"tokens": tokens, "text": got.text, "prefill_ms": got.prefill_ms, "total_ms": wall,
               "decode_ms": got.decode_ms, "decode_tokens": got.decode_tokens, "target_forwards": got.target_forwards,
               # llama.cpp's own count (tau's numerator; speculative rows may pass -n), not len(tokens)
               "new_tokens": got.new_tokens, "prompt_tokens_llama": got.prompt_tokens, "eog": got.eog}
        if got.drafted is not None:
            rec |= {"drafted": got.drafted, "accepted": got.accepted}
        return rec

    settings = {"binary": str(exe), "model": str(model), "threads": threads, "ctx": ctx, "greedy": "--temp 0 --top-k 1"}
    if row in ("spec", "lookup"):
        settings["spec_draft_n_max"] = draft_max
    if row == "spec":
        settings |= {"draft_model": str(draft_model), "spec_type": "draft-simple"}
    return peers.Method(ROWS[row], "llamacpp", settings, run)


# ---------------------------------------------------------------- the GGUF files

def gguf_for(alias: str, folder: Path) -> Path:
    """`folder/<alias>.gguf`, assembled from the alias's part packages unless a file of its size is there."""
    from cure_core import embedded
    if alias not in embedded.EMBEDDED_MODELS:
        raise LlamaCppError(f"{alias!r} is not an embedded model, so there is no GGUF to give llama.cpp: "
                            f"pass --gguf PATH (and --llama-draft-model PATH for the spec row)")
    model = embedded.get_model(alias)
    path = folder / f"{alias}.gguf"
    if path.is_file() and path.stat().st_size == model.size:
        return path                  # assemble_gguf writes only a checked file, whole (atomic rename)
    print(f"assembling {path} from {len(model.packages)} part package(s)...", flush=True)
    return embedded.assemble_gguf(model, folder)


def llama_version(exe: Path) -> str | None:
    try:
        done = subprocess.run([str(exe), "--version"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout + done.stderr).decode("utf-8", "replace")
    return next((line.strip() for line in text.splitlines() if line.startswith("version")), None)


# ---------------------------------------------------------------- the run

def parse_args(argv: Sequence[str] | None):
    """This script's flags; every other flag goes to peers.py's parser (so each means what it means there)."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--llama", default="ar,spec,lookup", help="llama.cpp rows: ar, spec, lookup")
    ap.add_argument("--llama-bin", default=os.environ.get(BIN_ENV, DEFAULT_BIN), help="folder of the binaries")
    ap.add_argument("--llama-draft-max", type=int, default=8, help="--spec-draft-n-max of spec and lookup")
    ap.add_argument("--llama-draft-model", default=DEFAULT_DRAFT, help="the spec row's draft: alias or .gguf")
    ap.add_argument("--llama-ctx", type=int, default=4096, help="llama.cpp's context size (-c)")
    ap.add_argument("--gguf", default=None, help="the target's GGUF (default: its embedded alias, assembled)")
    ap.add_argument("--gguf-dir", default=None, help="where assembled GGUFs go (default: cure's cache/gguf)")
    ours, rest = ap.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        print(__doc__)
        print("llama.cpp flags:\n" + ap.format_help().split("\n", 1)[1])
        print("every other flag: benchmarks/peers.py --help")
        raise SystemExit(0)
    def bad(msg: str):
        print(f"error: {msg}", file=sys.stderr)
        raise SystemExit(2)
    rows = parse_list(ours.llama)
    for r in rows:
        if r not in ROWS:
            bad(f"--llama {r!r}: choose from {', '.join(ROWS)}")
    if ours.llama_draft_max < 1:
        bad("--llama-draft-max must be >= 1")
    if ours.llama_ctx < 64:
        bad("--llama-ctx must be >= 64")
    if not any(a == "--hf" or a.startswith("--hf=") for a in rest):
        rest = [*rest, "--hf", "generate"]           # the reference; HF's speculative loops are peers.py's subject
    args = peers.parse_args(rest)
    if args.tiny and rows and ours.gguf is None:
        bad("--tiny has no GGUF for llama.cpp: pass --gguf PATH, or --llama '' for none")
    for k, v in vars(ours).items():
        setattr(args, k, v)
    args.llama_rows = rows
    return args


def add_llama_methods(args, setup: peers.Setup, threads: int, exes: dict[str, Path]) -> tuple[list[peers.Method], dict]:
    """The llama.cpp rows asked for (`exes`: row -> its binary), and what they run on (GGUF files, version)."""
    from cure_core.embedded import cache_root
    folder = Path(args.gguf_dir) if args.gguf_dir else cache_root() / "gguf"
    info: dict = {"bin": str(args.llama_bin), "version": llama_version(next(iter(exes.values()))) if exes else None}
    if not exes:
        return [], info
    target_alias = setup.models.get("target")
    model = Path(args.gguf) if args.gguf else gguf_for(str(target_alias), folder)
    if not model.is_file():
        raise LlamaCppError(f"--gguf {model}: no such file")
    info["model"] = str(model)
    draft = None
    methods = []
    for r, exe in exes.items():
        if r == "spec":
            name = args.llama_draft_model
            if not name.endswith(".gguf") and name == target_alias:
                setup.skipped.append({"method": ROWS[r], "reason": f"the target {name} would draft for itself"})
                continue
            draft = Path(name) if name.endswith(".gguf") else gguf_for(name, folder)
            info["draft_model"] = str(draft)
        methods.append(llama_method(r, exe, model, setup.tokenizer, threads, args.llama_ctx, draft,
                                    args.llama_draft_max))
    return methods, info


def render(console, summary: dict, n_prompts: int, ar_dtype: str, title: str = "") -> None:
    from rich.table import Table

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    t = Table(title=f"llama.cpp and cure{' ' + title if title else ''}: {n_prompts} prompt(s), greedy, "
                    f"prefill excluded")
    t.add_column("method", no_wrap=True)
    for col in ("decode tok", "tok/s", "TPOT ms", "prefill ms", "tau", "accept", f"x ar ({ar_dtype})",
                "x llama ar", "= HF greedy"):
        t.add_column(col, justify="right")
    llama_ar = (summary.get(ROWS["ar"]) or {}).get("tokens_per_s")
    for name, s in summary.items():
        match = f"{s['matches_hf_greedy']}/{s['prompts']}"
        t.add_row(name, str(s["decode_tokens"]), f(s["tokens_per_s"], ".2f"), f(s["tpot_ms"], ".1f"),
                  f(s["prefill_ms_mean"], ".0f"), f(s["tau"], ".2f"), f(s.get("accept_rate"), ".0%"),
                  f(s["speedup_vs_cure_ar"], ".2f"),
                  f(s["tokens_per_s"] / llama_ar if llama_ar and s["tokens_per_s"] else None, ".2f"),
                  match if s["all_match_hf_greedy"] or s["kind"] == "llamacpp" else f"[red]{match}[/red]")
    console.print(t)


def summarize(methods, results: list[dict]) -> dict:
    """peers.py's summary, plus for the llama.cpp rows the share of draft tokens accepted and how many
    prompts llama.cpp tokenized to as many tokens as ours."""
    out = peers.summarize_methods(methods, results)
    for m in methods:
        if m.kind != "llamacpp":
            continue
        rows = [r for r in results if r["method"] == m.name]
        drafted = sum(r.get("drafted") or 0 for r in rows)
        out[m.name]["accept_rate"] = sum(r.get("accepted") or 0 for r in rows) / drafted if drafted else None
        out[m.name]["prompt_tokens_equal"] = sum(r["prompt_tokens_llama"] == r["prompt_tokens"] for r in rows)
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    from rich.console import Console
    import torch
    args = parse_args(argv)
    exes = {r: binary(args.llama_bin, r) for r in args.llama_rows}     # before any model loads
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 140))
    threads, why = peers.choose_threads(args.threads)
    torch.set_num_threads(threads)
    console.print(f"threads: {threads} ({why}), for cure and llama.cpp alike")
    env = peers.environment(threads, why, args.device, EngineArgs.from_cli_args(args).target_dtype())

    t_load = time.perf_counter()
    setup = peers.load_setup(args)
    methods = peers.build_methods(args, setup)
    llama, llama_info = add_llama_methods(args, setup, threads, exes)
    methods += llama
    load_s = time.perf_counter() - t_load
    from cure_core.cpu_kernels import run_dtype
    ar_dtype = run_dtype(setup.pair.target)          # int8 for an int8 target, whose norms stay float32
    env["ar_dtype"] = ar_dtype
    for n in setup.notes:
        console.print(f"note: {n}")
    for s in setup.skipped:
        console.print(f"skipped {s['method']}: {s['reason']}")
    console.print(f"loaded in {load_s:.1f}s; {len(setup.prompts)} prompt(s); methods: "
                  + ", ".join(m.name for m in methods) + f"; llama.cpp {llama_info.get('version') or '?'}")

    warm = min(args.warmup_tokens, args.max_new_tokens)
    if warm > 0:
        for m in methods:
            m.run(setup.prompts[0][2], warm)

    eos = set(setup.pair.eos_ids)
    results: list[dict] = []
    total, done = len(setup.prompts) * len(methods), 0
    for pi, (set_name, tid, ids) in enumerate(setup.prompts):
        runs: dict[str, tuple[int, dict]] = {}
        for position, m in enumerate(peers.run_order(methods, pi, args.order)):
            runs[m.name] = (position, m.run(ids, args.max_new_tokens))
            done += 1
            if not args.quiet:
                rec = runs[m.name][1]
                tps = peers._rate(rec["decode_tokens"], rec["decode_ms"])
                console.print(f"[{done}/{total}] {tid} {m.name}: {len(rec['tokens'])} tok, "
                              f"{'-' if tps is None else f'{tps:.2f}'} tok/s")
        for m in methods:
            position, rec = runs[m.name]
            ref = runs[peers.reference_of(m)][1]["tokens"]     # HF greedy, or ar on another target (dtype=)
            # llama.cpp does not write the end-of-generation token it stopped at: compare without ours
            mine = ref[:-1] if rec.get("eog") and ref and ref[-1] in eos else ref
            mm = peers.first_mismatch(rec["tokens"], mine)
            tps = peers._rate(rec["decode_tokens"], rec["decode_ms"])
            results.append({"prompt_index": pi, "set": set_name, "task_id": tid, "method": m.name,
                            "prompt_tokens": len(ids), "new_tokens": len(rec["tokens"]), **rec,
                            "tokens_per_s": tps, "tpot_ms": 1e3 / tps if tps else None,
                            "matches_hf_greedy": mm is None, "first_mismatch": mm, "run_position": position})

    summary = summarize(methods, results)
    sets = sorted({r["set"] for r in results}, key=[x[0] for x in setup.prompts].index)
    per_set = {name: summarize(methods, [r for r in results if r["set"] == name]) for name in sets}
    for name in sets if len(sets) > 1 else ():
        render(console, per_set[name], sum(1 for x in setup.prompts if x[0] == name), ar_dtype, title=name)
    render(console, summary, len(setup.prompts), ar_dtype, title=" + ".join(sets))
    for m in llama:
        s = summary[m.name]
        console.print(f"{m.name}: llama.cpp tokenized {s['prompt_tokens_equal']}/{s['prompts']} prompt(s) to as "
                      f"many tokens as ours")
    env["load_average_end"] = common.load_average()
    report = peers._clean({
        "schema": SCHEMA, "environment": env,
        "config": {"limit": args.limit, "max_new_tokens": args.max_new_tokens, "threads": threads,
                   "strategies": parse_list(args.strategies), "hf": parse_list(args.hf), "llama": args.llama_rows,
                   "llama_draft_max": args.llama_draft_max, "llama_ctx": args.llama_ctx, "warmup_tokens": warm,
                   "temperature": 0.0, "sets": parse_list(args.sets), "order": args.order,
                   "prompt_encoding": "raw for completion tasks, else the chat template; llama.cpp gets the "
                                      "same ids as text (special tokens written out, --no-escape)"},
        "llamacpp": llama_info, "models": setup.models, "load_s": load_s,
        "methods": [{"name": m.name, "kind": m.kind, "lossless": m.kind != "llamacpp", "settings": m.settings}
                    for m in methods],
        "skipped": setup.skipped, "notes": setup.notes,
        "summary": summary, "summary_per_set": per_set, "results": results,
    })
    return peers.finish(report, args.json, setup, console)


if __name__ == "__main__":
    common.entry(main)
