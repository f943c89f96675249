"""Snapshot tests (pytest-textual-snapshot) of the TUI, from the checked-in sample trace only: no model
runs, and every number on screen comes from the trace, so the pictures are deterministic.

Update after an intended visual change:  python -m pytest tests/test_tui_snapshots.py --snapshot-update
"""
from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input

from cure_core.config import DecodeConfig
from cure_core.tiny import byte_tokenizer
from cure_core.trace import read_trace
from cure_cli.tui.app_chat import ChatApp
from cure_cli.tui.app_inspect import InspectApp
from cure_cli.tui.engine_protocol import ReplayEngine

SAMPLE = Path(__file__).parent / "data" / "sample_trace.jsonl"


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def chat_app(tok) -> ChatApp:
    engine = ReplayEngine(read_trace(SAMPLE), tok)
    return ChatApp(engine, engine.check(DecodeConfig()), baseline_tps=3.0, cursor_blink=False)


async def one_answer(pilot) -> None:
    app = pilot.app
    app.query_one("#prompt", Input).value = "Hello there"
    await pilot.press("enter")
    while app.generating:
        await pilot.pause(0.02)
    await app.workers.wait_for_complete()
    await pilot.pause()


def test_chat_after_one_answer(snap_compare, tok):
    async def run_before(pilot):
        await one_answer(pilot)
        await pilot.press(*["ctrl+up"] * 6)          # select block 15 (a repair win): tree, margins, stats follow
        await pilot.press("ctrl+b")                  # the answer coloured by origin, the selected block reversed
    assert snap_compare(chat_app(tok), terminal_size=(80, 24), run_before=run_before)


def test_chat_after_one_answer_large_with_help(snap_compare, tok):
    async def run_before(pilot):
        await one_answer(pilot)
        await pilot.press("ctrl+up", "f1")             # block 20, then the key list over it
    assert snap_compare(chat_app(tok), terminal_size=(140, 40), run_before=run_before)


def test_inspect_repair_win(snap_compare, tok):
    app = InspectApp(read_trace(SAMPLE), tok, source=str(SAMPLE))
    assert snap_compare(app, terminal_size=(80, 24), press=["r"])      # first block where a repair branch won


def test_inspect_large(snap_compare, tok):
    app = InspectApp(read_trace(SAMPLE), tok, source=str(SAMPLE))
    assert snap_compare(app, terminal_size=(140, 40), press=["r", "r"])
