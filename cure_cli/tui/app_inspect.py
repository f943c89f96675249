"""`cure inspect TRACE.jsonl`: step through recorded blocks with no model loaded.

Blocks of every generation in the trace are numbered 0..N-1 in file order. For the selected block:
the text so far with that block highlighted, its Repair tree, its Margins, and Stats up to it.
"""
from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Static

from cure_core.block import Block
from cure_core.metrics import summarize
from cure_core.trace import Trace

from .engine_protocol import trace_dtype
from .tokens import TokenText
from .widgets import (side_panels, TREE_LEGEND, AnswerText, HelpScreen, JumpScreen, MarginsChart, RepairTree,
                      StatsPanel, binding_rows, origin_legend, stats_view, tree_legend)

LEGEND_MARKUP = "[green]branch 0[/] [b magenta u]repair[/] [i cyan]bonus[/] [reverse]current[/]"
# The text panel draws the last this many characters up to the current block (a trace's answer can be of any
# length; drawing it all on every key would stall the keys).
TEXT_MAX_CHARS = 20_000


class InspectApp(App):
    TITLE = "cure inspect"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #main { height: 1fr; }
    .panel { border: round $primary-darken-1; border-title-color: $text; border-title-style: bold;
             border-subtitle-color: $text-muted; }
    #text-panel { width: 1fr; min-width: 30; }
    #info { height: auto; padding: 0 0 1 0; }
    #text-scroll { height: 1fr; scrollbar-size-vertical: 1; }
    #side { width: 1fr; min-width: 30; }
    RepairTree { height: 1fr; scrollbar-size: 1 1; }
    MarginsChart { height: 6; }
    StatsPanel { height: 7; }
    """
    BINDINGS = [
        Binding("n,right,j,space", "step(1)", "Next", tooltip="Next block"),
        Binding("p,left,k", "step(-1)", "Prev", tooltip="Previous block"),
        Binding("home,g", "go_first", "First", show=False, tooltip="First block"),
        Binding("end,G", "go_last", "Last", show=False, tooltip="Last block"),
        Binding("r", "repair(1)", "Next repair win", tooltip="Next block where a repair branch won"),
        Binding("R", "repair(-1)", "Prev repair win", show=False, tooltip="Previous block where a repair branch won"),
        Binding("b,colon", "jump", "Go to #", tooltip="Jump to block N"),
        Binding("question_mark,f1", "help", "Help", tooltip="This list"),
        Binding("q", "quit", "Quit", tooltip="Quit (also ctrl+q)"),
    ]

    def __init__(self, trace: Trace, tokenizer=None, source: str = "", start: int = 0):
        super().__init__()
        self.trace = trace
        self.source = source
        self.tokens = TokenText(tokenizer)
        self.items: list[tuple[int, Block]] = [(g, b) for g, gen in enumerate(trace.generations) for b in gen.blocks]
        self.answers: list[AnswerText] = []
        key = 0
        for gen in trace.generations:
            answer = AnswerText(self.tokens)
            for b in gen.blocks:
                answer.add_block(b, key)
                key += 1
            answer.finish()
            self.answers.append(answer)
        ar = [b for g in trace.generations if g.strategy == "ar" for b in g.blocks]
        self.ar_tps = summarize(ar).tokens_per_s if ar else None
        self.ar_dtype = trace_dtype(trace.header)
        self.current = max(0, min(start, len(self.items) - 1))

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="text-panel", classes="panel") as panel:
                panel.border_title = "Text"
                panel.border_subtitle = LEGEND_MARKUP
                yield Static(id="info")
                with VerticalScroll(id="text-scroll"):
                    yield Static(id="text")
            with Vertical(id="side"):
                yield from side_panels(self.tokens)
        yield Footer()

    def on_mount(self) -> None:
        self.show(self.current)

    def on_resize(self) -> None:
        tall = self.size.height >= 40
        self.query_one(MarginsChart).styles.height = 10 if tall else 6
        self.query_one(StatsPanel).styles.height = 8 if tall else 7

    # ---- drawing ----
    @property
    def block(self) -> Block:
        return self.items[self.current][1]

    def show(self, index: int) -> None:
        if not self.items:
            return
        self.current = index = max(0, min(index, len(self.items) - 1))
        g, block = self.items[index]
        gen = self.trace.generations[g]
        pos = gen.blocks.index(block)
        tau = float(gen.config.get("tau_margin", self.trace.header.get("config", {}).get("tau_margin", 1.0)))

        info = Text(no_wrap=False)
        info.append(f"block {index}", Style(bold=True))
        info.append(f" of {len(self.items)}")
        if len(self.trace.generations) > 1:
            info.append(f" · generation {g + 1}/{len(self.trace.generations)} #{block.index}")
        info.append(f" · {gen.strategy}")
        k = gen.config.get("k")
        if k:
            info.append(f" K={k}")
        if block.repair_won:
            info.append(f" · repair won +{block.delta_a}", Style(color="magenta", bold=True))
        tm = block.timings
        info.append(f"\ndraft {tm.draft_ms:.1f} · tree {tm.tree_ms:.1f} · verify {tm.verify_ms:.1f} · "
                    f"commit {tm.commit_ms:.1f} · learn {tm.learn_ms:.1f} ms", Style(dim=True))
        if block.stop:
            info.append(f" · stop: {block.stop}", Style(color="yellow"))
        self.query_one("#info", Static).update(info)

        text = Text()
        if gen.prompt:
            text.append(gen.prompt + "\n", Style(dim=True, italic=True))
        elif gen.prompt_ids:
            text.append(self.tokens.display(gen.prompt_ids[-64:]) + "\n", Style(dim=True, italic=True))
        text.append("─" * 8 + "\n", Style(dim=True))
        text.append_text(self.answers[g].render(highlight=index, upto=index, last=TEXT_MAX_CHARS))
        self.query_one("#text", Static).update(text)
        scroll = self.query_one("#text-scroll", VerticalScroll)
        self.call_after_refresh(scroll.scroll_end, animate=False)

        tree = self.query_one(RepairTree)
        tree.show(block)
        tree.scroll_home(animate=False)
        tree.border_subtitle = tree_legend(tree.size.width)
        self.query_one(MarginsChart).show(block, tau)
        upto = gen.blocks[: pos + 1]
        stats = self.query_one(StatsPanel)
        stats.show(stats_view(upto, block, upto, self.ar_tps, "from this trace's ar run" if self.ar_tps else "",
                              highlight=pos, spark=gen.blocks, ar_dtype=self.ar_dtype))
        stats.border_subtitle = f"up to block {index}"
        self.query_one("#text-panel").border_subtitle = (
            LEGEND_MARKUP if self.size.width >= 100 else f"block {index}/{len(self.items) - 1}")

    # ---- actions ----
    def action_step(self, step: int) -> None:
        self.show(self.current + step)

    def action_go_first(self) -> None:
        self.show(0)

    def action_go_last(self) -> None:
        self.show(len(self.items) - 1)

    def action_repair(self, direction: int) -> None:
        i = self.current + direction
        while 0 <= i < len(self.items):
            if self.items[i][1].repair_won:
                self.show(i)
                return
            i += direction
        self.notify(f"no {'later' if direction > 0 else 'earlier'} block where a repair branch won", timeout=2)

    def action_jump(self) -> None:
        def done(n: int | None) -> None:
            if n is not None:
                self.show(n)
        self.push_screen(JumpScreen(len(self.items) - 1), done)

    def action_help(self) -> None:
        legend = Text("text: ")
        legend.append_text(origin_legend())
        legend.append(" current block reversed")
        legend.append("\ntree: " + TREE_LEGEND + "\nmargins: bars per drafted position, ╌ = τ_margin, ▲ = UFP")
        self.push_screen(HelpScreen(binding_rows(self.BINDINGS), legend))
