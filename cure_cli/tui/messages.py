"""Messages the engine worker thread posts to the chat app.

Blocks themselves travel through a lock-protected buffer (`BlockBuffer`); the worker only posts a
`BlocksReady` tick, which is replaceable: however fast blocks arrive, the UI queue never holds more
than one pending tick per turn and each repaint drains everything that arrived.
"""
from __future__ import annotations

import threading

from textual.message import Message

from cure_core.block import Block
from cure_core.config import DecodeConfig


class BlockBuffer:
    """Blocks produced by the worker, not yet drawn by the UI."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[int, Block]] = []

    def put(self, turn: int, block: Block) -> None:
        with self._lock:
            self._items.append((turn, block))

    def drain(self) -> list[tuple[int, Block]]:
        with self._lock:
            items, self._items = self._items, []
        return items


class TurnStarted(Message):
    """A generation began: the prompt ids and the config it really runs with."""

    def __init__(self, turn: int, prompt_ids: list[int], cfg: DecodeConfig) -> None:
        super().__init__()
        self.turn = turn
        self.prompt_ids = prompt_ids
        self.cfg = cfg


class BlocksReady(Message):
    """High-rate tick: new blocks wait in the buffer. A newer tick for the same turn replaces it."""

    def __init__(self, turn: int) -> None:
        super().__init__()
        self.turn = turn

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, BlocksReady) and message.turn == self.turn


class TurnFinished(Message):
    """A generation ended: "done", "stopped" (by the user) or "error" (with a one-line message)."""

    def __init__(self, turn: int, reason: str, error: str | None = None) -> None:
        super().__init__()
        self.turn = turn
        self.reason = reason
        self.error = error


class CalibrationDone(Message):
    """An AR calibration finished: AR tokens/s (None if unknown) or an error line; `turn`: the turn it ran
    right after (None: not after a turn)."""

    def __init__(self, ar_tps: float | None, error: str | None = None, turn: int | None = None) -> None:
        super().__init__()
        self.ar_tps = ar_tps
        self.error = error
        self.turn = turn


class CompareProgress(Message):
    """High-rate tick of a comparison re-run: `tokens` emitted so far (replaceable)."""

    def __init__(self, turn: int, tokens: int) -> None:
        super().__init__()
        self.turn = turn
        self.tokens = tokens

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, CompareProgress) and message.turn == self.turn


class CompareFinished(Message):
    """A comparison re-run ended: its blocks, and "done" / "stopped" / "error" (with a one-line message)."""

    def __init__(self, turn: int, blocks: list[Block], reason: str, error: str | None = None) -> None:
        super().__init__()
        self.turn = turn
        self.blocks = blocks
        self.reason = reason
        self.error = error
