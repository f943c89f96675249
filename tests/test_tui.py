"""The Textual TUI (`cure chat`, `cure inspect`) driven through App.run_test() and Pilot.

Two engines feed the chat app: the real Engine over tiny in-process models, and a ReplayEngine over
the checked-in trace tests/data/sample_trace.jsonl (22 blocks of a tiny cure run; repair wins at
blocks 8, 10, 12, 15). No test needs a terminal or a download.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path

import pytest
import typer
from rich.text import Text
from textual.widgets import Input, Static
from typer.testing import CliRunner

from cure_core.config import DecodeConfig
from cure_core.drafters.causal import PardDrafter
from cure_core.engine import Engine, GenerationError, ModelPair
from cure_core.models import LoadedPair, encode_prompt
from cure_core.tiny import BYTE_VOCAB, EOS_ID, MASK_ID, byte_tokenizer
from cure_core.trace import Trace, read_trace
from cure_cli.chat_cmd import chat as chat_command
from cure_cli.inspect_cmd import inspect as inspect_command
from cure_cli.tui.app_chat import ChatApp, SettingsScreen
from cure_cli.tui.app_inspect import InspectApp
from cure_cli.tui.engine_protocol import ChatEngine, ModelEngine, ReplayEngine
from cure_cli.tui.messages import BlocksReady
from cure_cli.tui.tokens import TokenText
from cure_cli.tui.widgets import (HelpScreen, JumpScreen, MarginsChart, RepairTree, StatsPanel, render_margins,
                                  render_tree, stats_view)

SAMPLE = Path(__file__).parent / "data" / "sample_trace.jsonl"
REPAIR_WINS = [8, 10, 12, 15]

pytestmark = pytest.mark.anyio          # async tests run on asyncio through anyio's pytest plugin


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def sample():
    return read_trace(SAMPLE)


@pytest.fixture
def tiny_engine(target, drafts, tok):
    """The real Engine over tiny in-process models, as `cure chat` wires it (fresh drafter state)."""
    pair = ModelPair(target=target, drafter=PardDrafter(drafts["mild"], MASK_ID, vocab_size=BYTE_VOCAB),
                     eos_ids=(EOS_ID, 258), names={"target": "tiny-target", "draft": "tiny-draft"})
    return ModelEngine(LoadedPair(pair=pair, tokenizer=tok, drafter_kind="pard"))


def plain(widget: Static) -> str:
    content = widget.render()
    return content.plain if hasattr(content, "plain") else str(content)


async def wait_until(pilot, cond, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)


async def ask(pilot, app: ChatApp, text: str) -> None:
    await pilot.click("#prompt")
    app.query_one("#prompt", Input).value = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: not app.generating)
    await app.workers.wait_for_complete()
    await pilot.pause()


def tree_text(app) -> str:
    return plain(app.query_one("#tree-body", Static))


# ---- chat: replay engine ---------------------------------------------------------------------------

def test_replay_engine_is_a_chat_engine(sample, tok):
    engine = ReplayEngine(sample, tok)
    assert isinstance(engine, ChatEngine)
    assert engine.check(DecodeConfig()).k == 8          # the recorded config, not the default
    assert [b.index for b in engine.stream([{"role": "user", "content": "x"}], DecodeConfig())] == list(range(22))


async def test_chat_replay_streams_text_and_draws_tree(sample, tok):
    engine = ReplayEngine(sample, tok)
    app = ChatApp(engine, engine.check(DecodeConfig()), baseline_tps=3.0, cursor_blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await ask(pilot, app, "hello")
        turn = app.turns[0]
        assert turn.status == "done" and len(turn.blocks) == 22
        ids = [t for b in sample.blocks for t in b.emitted]
        shown = plain(turn.view.answer)
        assert shown.startswith(engine.tokens.display(ids))          # every token streamed, in order
        assert "[cure · 40 tokens · 22 blocks]" in plain(turn.view.note)
        assert turn.view.markdown.source == turn.answer.text          # the Markdown view: the whole answer
        # the tree, margins and stats follow the latest block
        assert app.query_one(RepairTree).block is sample.blocks[-1]
        assert "block 21" in tree_text(app) and "no draft tree" in tree_text(app)   # max_new_tokens: no room
        assert app.query_one(MarginsChart).block is sample.blocks[-1]
        assert app.query_one(MarginsChart).tau == 1.0
        stats = app.query_one(StatsPanel).render().plain
        assert "tok/s" in stats and "vs AR" in stats and "AR 3.0 tok/s" in stats
        # the history holds both sides of the turn; the answer keeps colours by origin
        assert [m["role"] for m in app.messages] == ["user", "assistant"]
        styles = {str(span.style) for span in turn.answer.render().spans}
        assert any("magenta" in s for s in styles) and any("cyan" in s for s in styles)
        # select an older block: the tree follows, then back to the latest
        await pilot.press("ctrl+up", "ctrl+up")
        assert app.selected == 19 and app.query_one(RepairTree).block is sample.blocks[19]
        assert "block 19" in tree_text(app) and "b0" in tree_text(app) and "r1" in tree_text(app)
        await pilot.press("ctrl+l")
        assert app.selected is None and app.query_one(RepairTree).block is sample.blocks[-1]
        # clicking a token (answers coloured by origin: ctrl+b) selects its block
        await pilot.press("ctrl+b")
        await pilot.click(turn.view.answer, offset=(0, 0))
        assert app.selected == 0 and app.query_one(RepairTree).block is sample.blocks[0]
        app.action_select_block(REPAIR_WINS[0])
        await pilot.pause()
        assert "★r" in tree_text(app) and "vs b0" in tree_text(app)


async def test_chat_save_trace_roundtrips(sample, tok, tmp_path):
    engine = ReplayEngine(sample, tok)
    out = tmp_path / "session.jsonl"
    app = ChatApp(engine, engine.check(DecodeConfig()), baseline_tps=3.0, save_path=out, cursor_blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+s")                                   # nothing yet: a warning, no file
        assert not out.exists()
        await ask(pilot, app, "first")
        await ask(pilot, app, "second")
        await pilot.press("ctrl+s")
        await pilot.pause()
    trace = read_trace(out)
    assert [g.prompt for g in trace.generations] == ["first", "second"]
    assert len(trace.blocks) == 44 and trace.footer["status"] == "complete"
    assert trace.blocks[5] == sample.blocks[5]
    assert trace.generations[0].prompt_ids == sample.generations[0].prompt_ids


class GatedReplay(ReplayEngine):
    """Replays, but holds the worker after the 2nd block until the test opens the gate: the stop key
    is then pressed while the answer is certainly still running."""

    def stream(self, messages, cfg):
        self.gate = threading.Event()
        for i, block in enumerate(super().stream(messages, cfg)):
            if i == 2:
                self.gate.wait(10)
            yield block


async def test_chat_stop_mid_answer(sample, tok):
    engine = GatedReplay(sample, tok)
    app = ChatApp(engine, engine.check(DecodeConfig()), baseline_tps=3.0, cursor_blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        for turn_no, key in enumerate(("escape", "ctrl+c")):
            await pilot.click("#prompt")
            app.query_one("#prompt", Input).value = f"question {turn_no}"
            await pilot.press("enter")
            await wait_until(pilot, lambda: len(app.turns[turn_no].blocks) >= 2)
            await pilot.press(key)
            engine.gate.set()
            await wait_until(pilot, lambda: not app.generating)
            turn = app.turns[turn_no]
            assert turn.status == "stopped" and len(turn.blocks) == 3
            assert "[stopped · " in plain(turn.view.note)
            assert app.messages[-1]["role"] == "assistant"          # the partial answer stays in the history
        assert len(app.messages) == 4 and app.is_running


# ---- chat: the real engine on tiny models --------------------------------------------------------

async def test_chat_real_engine_tiny_models(tiny_engine, tok):
    cfg = DecodeConfig.of(k=4, max_new_tokens=10, v_max=24)
    app = ChatApp(tiny_engine, cfg, calibrate_tokens=2, cursor_blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await ask(pilot, app, "hi")
        await wait_until(pilot, lambda: app.ar_tps is not None)        # the AR run right after the answer
        turn = app.turns[0]
        assert turn.status == "done" and turn.blocks
        out = [t for b in turn.blocks for t in b.emitted]
        assert len(out) == 10
        # lossless: the same tokens as plain AR decoding of the same prompt
        ar_blocks = Engine(tiny_engine.pair, cfg.with_(strategy="ar")).generate(turn.prompt_ids)
        assert out == [t for b in ar_blocks for t in b.emitted]
        assert turn.prompt_ids == encode_prompt(tok, "hi", True)
        assert app.query_one(RepairTree).block is turn.blocks[-1]
        assert f"block {len(turn.blocks) - 1}" in tree_text(app)
        assert turn.ar_tps == app.ar_tps and "vs AR f32" in app.query_one(StatsPanel).render().plain
        # a second turn goes through the chat template with the first answer in the history
        await ask(pilot, app, "more")
        second = app.turns[1]
        assert second.status == "done"
        history = [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": tok.decode(out, skip_special_tokens=True)}]
        assert second.prompt_ids == encode_prompt(tok, "more", True, history=history)


async def test_chat_errors_are_shown_not_raised(target, drafts, tok):
    pair = ModelPair(target=target, drafter=PardDrafter(drafts["mild"], MASK_ID, vocab_size=BYTE_VOCAB),
                     max_context=8, names={"target": "tiny"})
    engine = ModelEngine(LoadedPair(pair=pair, tokenizer=tok, drafter_kind="pard"))
    app = ChatApp(engine, DecodeConfig.of(k=4, max_new_tokens=4, v_max=24), calibrate_tokens=0, cursor_blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await ask(pilot, app, "a prompt longer than eight tokens")
        turn = app.turns[0]
        assert turn.status == "error"
        assert "error: the prompt is" in plain(turn.view.note)
        assert app.messages == []                                     # the failed question left the history
        assert app.is_running


class BrokenEngine(ReplayEngine):
    def stream(self, messages, cfg):
        yield self.generations[0].blocks[0]
        raise GenerationError("the drafter fell over")


async def test_chat_error_mid_stream_keeps_partial_answer(sample, tok):
    engine = BrokenEngine(sample, tok)
    app = ChatApp(engine, DecodeConfig.of(k=8), baseline_tps=1.0, cursor_blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await ask(pilot, app, "x")
        assert app.turns[0].status == "error" and len(app.turns[0].blocks) == 1
        assert "error: the drafter fell over" in plain(app.turns[0].view.note)


async def test_settings_validate_and_apply(sample, tok):
    engine = ReplayEngine(sample, tok)
    app = ChatApp(engine, DecodeConfig.of(k=8), baseline_tps=1.0, cursor_blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f2")
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        screen.query_one("#set-vmax", Input).value = "3"             # smaller than K-1: invalid
        await pilot.click("#settings-apply")
        assert app.screen is screen
        assert "v_max=3" in plain(screen.query_one("#settings-error", Static))
        screen.query_one("#set-vmax", Input).value = "32"
        screen.query_one("#set-k", Input).value = "6"
        screen.query_one("#set-tau", Input).value = "0.5"
        screen.query_one("#set-bmax", Input).value = "3"
        screen.query_one("#set-bmax", Input).focus()
        await pilot.press("enter")                                    # Enter in a field applies too
        assert not isinstance(app.screen, SettingsScreen)
        assert (app.cfg.k, app.cfg.paper.tau_margin, app.cfg.paper.b_max, app.cfg.v_max) == (6, 0.5, 3, 32)
        assert not app.cfg.auto_budget
        await pilot.press("f2")
        app.screen.query_one("#set-vmax", Input).value = "auto"          # cost-aware budget, as --v-max auto
        app.screen.query_one("#set-vmax", Input).focus()
        await pilot.press("enter")
        assert app.cfg.auto_budget and app.cfg.v_max == 64
        await pilot.press("ctrl+t")                                   # next strategy
        assert app.cfg.strategy == "ddtree"


async def test_help_screen_lists_bindings(sample, tok):
    engine = ReplayEngine(sample, tok)
    app = ChatApp(engine, DecodeConfig.of(k=8), baseline_tps=1.0, cursor_blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        text = plain(app.screen.query_one(Static))
        assert "ctrl+s" in text and "Stop" in text and "branch 0" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("s", "l", "question_mark")                  # typed into the prompt, not bindings
        assert app.query_one("#prompt", Input).value == "sl?" and not isinstance(app.screen, HelpScreen)
        assert not app._notifications
        await pilot.press("escape")                                   # idle: leave the input; `?` then works
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)


def test_blocks_ready_ticks_coalesce():
    assert BlocksReady(1).can_replace(BlocksReady(1))
    assert not BlocksReady(1).can_replace(BlocksReady(2))


# ---- inspect -------------------------------------------------------------------------------------

async def test_inspect_navigation(sample, tok):
    app = InspectApp(sample, tok)
    async with app.run_test(size=(80, 24)) as pilot:
        tree = app.query_one(RepairTree)
        assert app.current == 0 and tree.block is sample.blocks[0]
        await pilot.press("n", "n")
        assert app.current == 2 and tree.block is sample.blocks[2] and "block 2" in tree_text(app)
        await pilot.press("p")
        assert app.current == 1
        await pilot.press("end")
        assert app.current == 21 and tree.block is sample.blocks[21]
        await pilot.press("n")                                        # stays on the last block
        assert app.current == 21
        await pilot.press("home")
        assert app.current == 0
        for expected in REPAIR_WINS:
            await pilot.press("r")
            assert app.current == expected and tree.block.repair_won
            assert "vs b0" in tree_text(app)
        await pilot.press("r")                                        # none later: stays put
        assert app.current == REPAIR_WINS[-1]
        await pilot.press("R")
        assert app.current == REPAIR_WINS[-2]
        await pilot.press("b")
        assert isinstance(app.screen, JumpScreen)
        await pilot.press("9", "9", "enter")                          # out of range: an error, not a crash
        assert isinstance(app.screen, JumpScreen)
        assert "no block 99" in plain(app.screen.query_one("#jump-error"))
        app.screen.query_one(Input).value = ""
        await pilot.press("5", "enter")
        assert app.current == 5 and tree.block is sample.blocks[5]
        # the text so far ends with the current block, highlighted
        text = app.query_one("#text", Static).render()
        stream = TokenText(tok).stream()         # (a multi-byte character still open at the cut shows later)
        assert text.plain.endswith("".join(stream.push(t) for b in sample.blocks[:6] for t in b.emitted))
        assert "block 5 of 22" in plain(app.query_one("#info", Static))
        assert app.query_one(MarginsChart).block is sample.blocks[5]


def test_a_trace_names_the_dtype_its_ar_ran_in(sample, tok):
    """inspect's and a replay's "vs AR" name the dtype the trace's header records; older traces say none."""
    assert ReplayEngine(sample, tok).ar_dtype is None and InspectApp(sample, tok).ar_dtype is None
    for dtype, short in (("float32", "f32"), ("int8", "int8")):
        traced = Trace({**sample.header, "dtype": dtype}, sample.generations, sample.footer)
        assert ReplayEngine(traced, tok).ar_dtype == dtype and InspectApp(traced, tok).ar_dtype == dtype
        view = stats_view(traced.generations[0].blocks, None, [], 10.0, ar_dtype=dtype)
        assert f"vs AR {short}" in [label for label, _ in view.items]


async def test_inspect_without_tokenizer_shows_ids(sample):
    app = InspectApp(sample, None)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("n")
        block = sample.blocks[1]
        assert f"root <{block.root}>" in tree_text(app)
        assert f"<{block.emitted[0]}>" in app.query_one("#text", Static).render().plain


# ---- rendering helpers -------------------------------------------------------------------------

def test_tokens_are_readable_escaped_text(tok):
    tt = TokenText(tok)
    ids = list("é x\n".encode()) + [0x9A, 258]
    assert [tt.label(i) for i in ids] == ["\\xc3", "\\xa9", "␣", "x", "\\n", "\\x9a", "<|im_end|>"]
    assert tt.display(ids) == "é x\n\\x9a"      # multi-byte joined, invalid byte escaped, special dropped
    assert TokenText(None).label(42) == "<42>"


def test_tree_and_margins_render_without_colour(sample, tok):
    tt = TokenText(tok)
    block = sample.blocks[REPAIR_WINS[0]]
    text = render_tree(block, tt).plain
    assert "✓" in text and "✗" in text and "★r" in text and "◆" in text
    assert f"UFP d{block.ufps[0].position + 1}" in text
    ar = sample.blocks[0].__class__(**{**sample.blocks[0].__dict__, "nodes": (), "accepted": (), "draft": (),
                                        "margins": (), "ufps": (), "strategy": "ar"})
    assert "no draft tree" in render_tree(ar, tt).plain
    assert "re-draft pass skipped" not in text
    skipped = dataclasses.replace(block, meta={"v_max": 4, "redraft": "skipped"})   # the tuner skipped the pass
    assert "re-draft pass skipped: at V 4" in render_tree(skipped, tt).plain
    fixed = dataclasses.replace(block, meta={"redraft": "skipped"})                 # a fixed budget skipped it
    assert "re-draft pass skipped: at this budget" in render_tree(fixed, tt).plain
    chart = render_margins(block, 1.0, 38, 4).plain
    assert "τ" in chart and "▲" in chart
    assert "ar: no draft margins" in render_margins(ar, 1.0, 38, 4).plain
    assert isinstance(render_tree(None, tt), Text)


# ---- the commands: errors are one clear line, never a traceback --------------------------------

cli = typer.Typer(pretty_exceptions_enable=False)     # just these two commands (as cure_cli.main registers them)
cli.command("chat")(chat_command)
cli.command("inspect")(inspect_command)


def _run(args):
    result = CliRunner().invoke(cli, args)
    return result, result.output          # stdout and stderr together


@pytest.mark.parametrize("content, message", [
    (None, "trace file not found"),
    ("not json at all\n", "corrupt trace line"),
    ('{"type":"header","schema":1,"models":{},"config":{}}\n', "truncated"),
    ('{"type":"header","schema":99,"models":{},"config":{}}\n', "newer cure"),
])
def test_inspect_bad_trace_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "t.jsonl"
    if content is not None:
        path.write_text(content)
    result, out = _run(["inspect", str(path)])
    assert result.exit_code == 2
    assert message in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1                       # one line


def test_inspect_and_chat_need_a_terminal():
    result, out = _run(["inspect", str(SAMPLE)])
    assert result.exit_code == 2 and "needs a terminal" in out
    result, out = _run(["inspect", str(SAMPLE), "--block", "99"])
    assert result.exit_code == 2 and "out of range" in out
    result, out = _run(["chat", "--replay", str(SAMPLE.with_name("missing.jsonl"))])
    assert result.exit_code == 2 and "trace file not found" in out and "Traceback" not in out


def test_sample_trace_is_small_and_current(sample):
    assert 15 <= len(sample.blocks) <= 30 and sample.footer["status"] == "complete"
    assert [i for i, b in enumerate(sample.blocks) if b.repair_won] == REPAIR_WINS
    header = json.loads(SAMPLE.read_text().splitlines()[0])
    assert header["config"]["strategy"] == "cure"


def test_the_chat_sd_drafter_shares_the_pard_drafters_vocabulary(target, drafts, tok):
    """A PARD drafter doubles as the sd chain drafter (the factory builds it): with the same draft vocabulary."""
    from cure_core.models import build_pair
    pair, kind = build_pair(target, drafts["mild"], drafter="pard", mask_token_id=MASK_ID, vocab_size=BYTE_VOCAB,
                            draft_vocab=100)
    engine = ModelEngine(LoadedPair(pair=pair, tokenizer=tok, drafter_kind=kind))
    assert engine.pair.ar_drafter.vocab.fixed == list(range(100))
    assert engine.pair.ar_drafter.model is engine.pair.drafter.model             # loaded once
    plain_pair, _ = build_pair(target, drafts["mild"], drafter="pard", mask_token_id=MASK_ID, vocab_size=BYTE_VOCAB)
    assert ModelEngine(LoadedPair(pair=plain_pair, tokenizer=tok, drafter_kind="pard")).pair.ar_drafter.vocab is None
