"""Long phases (assembling, converting, loading, measuring), reported without printing.

    with phase("checking the sha256 of qwen-coder-0.5b", total=size, unit="bytes") as update:
        for chunk in ...:
            update(done)

The core never prints: whoever wants to show phases installs a `Reporter` for a block of code
(`with reporting(r): ...`; the CLI's draws one line and a progress bar per phase on stderr,
cure_cli/common.py `phase_lines`). With none installed a phase costs nothing. The reporter lives in a
context variable, so a worker thread (the chat's engine) reports to nobody unless it installs one.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterator, Protocol

Update = Callable[..., None]          # update(done, total=None): the phase's progress so far


class Reporter(Protocol):
    def start(self, name: str, total: float | None, unit: str) -> object:
        """A phase begins (total None: unknown length); returns a handle for update/end."""

    def update(self, handle: object, done: float, total: float | None) -> None: ...

    def end(self, handle: object) -> None: ...


_reporter: ContextVar[Reporter | None] = ContextVar("cure_progress_reporter", default=None)


def _ignore(done: float, total: float | None = None) -> None:
    return None


@contextlib.contextmanager
def phase(name: str, total: float | None = None, unit: str = "steps") -> Iterator[Update]:
    """One long phase. `unit`: "bytes" or "steps" (how the reporter shows done/total)."""
    reporter = _reporter.get()
    if reporter is None:
        yield _ignore
        return
    handle = reporter.start(name, total, unit)

    def update(done: float, total: float | None = None) -> None:
        reporter.update(handle, done, total)
    try:
        yield update
    finally:
        reporter.end(handle)


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Report every phase inside the block to `reporter`."""
    token = _reporter.set(reporter)
    try:
        yield
    finally:
        _reporter.reset(token)
