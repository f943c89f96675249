"""Shared CLI pieces: engine options, the error boundary, config building."""
from __future__ import annotations

import functools
import os
import sys
import time
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import Progress

from cure_core.config import ConfigError, DecodeConfig
from cure_core.errors import CureError

err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def friendly_errors(fn):
    """Turn user errors into one clear line and a non-zero exit; never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CureError as e:
            fail(str(e))
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            raise typer.Exit(130)
        except (OSError, ValueError) as e:
            if os.environ.get("CURE_DEBUG"):
                raise
            fail(f"{type(e).__name__}: {e}")
    return wrapper


# ---- engine options shared by generate / chat / bench ----
Target = Annotated[Optional[str], typer.Option("--target", "-t", help="Target model: HF id, local folder or embedded alias (see `cure models`). Default: the embedded default.")]
Draft = Annotated[Optional[str], typer.Option("--draft", "-d", help="Block-parallel drafter (or AR draft with --drafter ar): HF id, folder or alias.")]
DrafterKind = Annotated[str, typer.Option("--drafter", help="Drafter kind: auto (from the checkpoint's config), pard, dflash, ar.")]
MaskTokenId = Annotated[Optional[int], typer.Option("--mask-token-id", help="PARD mask token id (default: the checkpoint's pard_token).")]
Strategy = Annotated[str, typer.Option("--strategy", "-s", help="ar | sd | parallel | cure | ddtree")]
MaxNew = Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens to generate at most.")]
Temperature = Annotated[float, typer.Option("--temperature", help="0 = greedy (identical to ar); > 0 samples losslessly.")]
Seed = Annotated[int, typer.Option("--seed", help="Sampling seed (temperature > 0).")]
K = Annotated[Optional[int], typer.Option("--k", help="Block size K: the root plus K-1 drafted tokens. Default: the drafter's trained block size (DFlash), else 16.")]
TauMargin = Annotated[float, typer.Option("--tau-margin", help="UFP gate: draft top1-top2 log-prob margin below this.")]
BMax = Annotated[int, typer.Option("--b-max", help="Repair branches at the most uncertain UFP.")]
VMax = Annotated[str, typer.Option("--v-max", help="Tree node budget V_max, or 'auto': measure the target's verification cost curve and pick the budget that maximises expected tokens/s (64 is then the ceiling).")]
Device = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:1, mps ...")]
DType = Annotated[str, typer.Option("--dtype", help="float32 (lossless check), float16, bfloat16.")]
KVCache = Annotated[str, typer.Option("--kv-cache", help="static: preallocated K/V rows compacted in place (fast) | dynamic: transformers' DynamicCache. Never changes the output.")]
Compile = Annotated[bool, typer.Option("--compile", help="torch.compile the target forward over padded static shapes (CUDA graphs on a GPU). First blocks are slow while it compiles.")]
Kernels = Annotated[str, typer.Option("--kernels", help="CPU float32 matmuls: packed = oneDNN packs every weight once at load, so verifying N nodes costs far less than N one-token steps | eager = torch's default | auto = packed where it applies (CPU, float32, not --compile). Never changes the output.")]
DraftVocabN = Annotated[str, typer.Option("--draft-vocab", metavar="N|auto", help="Causal drafters (PARD, AR, --ar-draft) propose only token ids < N plus the prompt's and output's, so their head costs a fraction of the full vocabulary's (1.5B target, 0.5B AR draft, CPU: sd 1.55x -> 1.69x ar). 0 = the whole vocabulary; auto = 16384 on a CPU, 0 elsewhere (a GPU's head is cheap). DFlash drafters use the vocabulary saved in their checkpoint. Never changes the output.")]
DeviceMap = Annotated[Optional[str], typer.Option("--device-map", help="Passed to accelerate (e.g. auto) for targets larger than one device.")]


def parse_v_max(v_max: str | int) -> tuple[int, bool]:
    """--v-max N -> (N, False); --v-max auto -> (64 as the ceiling, True)."""
    text = str(v_max).strip().lower()
    if text == "auto":
        return 64, True
    try:
        return int(text), False
    except ValueError:
        raise ConfigError(f"--v-max must be a number or 'auto', got {v_max!r}") from None


def drafter_block_size(pair) -> int | None:
    """The block size a drafter was trained for (DFlash checkpoints record it), if any."""
    size = getattr(pair.drafter, "block_size", None)
    return int(size) if size else None


def decode_config(strategy: str, max_new_tokens: int, temperature: float, seed: int, k: int | None,
                  tau_margin: float, b_max: int, v_max: str | int, *, kv_cache: str = "static",
                  compile: bool = False) -> DecodeConfig:
    k = 16 if k is None else k
    v, auto = parse_v_max(v_max)
    return DecodeConfig(strategy=strategy, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                        k=k, tau_margin=tau_margin, b_max=b_max, b_min=min(1, b_max), v_max=max(v, k - 1) if auto else v,
                        auto_budget=auto, top_k=max(8, b_max + 1), kv_cache=kv_cache, compile=compile)


def load_kernels(kernels: str, compile: bool) -> str:
    """--kernels for load_pair: torch.compile cannot trace packed layers (inductor packs on its own), so
    --compile turns auto into eager and refuses packed."""
    if compile and kernels == "packed":
        raise ConfigError("--kernels packed does not combine with --compile (inductor packs weights itself); "
                          "use --kernels auto or eager")
    return "eager" if compile and kernels == "auto" else kernels


CPU_DRAFT_VOCAB = 16384     # ids < 16384 hold 91-92% of Qwen2.5-Coder's greedy HumanEval tokens


def resolve_draft_vocab(draft_vocab: str, device: str, device_map: str | None = None) -> int:
    """--draft-vocab for load_pair. Rule: auto restricts causal drafters' heads on a CPU only, where the
    head is a quarter of a 0.5B draft step; on a GPU it costs little and the lost ids would cost tau."""
    if draft_vocab == "auto":
        return CPU_DRAFT_VOCAB if device == "cpu" and not device_map else 0
    try:
        n = int(draft_vocab)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"--draft-vocab takes a number of ids (0: the whole vocabulary) or auto, got {draft_vocab!r}")
    return n


def quiet_transformers() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging
        logging.set_verbosity_error()
        logging.disable_progress_bar()
    except Exception:  # noqa: BLE001
        pass


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


class LoggedProgress(Progress):
    """rich Progress that also works in a log file: when its console is not a terminal (nohup, CI,
    a pipe) bars are never drawn, so it prints one plain line per task every `every` seconds and
    when a task completes."""

    def __init__(self, *columns, every: float = 30.0, **kwargs):
        super().__init__(*columns, **kwargs)
        self.every = every
        self._logged: dict = {}                   # task id -> monotonic time of its last line

    def update(self, task_id, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._log(task_id)

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def log_extra(self) -> str:
        """More text for the plain lines (subclasses: running stats)."""
        return ""

    def _log(self, task_id) -> None:
        if self.console.is_terminal:
            return
        task = self._tasks[task_id]
        now = time.monotonic()
        done = task.total is not None and task.completed >= task.total
        last = self._logged.get(task_id)
        if last == "done" or (not done and last is not None and now - last < self.every):
            return
        self._logged[task_id] = "done" if done else now
        total = "?" if task.total is None else f"{task.total:g}"
        info = " ".join(x for x in (str(task.fields.get("info", "")).strip(), self.log_extra()) if x)
        self.console.print(f"{task.description}: {task.completed:g}/{total} "
                           f"[{time.strftime('%H:%M:%S')}, {task.elapsed or 0:.0f}s]"
                           + (f" {info}" if info else ""), highlight=False, markup=False)
