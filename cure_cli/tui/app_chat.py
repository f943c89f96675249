"""`cure chat`: type a prompt, watch the answer stream in block by block with its repair trees.

The engine runs in a worker thread; blocks reach the UI through a buffer plus a replaceable tick
message, so typing and scrolling never wait for the model. Esc / Ctrl+C stop an answer between two
blocks (the generator is closed at a block boundary: the engine keeps the blocks it committed).

Answers render as Markdown (refreshed at most every MD_INTERVAL while they stream, re-rendered whole
when they end); ctrl+b shows the tokens coloured by origin instead. Turns reuse the engine's cached
prefix (only their new tokens are prefilled: the note under each answer and the Stats panel say how
many). ctrl+r re-runs the last prompt with another strategy, side by side; up (in an empty prompt)
edits and resends the last message. With a store folder every turn is saved as it ends
(cure_cli/chat_sessions.py); ctrl+p exports the conversation to Markdown.
"""
from __future__ import annotations

import threading
from pathlib import Path

from rich.style import Style
from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Select, Static

from cure_core.block import Block
from cure_core.config import STRATEGIES, DecodeConfig
from cure_core.errors import CureError, TraceError
from cure_core.files import atomic_write_text

from ..chat_sessions import ChatSession, TurnRecord, new_id, to_markdown
from .engine_protocol import ChatEngine
from .messages import (BlockBuffer, BlocksReady, CalibrationDone, CompareFinished, CompareProgress, TurnFinished,
                       TurnStarted)
from .turns import (Comparison, CompareView, Turn, TurnView, compare_renderable, identical_line, turn_note)
from .widgets import (side_panels, TREE_LEGEND, AnswerText, HelpScreen, MarginsChart, RepairTree, StatsPanel,
                      binding_rows, origin_legend, stats_view, tree_legend)

LEGEND_MARKUP = "[green]branch 0[/] [b magenta u]repair[/] [i cyan]bonus[/]"
MARKDOWN_SUBTITLE = "Markdown · ctrl+b: colour by origin"
MD_INTERVAL = 0.2          # seconds between Markdown refreshes of a streaming answer


def error_line(e: BaseException) -> str:
    return str(e) if isinstance(e, CureError) else f"{type(e).__name__}: {e}"


class SettingsScreen(ModalScreen[DecodeConfig | None]):
    """Strategy, K, tau_margin, b_max, V_max, max new tokens; applied from the next turn."""

    DEFAULT_CSS = """
    SettingsScreen { align: center middle; }
    SettingsScreen > Vertical { width: 46; height: auto; max-height: 100%; border: round $accent;
                                background: $surface; padding: 0 1; }
    SettingsScreen .row { height: 1; margin-top: 1; }
    SettingsScreen .row Label { width: 16; color: $text-muted; }
    SettingsScreen .row Input { width: 1fr; height: 1; border: none; padding: 0 1; background: $boost; }
    SettingsScreen .row Input:focus { background: $accent 30%; }
    SettingsScreen #settings-error { color: $error; height: auto; margin-top: 1; }
    SettingsScreen #settings-buttons { height: auto; align-horizontal: right; }
    SettingsScreen Button { min-width: 10; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    FIELDS = (("K (block size)", "set-k", "k", "integer"), ("tau_margin", "set-tau", "tau_margin", "number"),
              ("b_max", "set-bmax", "b_max", "integer"), ("V_max (or auto)", "set-vmax", "v_max", "text"),
              ("max new tokens", "set-maxnew", "max_new_tokens", "integer"))

    def __init__(self, cfg: DecodeConfig, engine: ChatEngine):
        super().__init__()
        self.cfg = cfg
        self.engine = engine

    def compose(self) -> ComposeResult:
        c = self.cfg
        with Vertical() as v:
            v.border_title = "Settings"
            v.border_subtitle = "applies from the next turn"
            yield Select([(s, s) for s in STRATEGIES], value=c.strategy, allow_blank=False, id="set-strategy")
            for label, wid, attr, kind in self.FIELDS:
                value = "auto" if attr == "v_max" and c.auto_budget else c.to_dict()[attr]
                with Horizontal(classes="row"):
                    yield Label(label)
                    yield Input(f"{value:g}" if isinstance(value, float) else str(value), type=kind, id=wid)
            yield Static("", id="settings-error")
            with Horizontal(id="settings-buttons"):
                yield Button("Cancel", id="settings-cancel")
                yield Button("Apply", variant="primary", id="settings-apply")

    def read(self) -> DecodeConfig:
        def num(widget_id: str, kind):
            raw = self.query_one(widget_id, Input).value.strip()
            try:
                return kind(raw)
            except ValueError:
                raise CureError(f"{widget_id[5:]}: {raw!r} is not a number") from None

        strategy = self.query_one("#set-strategy", Select).value
        cfg = DecodeConfig.from_user(self.cfg, strategy=str(strategy), k=num("#set-k", int),
                                     v_max=self.query_one("#set-vmax", Input).value,   # a number, or auto
                                     b_max=num("#set-bmax", int), tau_margin=num("#set-tau", float),
                                     max_new_tokens=num("#set-maxnew", int))
        self.engine.check(cfg)
        return cfg

    def apply(self) -> None:
        try:
            cfg = self.read()
        except (CureError, ValueError) as e:
            self.query_one("#settings-error", Static).update(f"error: {e}")
            return
        self.dismiss(cfg)

    @on(Button.Pressed, "#settings-apply")
    def _apply(self) -> None:
        self.apply()

    @on(Button.Pressed, "#settings-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.apply()

    def action_cancel(self) -> None:
        self.dismiss(None)


class ChatApp(App):
    TITLE = "cure chat"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #main { height: 1fr; }
    .panel { border: round $primary-darken-1; border-title-color: $text; border-title-style: bold;
             border-subtitle-color: $text-muted; }
    .panel:focus-within { border: round $accent; }
    #conversation { width: 1fr; min-width: 30; }
    #log { height: 1fr; scrollbar-size-vertical: 1; }
    #log > Static { margin: 0 0 1 0; }
    #log > .user { color: $text; text-style: bold; margin: 0; }
    #log > .info { color: $text-muted; }
    #prompt { border: tall $panel; }
    #side { width: 1fr; min-width: 30; }
    RepairTree { height: 1fr; scrollbar-size: 1 1; }
    MarginsChart { height: 6; }
    StatsPanel { height: 7; }
    """
    BINDINGS = [
        Binding("ctrl+c", "stop", "Stop", show=False, priority=True, tooltip="Stop the answer being generated"),
        Binding("escape", "stop_or_leave", "Stop",
                tooltip="Stop the answer; editing: cancel the edit; idle: leave the input (for single keys)"),
        Binding("ctrl+s", "save", "Save", tooltip="Save the session's trace (JSONL, for `cure inspect`)"),
        Binding("s", "save", "Save", show=False, tooltip="Save the trace (input not focused)"),
        Binding("f2,ctrl+o", "settings", "Settings", tooltip="Strategy, K, tau_margin, b_max, V_max"),
        Binding("ctrl+t", "cycle_strategy", "Strategy", tooltip="Next strategy (ar sd parallel cure ddtree)"),
        Binding("ctrl+r", "compare", "Compare", tooltip="Re-run the last prompt with another strategy (the one ctrl+t "
                "picked, else ar) and show both side by side: tok/s, τ, tree size, identical outputs"),
        Binding("ctrl+p", "export", "Export", tooltip="Export the conversation to Markdown (per-turn τ and tok/s)"),
        Binding("ctrl+b", "toggle_origins", "Origins",
                tooltip="Answers coloured by origin (branch 0 / repair / bonus) instead of Markdown, and back"),
        Binding("up", "edit_last", "Edit", show=False, tooltip="In an empty prompt: edit and resend your last message"),
        Binding("ctrl+up,left_square_bracket", "select_step(-1)", "Prev block", show=False,
                tooltip="Show the previous block in the tree"),
        Binding("ctrl+down,right_square_bracket", "select_step(1)", "Next block", show=False,
                tooltip="Show the next block in the tree"),
        Binding("ctrl+l,l", "follow", "Latest", show=False, tooltip="Follow the latest block again"),
        Binding("i,slash", "focus_input", "Type", show=False, tooltip="Back to the prompt input"),
        Binding("f1,question_mark", "help", "Help", tooltip="This list"),
        Binding("ctrl+q", "quit", "Quit", tooltip="Quit (every finished turn is already saved)"),
    ]

    def __init__(self, engine: ChatEngine, cfg: DecodeConfig, *, baseline_tps: float | None = None,
                 calibrate_tokens: int = 8, save_path: str | Path | None = None, cursor_blink: bool = True,
                 store: str | Path | None = None, resume: ChatSession | None = None, launch: dict | None = None,
                 export_dir: str | Path | None = None):
        """`store`: the folder every turn is saved into (None: nothing is saved); `resume`: a saved chat to
        continue; `launch`: the model options to save with the chat (chat_sessions.MODEL_FIELDS)."""
        super().__init__()
        self.engine = engine
        self.cfg = cfg
        self.messages: list[dict] = []
        self.turns: list[Turn] = []
        self.session: list[tuple[int, Block]] = []       # every block of the session: (turn, block)
        self.selected: int | None = None                  # index into session; None = follow the latest
        self.generating = False
        self.editing: int | None = None                   # the turn an edited prompt will replace
        self.show_origins = False                         # answers coloured by origin instead of Markdown
        self._stop = threading.Event()
        self._buffer = BlockBuffer()
        self._md_dirty: set[int] = set()                  # turns whose Markdown lags their text
        # The AR reference ("vs AR"): --baseline-tps, else a short AR run right after each answer, so it is
        # measured under the load that answer ran under (a start-up figure goes stale as the load changes).
        self.ar_tps = baseline_tps
        self.ar_note = "--baseline-tps" if baseline_tps else ""
        self.calibrate_tokens = calibrate_tokens if baseline_tps is None else 0
        self.save_path = Path(save_path) if save_path else None
        self.cursor_blink = cursor_blink
        self.store = Path(store) if store is not None else None
        self.export_dir = Path(export_dir) if export_dir is not None else None
        self.resumed = resume
        self.record = resume or ChatSession(id=new_id(), dir=self.store or Path.cwd())
        self.record.models = dict(engine.models)
        self.record.thinking = getattr(engine, "thinking", None)
        if launch is not None:
            self.record.engine = dict(launch)

    @property
    def engine_ar_dtype(self) -> str | None:
        """The dtype the AR reference runs in, for the "vs AR" label (None: unknown)."""
        return getattr(self.engine, "ar_dtype", None)

    # ---- layout ----
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="conversation", classes="panel") as conv:
                conv.border_title = "Conversation"
                conv.border_subtitle = MARKDOWN_SUBTITLE
                with VerticalScroll(id="log"):
                    yield Static(self._welcome(), classes="info", id="welcome")
                yield Input(placeholder="Type a prompt, Enter sends", id="prompt")
            with Vertical(id="side"):
                yield from side_panels(self.engine.tokens)
        yield Footer()

    def _welcome(self) -> Text:
        t = Text()
        t.append(self.engine.label, Style(bold=True))
        thinking = getattr(self.engine, "thinking", None)
        if thinking is not None:
            t.append(f" · thinking {'on' if thinking else 'off'}")
        t.append("\n" + self._cfg_line(self.cfg))
        if self.resumed is not None:
            t.append(f"\nresumed chat {self.resumed.id} ({len(self.resumed.turns)} turns)", Style(italic=True))
        return t

    @staticmethod
    def _cfg_line(c: DecodeConfig) -> str:
        v_max = f"auto≤{c.v_max}" if getattr(c, "auto_budget", False) else str(c.v_max)
        return (f"{c.strategy} · K={c.k} · τ_margin={c.paper.tau_margin:g} · b_max={c.paper.b_max} · V_max={v_max} · "
                f"max {c.max_new_tokens} tokens")

    def on_mount(self) -> None:
        prompt = self.query_one("#prompt", Input)
        prompt.cursor_blink = self.cursor_blink
        prompt.focus()
        if self.resumed is not None:
            self._restore(self.resumed)
        self.set_interval(MD_INTERVAL, self._flush_markdown)
        if self.calibrate_tokens > 0:
            self.ar_note = "measured after each answer"
        self._refresh_panels()

    def on_resize(self) -> None:
        tall = self.size.height >= 40
        self.query_one(MarginsChart).styles.height = 10 if tall else 6
        self.query_one(StatsPanel).styles.height = 8 if tall else 7

    # ---- workers (threads) ----
    @work(thread=True, group="calibrate", exit_on_error=False)
    def _calibrate(self, turn: int, cfg: DecodeConfig, tokens: int) -> None:
        try:
            tps = self.engine.calibrate(cfg, tokens)
        except Exception as e:  # noqa: BLE001 - shown in the Stats panel, never raised
            self.post_message(CalibrationDone(None, error_line(e), turn))
            return
        self.post_message(CalibrationDone(tps, turn=turn))

    @work(thread=True, group="engine", exit_on_error=False)
    def _run_turn(self, turn: int, messages: list[dict], cfg: DecodeConfig) -> None:
        try:
            cfg = self.engine.check(cfg)
            ids = self.engine.encode(messages)
            self.post_message(TurnStarted(turn, ids, cfg))
            gen = self.engine.stream(messages, cfg)
        except Exception as e:  # noqa: BLE001
            self.post_message(TurnFinished(turn, "error", error_line(e)))
            return
        def each(block: Block) -> None:
            self._buffer.put(turn, block)
            self.post_message(BlocksReady(turn))
        self.post_message(TurnFinished(turn, *self._pump(gen, each)))

    @work(thread=True, group="engine", exit_on_error=False)
    def _run_compare(self, turn: int, messages: list[dict], cfg: DecodeConfig) -> None:
        blocks: list[Block] = []
        try:
            gen = self.engine.stream(messages, cfg)
        except Exception as e:  # noqa: BLE001
            self.post_message(CompareFinished(turn, blocks, "error", error_line(e)))
            return
        def each(block: Block) -> None:
            blocks.append(block)
            self.post_message(CompareProgress(turn, sum(len(b.emitted) for b in blocks)))
        self.post_message(CompareFinished(turn, blocks, *self._pump(gen, each)))

    def _pump(self, gen, each) -> tuple[str, str | None]:
        """Drive a generation on a worker thread: `each(block)` per block, stopping between two blocks when
        asked; the generator is always closed. Returns ("done" | "stopped" | "error", the error line)."""
        reason, error = "done", None
        try:
            for block in gen:
                each(block)
                if self._stop.is_set():
                    reason = "stopped"
                    break
        except Exception as e:  # noqa: BLE001 - shown under the answer, never raised
            reason, error = "error", error_line(e)
        finally:
            gen.close()
        return reason, error

    # ---- messages from the workers ----
    def on_calibration_done(self, message: CalibrationDone) -> None:
        self.ar_tps = message.ar_tps
        if message.turn is not None and message.turn < len(self.turns):
            self.turns[message.turn].ar_tps = message.ar_tps
        if message.error:
            self.ar_note = f"AR calibration failed: {message.error}"
        elif message.ar_tps:
            self.ar_note = getattr(self.engine, "calibration_note", "calibrated")
        else:
            self.ar_note = "pass --baseline-tps X"
        self._refresh_panels()

    def on_turn_started(self, message: TurnStarted) -> None:
        turn = self.turns[message.turn]
        turn.prompt_ids = list(message.prompt_ids)
        turn.cfg = message.cfg

    def on_blocks_ready(self, message: BlocksReady) -> None:
        self._drain()

    async def on_turn_finished(self, message: TurnFinished) -> None:
        self._drain()
        turn = self.turns[message.turn]
        turn.status = message.reason
        turn.error = message.error
        turn.answer.finish()
        if turn.blocks:
            self.messages.append({"role": "assistant", "content": self.engine.decode(turn.token_ids)})
        elif self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()                # nothing answered: do not keep the question in the history
        self._render_turn(turn)
        self._md_dirty.discard(message.turn)
        turn.md_source = turn.answer.text
        log = self.query_one("#log", VerticalScroll)
        at_end = log.scroll_y >= log.max_scroll_y - 1
        self.generating = False
        self._stop.clear()
        self.refresh_bindings()
        self._refresh_panels()
        self._save_session()
        if self.calibrate_tokens > 0 and turn.blocks:      # the AR reference, under this answer's load
            self._calibrate(message.turn, turn.cfg, self.calibrate_tokens)
        await turn.view.markdown.update(turn.md_source)    # the whole answer, parsed once more
        if at_end:
            self.call_after_refresh(log.scroll_end, animate=False)

    def on_compare_progress(self, message: CompareProgress) -> None:
        comp = self.turns[message.turn].comparisons[-1]
        comp.view.update(Text(f"re-running the same prompt with {comp.strategy}… {message.tokens} tokens",
                              Style(dim=True, italic=True)))

    def on_compare_finished(self, message: CompareFinished) -> None:
        turn = self.turns[message.turn]
        comp = turn.comparisons[-1]
        comp.blocks, comp.status, comp.error = list(message.blocks), message.reason, message.error
        self._render_comparison(turn, comp)
        self.generating = False
        self._stop.clear()
        self.refresh_bindings()
        self._save_session()

    def _drain(self) -> None:
        items = self._buffer.drain()
        if not items:
            return
        touched = set()
        for turn_no, block in items:
            turn = self.turns[turn_no]
            key = len(self.session)
            self.session.append((turn_no, block))
            turn.blocks.append(block)
            turn.answer.add_block(block, key)
            touched.add(turn_no)
        log = self.query_one("#log", VerticalScroll)
        at_end = log.scroll_y >= log.max_scroll_y - 1
        for turn_no in touched:
            self._render_turn(self.turns[turn_no])
        self._md_dirty |= touched
        if at_end:
            log.scroll_end(animate=False)
        self._refresh_panels()

    async def _flush_markdown(self) -> None:
        """Throttled Markdown: the text that arrived since the last refresh is appended (Textual re-parses
        only the last block); on_turn_finished renders the whole answer again."""
        if not self._md_dirty:
            return
        log = self.query_one("#log", VerticalScroll)
        at_end = log.scroll_y >= log.max_scroll_y - 1
        for turn_no in sorted(self._md_dirty):
            turn = self.turns[turn_no]
            text = turn.answer.text
            done, turn.md_source = turn.md_source, text
            if text.startswith(done):
                if len(text) > len(done):
                    await turn.view.markdown.append(text[len(done):])
            else:
                await turn.view.markdown.update(text)
        self._md_dirty.clear()
        if at_end:                       # the Markdown grew: follow it, once laid out
            self.call_after_refresh(log.scroll_end, animate=False)

    # ---- drawing ----
    def _render_turn(self, turn: Turn) -> None:
        highlight = None
        if self.selected is not None and self.session[self.selected][0] == self.turns.index(turn):
            highlight = self.selected
        if turn.blocks or turn.saved_answer is None:
            text = turn.answer.render(highlight)
        else:
            text = Text(turn.saved_answer)                  # resumed without its trace: the text only
        if not text and turn.status == "running":
            text = Text("…", Style(dim=True))
        turn.view.answer.update(text)
        turn.view.note.update(turn_note(turn))

    def _render_comparison(self, turn: Turn, comp: Comparison) -> None:
        if comp.status == "error" and not comp.blocks:
            comp.view.update(Text(f"comparison with {comp.strategy} failed: {comp.error}", Style(color="red")))
            return
        ours = turn.token_ids
        theirs = [t for b in comp.blocks for t in b.emitted]
        if comp.saved_identical is not None:
            verdict = Text("✓ identical outputs" if comp.saved_identical else "✗ outputs differ",
                           Style(color="green" if comp.saved_identical else "red", bold=True))
        elif comp.status != "done":
            verdict = Text(f"{comp.status}: {len(theirs)} tokens, compared up to there: "
                           + ("the same" if ours[:len(theirs)] == theirs else "different"), Style(color="yellow"))
        else:
            verdict = identical_line(ours, theirs, turn.cfg.temperature)
        comp.view.update(compare_renderable(turn.cfg.strategy, turn.stats, comp.strategy, comp.stats, verdict))

    def _current(self) -> tuple[int, Block] | None:
        if not self.session:
            return None
        return self.session[self.selected if self.selected is not None else -1]

    def _refresh_panels(self) -> None:
        cur = self._current()
        tree = self.query_one(RepairTree)
        margins = self.query_one(MarginsChart)
        stats = self.query_one(StatsPanel)
        if cur is None:
            tree.show(None)
            margins.show(None, self.cfg.paper.tau_margin)
            stats.show(stats_view([], None, [], self.ar_tps, self.ar_note, ar_dtype=self.engine_ar_dtype))
            stats.border_subtitle = self.cfg.strategy
            return
        turn_no, block = cur
        turn = self.turns[turn_no]
        tree.show(block)
        tree.border_subtitle = (f"block {self.selected} selected · l: latest" if self.selected is not None
                                else tree_legend(tree.size.width))
        margins.show(block, turn.cfg.paper.tau_margin)
        upto = turn.blocks[: turn.blocks.index(block) + 1] if self.selected is not None else turn.blocks
        session = [b for _, b in self.session]
        idx = self.selected if self.selected is not None else len(session) - 1
        # the shown turn's own reference once measured after it; the latest one meanwhile
        ar_tps = turn.ar_tps if turn.ar_tps is not None else self.ar_tps
        stats.show(stats_view(upto, block, session, ar_tps, self.ar_note, highlight=idx,
                              ar_dtype=self.engine_ar_dtype))
        stats.border_subtitle = f"{turn.cfg.strategy} K={turn.cfg.k}"

    # ---- input ----
    @on(Input.Submitted, "#prompt")
    def _submit(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.generating:
            self.notify("still answering: Esc stops it", severity="warning")
            return
        event.input.value = ""
        self.send(text)

    def send(self, text: str) -> None:
        """Start a turn: the user's text joins the history, the answer streams into a new view."""
        if self.editing is not None:
            self._replace_edited()
        log = self.query_one("#log", VerticalScroll)
        view = TurnView(self.show_origins)
        log.mount(Static(Text("› " + text), classes="user"))
        log.mount(view)
        log.scroll_end(animate=False)
        turn_no = len(self.turns)
        history_len = len(self.messages)
        self.messages.append({"role": "user", "content": text})
        self.turns.append(Turn(prompt=text, cfg=self.cfg, answer=AnswerText(self.engine.tokens, "app.select_block"),
                               view=view, messages=list(self.messages), history_len=history_len))
        self._render_turn(self.turns[-1])
        self.generating = True
        self._stop.clear()
        self.selected = None
        self.refresh_bindings()
        self._run_turn(turn_no, list(self.messages), self.cfg)

    # ---- restoring a saved chat ----
    def _restore(self, record: ChatSession) -> None:
        """Mount the saved turns (their blocks from the session trace when it reads), the history and the
        comparisons; the conversation then goes on where it stopped."""
        from cure_core.trace import read_trace
        generations = []
        if record.trace_path.exists():
            try:
                generations = read_trace(record.trace_path).generations
            except TraceError as e:
                self.notify(f"the chat's trace does not read ({e}): answers are shown without their blocks",
                            severity="warning")
        log = self.query_one("#log", VerticalScroll)
        for rec in record.turns:
            try:
                cfg = DecodeConfig.from_dict(rec.config)
            except (TypeError, CureError):
                cfg = self.cfg
            gen = generations[rec.generation] if rec.generation is not None and rec.generation < len(generations) else None
            turn_no = len(self.turns)
            answer = AnswerText(self.engine.tokens, "app.select_block")
            for block in (gen.blocks if gen is not None else ()):
                answer.add_block(block, len(self.session))
                self.session.append((turn_no, block))
            answer.finish()
            comparisons = [Comparison(c["strategy"], cfg.with_(strategy=c["strategy"]), CompareView(), status="done",
                                      saved_stats=c.get("stats") or {}, saved_identical=c.get("identical"))
                           for c in rec.compare]
            view = TurnView(self.show_origins, markdown=answer.text if gen is not None else rec.answer,
                            compared=tuple(c.view for c in comparisons), classes="edited" if rec.edited else None)
            log.mount(Static(Text("› " + rec.prompt), classes="user"))
            log.mount(view)
            turn = Turn(prompt=rec.prompt, cfg=cfg, answer=answer, view=view, messages=[], history_len=0,
                        prompt_ids=list(gen.prompt_ids) if gen is not None else [],
                        blocks=list(gen.blocks) if gen is not None else [], status=rec.status, error=rec.error,
                        edited=rec.edited, saved_stats=rec.stats, saved_answer=rec.answer,
                        md_source=view.markdown.source)
            self.turns.append(turn)
            self._render_turn(turn)
            for comp in comparisons:
                comp.view.border_title = f"compare: {cfg.strategy} vs {comp.strategy}"
                turn.comparisons.append(comp)
                self._render_comparison(turn, comp)
        self.messages = list(record.messages)
        log.scroll_end(animate=False)

    # ---- saving ----
    def _sync_record(self) -> ChatSession:
        """The chat as it stands, in its saved form (chat_sessions.ChatSession)."""
        rec = self.record
        rec.settings = self.cfg.to_dict()
        rec.messages = list(self.messages)
        rec.turns = []
        generation = 0
        for turn in self.turns:
            if turn.status == "running":
                continue                                   # only finished turns are kept
            answer = self.engine.decode(turn.token_ids) if turn.blocks else (turn.saved_answer or "")
            compare = [{"strategy": c.strategy, "stats": c.stats,
                        "identical": c.saved_identical if c.saved_identical is not None
                        else [t for b in c.blocks for t in b.emitted] == turn.token_ids}
                       for c in turn.comparisons if c.status == "done"]
            rec.turns.append(TurnRecord(prompt=turn.prompt, answer=answer, strategy=turn.cfg.strategy,
                                        config=turn.cfg.to_dict(), status=turn.status, stats=turn.stats,
                                        generation=generation if turn.blocks else None, compare=compare,
                                        edited=turn.edited, error=turn.error))
            generation += bool(turn.blocks)
        return rec

    def _save_session(self) -> None:
        """Every finished turn, saved as it ends: the chat record and its trace, each written whole."""
        if self.store is None or not self.turns:
            return
        rec = self._sync_record()
        try:
            if any(t.blocks for t in self.turns):
                self.write_trace(rec.trace_path)
            rec.save()
        except (OSError, CureError) as e:
            self.notify(f"could not save the chat: {error_line(e)}", severity="error")

    def write_trace(self, path: Path) -> Path:
        """Every turn so far with blocks (a running one too, as 'interrupted'), with TraceWriter."""
        from cure_core.trace import TraceWriter
        self._drain()
        writer = TraceWriter(path, models=dict(self.engine.models), config=self.cfg.to_dict(),
                             extra={"thinking": getattr(self.engine, "thinking", None), "dtype": self.engine_ar_dtype})
        try:
            for turn in self.turns:
                if not turn.blocks:
                    continue
                writer.begin(turn.prompt_ids, turn.prompt, turn.cfg.strategy, turn.cfg.to_dict())
                for block in turn.blocks:
                    writer.block(block)
                writer.end()
        except BaseException:
            writer.abort()
            raise
        return writer.close("interrupted" if self.generating else "complete")

    # ---- actions ----
    def check_action(self, action: str, parameters) -> bool | None:
        if action == "stop":
            return True if self.generating else False     # idle: ctrl+c falls through (copy / quit hint)
        if action == "edit_last":                          # up in an empty prompt, idle: else the key is the widget's
            prompt = self.query_one("#prompt", Input)
            return (not self.generating and self.focused is prompt and not prompt.value
                    and self._last_turn() is not None) or False
        return True

    def _last_turn(self) -> Turn | None:
        """The last turn still in the conversation (not edited away), once it has finished."""
        live = [t for t in self.turns if not t.edited]
        return live[-1] if live and live[-1].status != "running" else None

    def action_stop(self) -> None:
        if self.generating:
            self._stop.set()
            self.notify("stopping after this block…", timeout=2)

    def action_stop_or_leave(self) -> None:
        if self.generating:
            self.action_stop()
        elif self.editing is not None:
            self.editing = None
            self.query_one("#prompt", Input).value = ""
            self.query_one("#conversation").border_subtitle = self._subtitle()
        elif isinstance(self.focused, Input):
            self.query_one("#log").focus()

    def action_edit_last(self) -> None:
        turn = self._last_turn()
        if turn is None:
            return
        prompt = self.query_one("#prompt", Input)
        prompt.value = turn.prompt
        prompt.cursor_position = len(turn.prompt)
        self.editing = self.turns.index(turn)
        self.query_one("#conversation").border_subtitle = "editing your last message · Enter resends · Esc cancels"

    def _replace_edited(self) -> None:
        """The edited turn leaves the history (it stays on screen, dimmed); the engine's cached prefix is
        cut where the new prompt differs (Engine.generate reuse_prefix), so only the new tokens prefill."""
        turn = self.turns[self.editing]
        self.editing = None
        turn.edited = True
        turn.view.add_class("edited")
        self.messages = self.messages[: turn.history_len]
        self._render_turn(turn)
        self.query_one("#conversation").border_subtitle = self._subtitle()

    def _subtitle(self) -> str:
        return LEGEND_MARKUP if self.show_origins else MARKDOWN_SUBTITLE

    def action_toggle_origins(self) -> None:
        self.show_origins = not self.show_origins
        for turn in self.turns:
            turn.view.set_class(self.show_origins, "origins")
        self.query_one("#conversation").border_subtitle = self._subtitle()

    def action_compare(self) -> None:
        if self.generating:
            self.notify("still answering: compare when it ends", severity="warning")
            return
        turn = self._last_turn()
        if turn is None or turn.status != "done" or not turn.blocks:
            self.notify("nothing to compare yet: the last answer must have finished", severity="warning")
            return
        strategy = self._compare_strategy(turn)
        if strategy is None:
            self.notify("no other strategy can run with these models", severity="warning")
            return
        comp = Comparison(strategy, turn.cfg.with_(strategy=strategy), CompareView())
        comp.view.border_title = f"compare: {turn.cfg.strategy} vs {strategy}"
        turn.comparisons.append(comp)
        turn.view.mount(comp.view)
        comp.view.update(Text(f"re-running the same prompt with {strategy}…", Style(dim=True, italic=True)))
        self.query_one("#log", VerticalScroll).scroll_end(animate=False)
        self.generating = True
        self._stop.clear()
        self.refresh_bindings()
        self._run_compare(self.turns.index(turn), list(turn.messages), comp.cfg)

    def _compare_strategy(self, turn: Turn) -> str | None:
        """Rule: the strategy ctrl+t / Settings picked when it differs from the turn's; else ar (or, after
        an ar turn, the first speculative strategy these models can run)."""
        wanted = [self.cfg.strategy] if self.cfg.strategy != turn.cfg.strategy else []
        wanted += ["ar"] if turn.cfg.strategy != "ar" else [s for s in ("cure", "ddtree", "parallel", "sd")]
        for strategy in wanted:
            try:
                self.engine.check(turn.cfg.with_(strategy=strategy))
            except CureError:
                continue
            return strategy
        return None

    def action_export(self) -> None:
        if not any(t.status != "running" for t in self.turns):
            self.notify("nothing to export yet", severity="warning")
            return
        rec = self._sync_record()
        path = (self.export_dir or Path.cwd()) / f"cure-chat-{rec.id}.md"
        try:
            atomic_write_text(path, to_markdown(rec))
        except OSError as e:
            self.notify(f"could not export: {error_line(e)}", severity="error")
            return
        self.notify(f"{len(rec.turns)} turns to {path}", title="exported to Markdown")

    def action_focus_input(self) -> None:
        self.query_one("#prompt", Input).focus()

    def action_help(self) -> None:
        legend = Text("answer tokens (ctrl+b): ")
        legend.append_text(origin_legend())
        legend.append("\ntree: " + TREE_LEGEND + "\nmargins: bars per drafted position, ╌ = τ_margin, ▲ = UFP")
        self.push_screen(HelpScreen(binding_rows(self.BINDINGS), legend))

    def action_settings(self) -> None:
        def done(cfg: DecodeConfig | None) -> None:
            if cfg is not None and cfg != self.cfg:
                self.set_config(cfg)
        self.push_screen(SettingsScreen(self.cfg, self.engine), done)

    def set_config(self, cfg: DecodeConfig) -> None:
        self.cfg = cfg
        log = self.query_one("#log", VerticalScroll)
        log.mount(Static(Text("settings: " + self._cfg_line(cfg)), classes="info"))
        log.scroll_end(animate=False)
        if not self.session:
            self._refresh_panels()

    def action_cycle_strategy(self) -> None:
        i = STRATEGIES.index(self.cfg.strategy)
        for step in range(1, len(STRATEGIES) + 1):
            candidate = STRATEGIES[(i + step) % len(STRATEGIES)]
            cfg = self.cfg.with_(strategy=candidate)
            try:
                self.engine.check(cfg)           # e.g. `sd` needs a chain drafter
            except CureError:
                continue
            self.set_config(cfg)
            self.notify(f"strategy: {candidate} (from the next turn; ctrl+r compares it with the last)", timeout=2)
            return

    def action_select_block(self, key: int) -> None:
        if 0 <= key < len(self.session):
            self._select(key)

    def action_select_step(self, step: int) -> None:
        if not self.session:
            return
        cur = self.selected if self.selected is not None else len(self.session) - 1
        self._select(max(0, min(len(self.session) - 1, cur + step)))

    def action_follow(self) -> None:
        self._select(None)

    def _select(self, key: int | None) -> None:
        old = self.selected
        self.selected = key
        for k in {old, key} - {None}:
            self._render_turn(self.turns[self.session[k][0]])
        self._refresh_panels()

    def action_save(self) -> None:
        if not any(t.blocks for t in self.turns):
            self.notify("nothing to save yet", severity="warning")
            return
        try:
            path = self.save_trace()
        except (OSError, CureError) as e:
            self.notify(f"could not save the trace: {error_line(e)}", severity="error")
            return
        n = sum(len(t.blocks) for t in self.turns)
        self.notify(f"saved {n} blocks to {path}", title="trace saved")

    def save_trace(self) -> Path:
        """Write every turn so far to --save's path (default: ./cure-chat-N.jsonl)."""
        if self.save_path is None:
            n = 1
            while Path(f"cure-chat-{n}.jsonl").exists():
                n += 1
            self.save_path = Path(f"cure-chat-{n}.jsonl")
        return self.write_trace(self.save_path)

    async def action_quit(self) -> None:
        self._stop.set()
        self.exit()

    def on_unmount(self) -> None:
        self._stop.set()             # a running answer ends at its next block; the thread then exits
