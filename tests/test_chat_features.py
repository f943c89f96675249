"""`cure chat` features of issue 16, driven through Pilot: the cross-turn cache (prefill per turn, edits,
strategy switches), saved sessions (resume, list, export, atomic saves), Markdown answers with the origin
toggle, compare in place, and the honest empty tree. Tiny in-process models; no terminal, no download."""
from __future__ import annotations

import dataclasses
import io
import os

import pytest
from rich.console import Console
from textual.widgets import Input, Static
from textual.widgets._markdown import MarkdownFence, MarkdownHeader
from typer.testing import CliRunner

from cure_core import engine as engine_module
from cure_core.budget import CostCurve
from cure_core.config import DecodeConfig
from cure_core.engine import Engine
from cure_core.trace import read_trace
from cure_cli.chat_sessions import ChatSession, TurnRecord, find_session, list_sessions, to_markdown
from cure_cli.tui import app_chat
from cure_cli.tui.app_chat import ChatApp
from cure_cli.tui.engine_protocol import ModelEngine, ReplayEngine
from cure_cli.tui.widgets import StatsPanel

from test_tui import SAMPLE, anyio_backend, tiny_engine, tok, wait_until  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio


CFG = DecodeConfig.of(k=4, max_new_tokens=12, v_max=24)


def plain(widget: Static) -> str:
    """A Static's text, whatever it holds (Text, or a rich renderable such as the comparison's table)."""
    content = widget.content
    if hasattr(content, "plain"):
        return content.plain
    console = Console(width=100, file=io.StringIO(), color_system=None)
    with console.capture() as cap:
        console.print(content)
    return cap.get()


async def settle(pilot, app) -> None:
    await wait_until(pilot, lambda: not app.generating)
    await app.workers.wait_for_complete()
    await pilot.pause()


async def ask(pilot, app: ChatApp, text: str) -> None:
    app.query_one("#prompt", Input).focus()
    app.query_one("#prompt", Input).value = text
    await pilot.press("enter")
    await settle(pilot, app)


def fresh_output(engine: ModelEngine, turn) -> list[int]:
    """The same prompt ids decoded by a new Engine: a full prefill, nothing cached."""
    return [t for b in Engine(engine.pair).generate(turn.prompt_ids, turn.cfg) for t in b.emitted]


# ---- 2. the cross-turn cache -------------------------------------------------------------------

async def test_turns_prefill_only_their_new_tokens(tiny_engine):
    app = ChatApp(tiny_engine, CFG, calibrate_tokens=0, cursor_blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        for text in ("hi", "and then?", "once more"):
            await ask(pilot, app, text)
        t1, t2, t3 = app.turns
        for turn in (t1, t2, t3):
            assert turn.status == "done" and turn.token_ids == fresh_output(tiny_engine, turn)
        assert t1.blocks[0].timings.reused_tokens == 0
        # turn 3 prefills only what the caches do not hold: they hold turn 2's prompt and answer (but the
        # answer's last token, never committed), so the prompt is reused up to where it differs from them.
        # (The tiny model's answers are random bytes whose text re-encodes differently: the cut falls
        # inside turn 2's answer here; on a real model it falls at turn 3's own tokens: README, chat.)
        first = t3.blocks[0].timings
        assert first.reused_tokens + first.prefill_tokens == len(t3.prompt_ids) - 1
        cached = t2.prompt_ids + t2.token_ids[:-1]
        shared = next((i for i, (a, b) in enumerate(zip(t3.prompt_ids, cached)) if a != b), len(cached))
        assert first.reused_tokens == shared >= len(t2.prompt_ids)
        # shown per turn: the note under the answer and the Stats panel
        assert f"prefill {first.prefill_ms:.0f} ms: {first.prefill_tokens} new tokens, {first.reused_tokens} cached" \
            in plain(t3.view.note)
        stats = app.query_one(StatsPanel).render().plain
        assert f"prefill {first.prefill_ms:.0f}ms {first.prefill_tokens} tok +{first.reused_tokens} cached" in stats


async def test_the_ar_reference_is_measured_after_each_turn_and_the_cache_stays(tiny_engine):
    """"vs AR" divides by an AR run made right after each answer (under the load that answer saw), on an
    Engine of its own: the next turn still reuses what the conversation's caches hold."""
    app = ChatApp(tiny_engine, CFG, calibrate_tokens=2, cursor_blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.ar_tps is None                                  # nothing measured at start-up
        for text in ("hi", "and then?"):
            await ask(pilot, app, text)
        t1, t2 = app.turns
        assert t1.ar_tps and t2.ar_tps and app.ar_tps == t2.ar_tps
        first = t2.blocks[0].timings
        assert first.reused_tokens >= len(t1.prompt_ids)           # the AR run between the turns left it
        assert t2.token_ids == fresh_output(tiny_engine, t2)
        stats = app.query_one(StatsPanel).render().plain
        assert "vs AR f32" in stats and "AR f32 " in stats and "measured after each answer" not in stats


async def test_an_edit_and_a_strategy_switch_invalidate_cleanly(tiny_engine):
    app = ChatApp(tiny_engine, CFG, calibrate_tokens=0, cursor_blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await ask(pilot, app, "hi")
        await ask(pilot, app, "tell me more")
        # up in the empty prompt: the last message comes back for editing; Enter resends it
        app.query_one("#prompt", Input).focus()
        await pilot.press("up")
        prompt = app.query_one("#prompt", Input)
        assert prompt.value == "tell me more" and app.editing == 1
        prompt.value = "tell me less"
        await pilot.press("enter")
        await settle(pilot, app)
        old, new = app.turns[1], app.turns[2]
        assert old.edited and old.view.has_class("edited") and "edited" in plain(old.view.note)
        assert [m["content"] for m in app.messages if m["role"] == "user"] == ["hi", "tell me less"]
        assert new.token_ids == fresh_output(tiny_engine, new)
        shared = next(i for i, (a, b) in enumerate(zip(new.prompt_ids, old.prompt_ids)) if a != b)
        assert new.blocks[0].timings.reused_tokens == shared          # cut where the edit begins
        # cure -> ddtree: the same drafter and target cache, reused; -> ar: no drafter state, a full prefill
        await pilot.press("ctrl+t")
        assert app.cfg.strategy == "ddtree"
        await ask(pilot, app, "ddtree now")
        assert app.turns[3].blocks[0].timings.reused_tokens > 0
        assert app.turns[3].token_ids == fresh_output(tiny_engine, app.turns[3])
        await pilot.press("ctrl+t")
        assert app.cfg.strategy == "ar"
        await ask(pilot, app, "ar now")
        assert app.turns[4].blocks[0].timings.reused_tokens == 0
        await pilot.press("ctrl+t", "ctrl+t")                          # back to cure: stale drafter, full prefill
        assert app.cfg.strategy == "cure"
        await ask(pilot, app, "cure again")
        assert app.turns[5].blocks[0].timings.reused_tokens == 0
        assert app.turns[5].token_ids == fresh_output(tiny_engine, app.turns[5])


# ---- 3. sessions that last ----------------------------------------------------------------------

async def test_a_chat_is_saved_as_it_goes_resumed_and_exported(tiny_engine, tmp_path):
    store = tmp_path / "chats"
    launch = {"target": "tiny-target", "draft": "tiny-draft", "thinking": None}
    app = ChatApp(tiny_engine, CFG, calibrate_tokens=0, cursor_blink=False, store=store, launch=launch,
                  export_dir=tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await ask(pilot, app, "first question")
        saved = ChatSession.load(store / f"{app.record.id}.json")
        assert [t.prompt for t in saved.turns] == ["first question"]        # saved when the turn ended
        await ask(pilot, app, "second question")
        await pilot.press("ctrl+r")                                         # a comparison is saved too
        await settle(pilot, app)
        answers = [tiny_engine.decode(t.token_ids) for t in app.turns]
        shown = [t.view.markdown.source for t in app.turns]
        await pilot.press("ctrl+p")                                         # export to Markdown
        await pilot.pause()
    session_id = app.record.id
    saved = find_session(None, store)
    assert saved.id == session_id and saved.engine == launch
    assert [t.prompt for t in saved.turns] == ["first question", "second question"]
    assert [t.answer for t in saved.turns] == answers
    assert saved.turns[1].stats["tau"] > 0 and saved.turns[1].stats["reused_tokens"] > 0
    assert saved.turns[1].compare[0]["strategy"] == "ar" and saved.turns[1].compare[0]["identical"] is True
    assert [m["role"] for m in saved.messages] == ["user", "assistant"] * 2
    assert saved.settings["strategy"] == "cure" and saved.to_dict()["trace"] == str(saved.trace_path)
    trace = read_trace(saved.trace_path)
    assert [g.prompt for g in trace.generations] == ["first question", "second question"]
    assert trace.header["dtype"] == "float32"                              # as bench's traces spell it
    assert not list(store.glob(".*part"))                                  # no temporary file left
    exported = (tmp_path / f"cure-chat-{session_id}.md").read_text()
    assert exported == to_markdown(saved)
    assert "## Turn 1" in exported and "## Turn 2" in exported and "second question" in exported
    assert "τ " in exported and "tok/s" in exported and "identical output" in exported

    # resume: the conversation is there, and goes on from where it stopped
    history = list(saved.messages)
    app = ChatApp(tiny_engine, CFG, calibrate_tokens=0, cursor_blink=False, store=store, resume=saved)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert [t.prompt for t in app.turns] == ["first question", "second question"]
        assert [t.view.markdown.source for t in app.turns] == shown and len(app.turns[1].blocks) > 0
        view = app.turns[1].view
        assert "identical outputs" in plain(app.turns[1].comparisons[0].view)
        assert list(view.children) == [view.markdown, view.answer, view.note, app.turns[1].comparisons[0].view]
        assert app.messages == history
        assert f"resumed chat {session_id}" in plain(app.query_one("#welcome", Static))
        await ask(pilot, app, "third question")
        third = app.turns[2]
        assert third.messages[:-1] == history                               # the history went to the model
        assert third.token_ids == fresh_output(tiny_engine, third)
    resumed = ChatSession.load(store / f"{session_id}.json")
    assert [t.prompt for t in resumed.turns] == ["first question", "second question", "third question"]
    assert len(read_trace(resumed.trace_path).generations) == 3


async def test_a_failed_save_keeps_the_last_good_file(tiny_engine, tmp_path, monkeypatch):
    """Atomic: the chat file is replaced whole or not at all, so a crash mid-save loses at most one turn."""
    store = tmp_path / "chats"
    app = ChatApp(tiny_engine, CFG, calibrate_tokens=0, cursor_blink=False, store=store)
    async with app.run_test(size=(100, 30)) as pilot:
        await ask(pilot, app, "kept")
        path = store / f"{app.record.id}.json"
        good = path.read_text()
        real_replace = os.replace

        def crash(src, dst):
            if str(dst).endswith(".json"):
                raise OSError("disk full")
            real_replace(src, dst)
        monkeypatch.setattr(os, "replace", crash)
        await ask(pilot, app, "lost in the crash")
        assert app._notifications                                            # said, not raised
        monkeypatch.setattr(os, "replace", real_replace)
    assert path.read_text() == good and not list(store.glob(".*part"))
    assert [t.prompt for t in ChatSession.load(path).turns] == ["kept"]


def test_list_and_resume_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CURE_DATA", str(tmp_path))
    from cure_cli.main import app as cli
    r = CliRunner().invoke(cli, ["chat", "--list"])
    assert r.exit_code == 0 and "no saved chats" in r.output
    store = tmp_path / "chats"
    for i, title in enumerate(("older chat", "newer chat")):
        s = ChatSession(id=f"2026010{i}-120000-ab{i}c", dir=store, models={"target": "tiny"})
        s.turns = [TurnRecord(prompt=title, answer="ok", strategy="cure", config={}, status="done",
                                       stats={"tau": 2.0, "tokens_per_s": 5.0, "tokens": 3, "blocks": 2,
                                              "mean_tree_size": 4.0, "prefill_ms": 1.0, "prefill_tokens": 3,
                                              "reused_tokens": 0})]
        s.save()
    (store / "broken.json").write_text("{not json")                          # unreadable: skipped by --list
    assert [s.id for s in list_sessions(store)][0] == "20260101-120000-ab1c"
    r = CliRunner().invoke(cli, ["chat", "--list"])
    assert r.exit_code == 0 and "newer chat" in r.output and "older chat" in r.output
    assert r.output.index("newer chat") < r.output.index("older chat")
    for args, message in ((["chat", "--resume", "nope"], "no saved chat 'nope'"),
                          (["chat", "--resume", "2026"], "names 2 saved chats"),
                          (["chat", "2026"], "give --resume")):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, args
        assert len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(cli, ["chat", "--resume", "20260101"])         # found; then it needs a terminal
    assert r.exit_code == 2 and "needs a terminal" in r.output


# ---- 4. Markdown answers -----------------------------------------------------------------------

MARKDOWN_ANSWER = "# Primes\n\nA *short* answer:\n\n```python\ndef is_prime(n):\n    return n > 1\n```\n\nDone.\n"


class MarkdownReplay(ReplayEngine):
    """Replays the sample trace's blocks, each emitting the next bytes of MARKDOWN_ANSWER."""

    def stream(self, messages, cfg):
        data = list(MARKDOWN_ANSWER.encode())
        blocks = self.generations[0].blocks
        for i in range(0, len(data), 2):
            if self.delay:
                import time
                time.sleep(self.delay)
            base = blocks[(i // 2) % len(blocks)]
            yield dataclasses.replace(base, index=i // 2, emitted=tuple(data[i:i + 2]),
                                      accepted=base.accepted[:1], stop=None)


async def test_answers_render_as_markdown_streamed_throttled_then_whole(tok, monkeypatch):
    calls = {"append": 0, "update": 0}
    from textual.widgets import Markdown
    orig_append, orig_update = Markdown.append, Markdown.update

    def append(self, markdown):
        calls["append"] += 1
        return orig_append(self, markdown)

    def update(self, markdown):
        calls["update"] += 1
        return orig_update(self, markdown)
    monkeypatch.setattr(Markdown, "append", append)
    monkeypatch.setattr(Markdown, "update", update)
    engine = MarkdownReplay(read_trace(SAMPLE), tok, delay=0.02)     # ~1 s of streaming
    app = ChatApp(engine, DecodeConfig.of(k=8), baseline_tps=1.0, cursor_blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await ask(pilot, app, "primes?")
        await pilot.pause(0.3)
        turn = app.turns[0]
        n_blocks = len(turn.blocks)
        assert n_blocks == (len(MARKDOWN_ANSWER) + 1) // 2
        # streamed: refreshed a few times, not once per block; then the whole answer once more
        assert 1 <= calls["append"] < n_blocks / 3
        md = turn.view.markdown
        assert md.source == MARKDOWN_ANSWER
        assert md.query(MarkdownHeader) and md.query(MarkdownFence)
        fence = md.query_one(MarkdownFence)
        assert fence.lexer == "python" and "def is_prime(n):" in fence.code
        assert md.display and not turn.view.answer.display
        # the origin colouring stays one key away, and back
        await pilot.press("ctrl+b")
        assert turn.view.has_class("origins") and turn.view.answer.display and not md.display
        styles = {str(span.style) for span in turn.answer.render().spans}
        assert any("green" in s for s in styles) and any("cyan" in s for s in styles)
        assert "branch 0" in app.query_one("#conversation").border_subtitle
        await pilot.press("ctrl+b")
        assert not turn.view.has_class("origins") and md.display


# ---- 5. compare in place -----------------------------------------------------------------------

async def test_compare_reruns_the_last_prompt_side_by_side(tiny_engine):
    app = ChatApp(tiny_engine, CFG, calibrate_tokens=0, cursor_blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+r")                                    # nothing to compare yet: a warning
        assert not app.generating and app._notifications
        await ask(pilot, app, "compare me")
        turn = app.turns[0]
        await pilot.press("ctrl+r")
        await settle(pilot, app)
        comp = turn.comparisons[0]
        assert comp.strategy == "ar" and comp.status == "done"
        shown = plain(comp.view)
        for word in ("same prompt", "cure", "ar", "tok/s", "τ", "tree V", "blocks", "tokens"):
            assert word in shown
        assert f"✓ identical outputs ({len(turn.token_ids)} tokens)" in shown
        assert [t for b in comp.blocks for t in b.emitted] == turn.token_ids
        assert comp.stats["tau"] == 1.0 and turn.stats["tau"] > 1.0      # ar: one token per forward
        assert len(app.messages) == 2                                   # the conversation did not change
        # the strategy ctrl+t picks is the one compared next
        await pilot.press("ctrl+t")
        await pilot.press("ctrl+r")
        await settle(pilot, app)
        assert turn.comparisons[1].strategy == "ddtree" and "identical outputs" in plain(turn.comparisons[1].view)


# ---- 6. an honest empty tree -------------------------------------------------------------------

async def test_the_tree_panel_says_why_budget_zero(tiny_engine, monkeypatch):
    steep = CostCurve(sizes=(0, 1, 2, 4, 8, 16, 24), verify_ms=(1.0, 10.0, 20.0, 40.0, 80.0, 160.0, 240.0))
    monkeypatch.setattr(engine_module, "measure_cost_curve", lambda *a, **k: steep)
    cfg = DecodeConfig.from_user(k=4, max_new_tokens=16, v_max="auto")
    app = ChatApp(tiny_engine, cfg, calibrate_tokens=0, cursor_blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await ask(pilot, app, "hi")
        zero = [i for i, (_, b) in enumerate(app.session) if b.meta.get("v_max") == 0 and not b.nodes]
        assert zero
        app.action_select_block(zero[0])
        await pilot.pause()
        text = plain(app.query_one("#tree-body", Static))
        assert "no room left" not in text
        flat = " ".join(text.split())
        assert "budget 0: on this machine a tree costs more than the drafts win back" in flat
        assert "--v-max" in flat and "forces one" in flat
