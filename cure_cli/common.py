"""Shared CLI pieces: the error boundary, progress that logs, quiet transformers."""
from __future__ import annotations

import functools
import os
import signal
import sys
import time
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.progress import DownloadColumn, MofNCompleteColumn, Progress, ProgressColumn
from rich.text import Text

from cure_core.errors import CureError

from .options import with_flags

err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt():
    """Inside the block, `kill` (SIGTERM) interrupts like Ctrl+C, so long work keeps what it finished; the
    previous handler comes back after (a command run in-process, as tests do, must not leave it behind).
    Off the main thread signals cannot be handled: the block runs unchanged."""
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def friendly_errors(fn):
    """Turn user errors into one clear line and a non-zero exit; never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CureError as e:
            fail(with_flags(str(e)))
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            raise typer.Exit(130)
        except (OSError, ValueError) as e:
            if os.environ.get("CURE_DEBUG"):
                raise
            fail(with_flags(f"{type(e).__name__}: {e}"))
    return wrapper


class _Count(ProgressColumn):
    """done/total of a phase: bytes as sizes, steps as N/M, nothing while the total is unknown."""

    def render(self, task) -> Text:
        if task.total is None:
            return Text("")
        column = DownloadColumn() if task.fields.get("unit") == "bytes" else MofNCompleteColumn()
        return column.render(task)


class PhaseLines:
    """cure_core.progress phases on stderr: one line as each phase starts, and a transient progress bar
    while it runs (bytes or steps when the phase knows its total, else a pulse with the elapsed time).
    One rich Progress for every open phase (rich allows one live display at a time)."""

    def __init__(self, console: Console = err_console):
        self.console = console
        self.bar: Progress | None = None
        self.open = 0

    def start(self, name: str, total: float | None, unit: str) -> object:
        from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        self.console.print(f"{name}…", highlight=False, soft_wrap=True, markup=False)
        if not self.console.is_terminal:
            return None                                        # a log or a pipe: the line alone
        if self.bar is None:
            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), _Count(),
                                TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
        self.open += 1
        short = name.split(":")[0].split(" (")[0]          # the bar's label: the phase without its details
        return self.bar.add_task(short, total=total, unit=unit)

    def update(self, handle, done: float, total: float | None) -> None:
        if self.bar is not None and handle is not None:
            self.bar.update(handle, completed=done, **({"total": total} if total is not None else {}))

    def end(self, handle) -> None:
        if self.bar is None or handle is None:
            return
        self.bar.remove_task(handle)
        self.open -= 1
        if not self.open:
            self.bar.stop()
            self.bar = None


def phase_lines():
    """Show the core's long phases (first-run conversion, loading, the cost curve) for a block of code."""
    from cure_core.progress import reporting
    return reporting(PhaseLines())


def open_models(args, strategies=None):
    """cure_core.api.open_pair with its long phases shown (first-run conversion, loading) and the budget
    tuner's cost curve measured before decoding starts (--v-max auto), then the notes and warnings."""
    from cure_core.api import open_pair
    with phase_lines():
        loaded = open_pair(args, strategies)
        loaded.engine.tuner_for(loaded.config)
    show_notes(loaded)
    return loaded


def show_notes(loaded) -> None:
    """What open_pair's defaults changed (notes) and choices that will cost speed (warnings), one line each."""
    for note in loaded.notes:
        err_console.print(f"[yellow]note:[/] {note}", highlight=False)
    for warning in loaded.warnings:
        err_console.print(f"[bold yellow]warning:[/] {with_flags(warning)}", highlight=False, soft_wrap=True)


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
