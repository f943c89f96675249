"""`cure chat`: type a prompt, watch the answer stream in block by block with its repair trees.

The engine runs in a worker thread; blocks reach the UI through a buffer plus a replaceable tick
message, so typing and scrolling never wait for the model. Esc / Ctrl+C stop an answer between two
blocks (the generator is closed: the engine's state is dropped cleanly).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
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
from cure_core.errors import CureError

from .engine_protocol import ChatEngine
from .messages import BlockBuffer, BlocksReady, CalibrationDone, TurnFinished, TurnStarted
from .widgets import (side_panels, TREE_LEGEND, TREE_LEGEND_SHORT, AnswerText, AnswerView, HelpScreen, MarginsChart, RepairTree,
                      StatsPanel, binding_rows, origin_legend, stats_view, tree_legend)

LEGEND_MARKUP = "[green]branch 0[/] [b magenta u]repair[/] [i cyan]bonus[/]"


def error_line(e: BaseException) -> str:
    return str(e) if isinstance(e, CureError) else f"{type(e).__name__}: {e}"


@dataclass
class Turn:
    prompt: str
    cfg: DecodeConfig
    answer: AnswerText
    view: Static
    prompt_ids: list[int] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    status: str = "running"          # running | done | stopped | error


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
                value = "auto" if attr == "v_max" and getattr(c, "auto_budget", False) else getattr(c, attr)
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
    #log > .user { color: $text; text-style: bold; }
    #log > .info { color: $text-muted; }
    #prompt { border: tall $panel; }
    #side { width: 1fr; min-width: 30; }
    RepairTree { height: 1fr; scrollbar-size: 1 1; }
    MarginsChart { height: 6; }
    StatsPanel { height: 6; }
    """
    BINDINGS = [
        Binding("ctrl+c", "stop", "Stop", show=False, priority=True, tooltip="Stop the answer being generated"),
        Binding("escape", "stop_or_leave", "Stop",
                tooltip="Stop the answer; idle: leave the input (for single keys)"),
        Binding("ctrl+s", "save", "Save", tooltip="Save the session's trace (JSONL, for `cure inspect`)"),
        Binding("s", "save", "Save", show=False, tooltip="Save the trace (input not focused)"),
        Binding("f2,ctrl+o", "settings", "Settings", tooltip="Strategy, K, tau_margin, b_max, V_max"),
        Binding("ctrl+t", "cycle_strategy", "Strategy", tooltip="Next strategy (ar sd parallel cure ddtree)"),
        Binding("ctrl+up,left_square_bracket", "select_step(-1)", "Prev block", show=False,
                tooltip="Show the previous block in the tree"),
        Binding("ctrl+down,right_square_bracket", "select_step(1)", "Next block", show=False,
                tooltip="Show the next block in the tree"),
        Binding("ctrl+l,l", "follow", "Latest", show=False, tooltip="Follow the latest block again"),
        Binding("i,slash", "focus_input", "Type", show=False, tooltip="Back to the prompt input"),
        Binding("f1,question_mark", "help", "Help", tooltip="This list"),
        Binding("ctrl+q", "quit", "Quit", tooltip="Quit"),
    ]

    def __init__(self, engine: ChatEngine, cfg: DecodeConfig, *, baseline_tps: float | None = None,
                 calibrate_tokens: int = 8, save_path: str | Path | None = None, cursor_blink: bool = True):
        super().__init__()
        self.engine = engine
        self.cfg = cfg
        self.messages: list[dict] = []
        self.turns: list[Turn] = []
        self.session: list[tuple[int, Block]] = []       # every block of the session: (turn, block)
        self.selected: int | None = None                  # index into session; None = follow the latest
        self.generating = False
        self._stop = threading.Event()
        self._buffer = BlockBuffer()
        self.ar_tps = baseline_tps
        self.ar_note = "--baseline-tps" if baseline_tps else ""
        self.calibrate_tokens = calibrate_tokens if baseline_tps is None else 0
        self.save_path = Path(save_path) if save_path else None
        self.cursor_blink = cursor_blink

    # ---- layout ----
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="conversation", classes="panel") as conv:
                conv.border_title = "Conversation"
                conv.border_subtitle = LEGEND_MARKUP
                with VerticalScroll(id="log"):
                    yield Static(self._welcome(), classes="info", id="welcome")
                yield Input(placeholder="Type a prompt, Enter sends", id="prompt")
            with Vertical(id="side"):
                yield from side_panels(self.engine.tokens)
        yield Footer()

    def _welcome(self) -> Text:
        t = Text()
        t.append(self.engine.label, Style(bold=True))
        t.append("\n" + self._cfg_line(self.cfg))
        return t

    @staticmethod
    def _cfg_line(c: DecodeConfig) -> str:
        v_max = f"auto≤{c.v_max}" if getattr(c, "auto_budget", False) else str(c.v_max)
        return (f"{c.strategy} · K={c.k} · τ_margin={c.tau_margin:g} · b_max={c.b_max} · V_max={v_max} · "
                f"max {c.max_new_tokens} tokens")

    def on_mount(self) -> None:
        prompt = self.query_one("#prompt", Input)
        prompt.cursor_blink = self.cursor_blink
        prompt.focus()
        self._refresh_panels()
        if self.calibrate_tokens > 0:
            self.ar_note = "calibrating…"
            self._calibrate(self.cfg, self.calibrate_tokens)
        self._refresh_panels()

    def on_resize(self) -> None:
        tall = self.size.height >= 40
        self.query_one(MarginsChart).styles.height = 10 if tall else 6
        self.query_one(StatsPanel).styles.height = 8 if tall else 6

    # ---- workers (threads) ----
    @work(thread=True, group="calibrate", exit_on_error=False)
    def _calibrate(self, cfg: DecodeConfig, tokens: int) -> None:
        try:
            tps = self.engine.calibrate(cfg, tokens)
        except Exception as e:  # noqa: BLE001 - shown in the Stats panel, never raised
            self.post_message(CalibrationDone(None, error_line(e)))
            return
        self.post_message(CalibrationDone(tps))

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
        reason, error = "done", None
        try:
            for block in gen:
                self._buffer.put(turn, block)
                self.post_message(BlocksReady(turn))
                if self._stop.is_set():
                    reason = "stopped"
                    break
        except Exception as e:  # noqa: BLE001
            reason, error = "error", error_line(e)
        finally:
            gen.close()
        self.post_message(TurnFinished(turn, reason, error))

    # ---- messages from the workers ----
    def on_calibration_done(self, message: CalibrationDone) -> None:
        self.ar_tps = message.ar_tps
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

    def on_turn_finished(self, message: TurnFinished) -> None:
        self._drain()
        turn = self.turns[message.turn]
        turn.status = message.reason
        turn.answer.finish()
        ids = [t for b in turn.blocks for t in b.emitted]
        if turn.blocks:
            self.messages.append({"role": "assistant", "content": self.engine.decode(ids)})
        elif self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()                # nothing answered: do not keep the question in the history
        self._render_turn(turn, error=message.error)
        self.generating = False
        self._stop.clear()
        self.refresh_bindings()
        self._refresh_panels()

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
        if at_end:
            log.scroll_end(animate=False)
        self._refresh_panels()

    # ---- drawing ----
    def _render_turn(self, turn: Turn, error: str | None = None) -> None:
        highlight = None
        if self.selected is not None and self.session[self.selected][0] == self.turns.index(turn):
            highlight = self.selected
        text = turn.answer.render(highlight)
        if not turn.answer.pieces and turn.status == "running":
            text = Text("…", Style(dim=True))
        if turn.status in ("stopped", "error", "done"):
            n = sum(len(b.emitted) for b in turn.blocks)
            note = {"done": f"{turn.cfg.strategy} · {n} tokens · {len(turn.blocks)} blocks",
                    "stopped": f"stopped · {n} tokens", "error": "error"}[turn.status]
            text.append(("\n" if text else "") + f"[{note}]", Style(dim=True, italic=True))
        if error:
            text.append("\nerror: ", Style(color="red", bold=True))
            text.append(error, Style(color="red"))
        turn.view.update(text)

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
            margins.show(None, self.cfg.tau_margin)
            stats.show(stats_view([], None, [], self.ar_tps, self.ar_note))
            stats.border_subtitle = self.cfg.strategy
            return
        turn_no, block = cur
        turn = self.turns[turn_no]
        tree.show(block)
        tree.border_subtitle = (f"block {self.selected} selected · l: latest" if self.selected is not None
                                else tree_legend(tree.size.width))
        margins.show(block, turn.cfg.tau_margin)
        upto = turn.blocks[: turn.blocks.index(block) + 1] if self.selected is not None else turn.blocks
        session = [b for _, b in self.session]
        idx = self.selected if self.selected is not None else len(session) - 1
        stats.show(stats_view(upto, block, session, self.ar_tps, self.ar_note, highlight=idx))
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
        log = self.query_one("#log", VerticalScroll)
        user = Static(Text("› " + text), classes="user")
        view = AnswerView(Text("…", Style(dim=True)), classes="answer")
        log.mount(user)
        log.mount(view)
        log.scroll_end(animate=False)
        turn_no = len(self.turns)
        self.turns.append(Turn(prompt=text, cfg=self.cfg, answer=AnswerText(self.engine.tokens, "app.select_block"),
                               view=view))
        self.messages.append({"role": "user", "content": text})
        self.generating = True
        self._stop.clear()
        self.selected = None
        self.refresh_bindings()
        self._run_turn(turn_no, list(self.messages), self.cfg)

    # ---- actions ----
    def check_action(self, action: str, parameters) -> bool | None:
        if action == "stop":
            return True if self.generating else False     # idle: ctrl+c falls through (copy / quit hint)
        return True

    def action_stop(self) -> None:
        if self.generating:
            self._stop.set()
            self.notify("stopping after this block…", timeout=2)

    def action_stop_or_leave(self) -> None:
        if self.generating:
            self.action_stop()
        elif isinstance(self.focused, Input):
            self.query_one("#log").focus()

    def action_focus_input(self) -> None:
        self.query_one("#prompt", Input).focus()

    def action_help(self) -> None:
        legend = Text("answer tokens: ")
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
            self.notify(f"strategy: {candidate} (from the next turn)", timeout=2)
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
        """Write every turn so far (a running one too, as 'interrupted') with TraceWriter."""
        from cure_core.trace import TraceWriter
        if self.save_path is None:
            n = 1
            while Path(f"cure-chat-{n}.jsonl").exists():
                n += 1
            self.save_path = Path(f"cure-chat-{n}.jsonl")
        self._drain()
        writer = TraceWriter(self.save_path, models=dict(self.engine.models), config=self.cfg.to_dict())
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

    async def action_quit(self) -> None:
        self._stop.set()
        self.exit()

    def on_unmount(self) -> None:
        self._stop.set()             # a running answer ends at its next block; the thread then exits
