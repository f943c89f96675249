"""One chat turn on screen: the answer as Markdown (or coloured by origin), its note line, comparisons.

    TurnView
      Markdown      the answer rendered: headings, lists, highlighted code blocks (shown by default)
      AnswerView    the same tokens coloured by origin: branch 0 / repair / bonus (the origins toggle)
      Static.note   strategy · tokens · blocks · prefill
      CompareView   a re-run of the same prompt with another strategy, side by side (zero or more)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rich import box
from rich.console import Group
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static

from cure_core.block import Block
from cure_core.config import DecodeConfig
from cure_core.metrics import common_prefix

from ..chat_sessions import turn_stats
from .widgets import AnswerText, AnswerView


class TurnView(Vertical):
    DEFAULT_CSS = """
    TurnView { height: auto; margin: 0 0 1 0; }
    TurnView > Markdown { margin: 0; padding: 0; background: transparent; }
    TurnView > Markdown > MarkdownParagraph { margin: 0 0 1 0; }
    TurnView > Markdown > MarkdownFence { margin: 0 0 1 0; max-height: 40; }
    TurnView > AnswerView { display: none; }
    TurnView.origins > Markdown { display: none; }
    TurnView.origins > AnswerView { display: block; }
    TurnView > .note { color: $text-muted; text-style: italic; }
    TurnView.edited { opacity: 60%; }
    TurnView > CompareView { margin: 1 0 0 0; height: auto; border: round $primary-darken-2; padding: 0 1; }
    """

    def __init__(self, origins: bool, markdown: str = "", compared: tuple["CompareView", ...] = (), **kwargs):
        """`compared`: comparisons shown from the start (a resumed chat's); live ones are mounted later."""
        super().__init__(**kwargs)
        self.markdown = Markdown(markdown, classes="answer-md")
        self.answer = AnswerView(Text("…", Style(dim=True)), classes="answer")
        self.note = Static("", classes="note")
        self.compared = compared
        self.set_class(origins, "origins")

    def compose(self) -> ComposeResult:
        yield self.markdown
        yield self.answer
        yield self.note
        yield from self.compared


@dataclass
class Comparison:
    """A re-run of a turn's prompt with another strategy."""
    strategy: str
    cfg: DecodeConfig
    view: "CompareView"
    blocks: list[Block] = field(default_factory=list)
    status: str = "running"               # running | done | stopped | error
    error: str | None = None
    saved_stats: dict | None = None       # a resumed comparison: its saved stats and verdict
    saved_identical: bool | None = None

    @property
    def stats(self) -> dict:
        return turn_stats(self.blocks) if self.blocks else (self.saved_stats or {})


@dataclass
class Turn:
    prompt: str
    cfg: DecodeConfig
    answer: AnswerText
    view: TurnView
    messages: list[dict]                  # the conversation it answered (the user's prompt last)
    history_len: int                      # len(app.messages) before this turn joined the history
    prompt_ids: list[int] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    status: str = "running"               # running | done | stopped | error
    error: str | None = None
    md_source: str = ""                   # the text the Markdown view shows so far
    edited: bool = False                  # replaced by an edited prompt
    comparisons: list[Comparison] = field(default_factory=list)
    saved_stats: dict | None = None       # a resumed turn without its blocks: the stats it was saved with
    saved_answer: str | None = None       # ...and its answer text
    ar_tps: float | None = None           # the AR reference measured right after this turn (its "vs AR")

    @property
    def token_ids(self) -> list[int]:
        return [t for b in self.blocks for t in b.emitted]

    @property
    def stats(self) -> dict:
        return turn_stats(self.blocks) if self.blocks else (self.saved_stats or {})


def turn_note(turn: Turn) -> Text:
    """The dim line under an answer: what ran, and how much of the prompt was prefilled."""
    st = turn.stats
    if turn.status == "running":
        return Text("")
    parts = {"done": [turn.cfg.strategy], "stopped": ["stopped"], "error": ["error"]}[turn.status]
    if st:
        parts += [f"{st['tokens']} tokens", f"{st['blocks']} blocks"]
        if st.get("prefill_tokens") or st.get("reused_tokens"):
            parts.append(f"prefill {st['prefill_ms']:.0f} ms: {st['prefill_tokens']} new tokens, "
                         f"{st['reused_tokens']} cached")
    t = Text(f"[{' · '.join(parts)}]", Style(dim=True, italic=True))
    if turn.edited:
        t.append("  (edited: no longer in the conversation)", Style(dim=True))
    if turn.error:
        t.append("\nerror: ", Style(color="red", bold=True))
        t.append(turn.error, Style(color="red"))
    return t


def identical_line(a: list[int], b: list[int], temperature: float) -> Text:
    """Whether two runs emitted the same tokens, in words. Rule: at temperature 0 every strategy must
    emit ar's tokens (lossless); a difference there is a bug, and says so."""
    if a == b:
        return Text(f"✓ identical outputs ({len(a)} tokens)", Style(color="green", bold=True))
    at = common_prefix(a, b)
    if temperature > 0:
        return Text(f"outputs differ from token {at} (temperature {temperature:g} samples: not expected to match)",
                    Style(color="yellow"))
    return Text(f"✗ outputs differ at token {at}: a lossless decoder must not", Style(color="red", bold=True))


def compare_renderable(first: str, first_stats: dict, second: str, second_stats: dict, verdict: Text):
    """Two runs of one prompt side by side: tok/s, tau, tree size, blocks, tokens, prefill; then the verdict."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False, expand=False)
    table.add_column("same prompt", style="dim")
    table.add_column(first, justify="right")
    table.add_column(second, justify="right")
    rows = (("tok/s", "tokens_per_s", "{:.1f}"), ("τ", "tau", "{:.2f}"), ("tree V", "mean_tree_size", "{:.1f}"),
            ("blocks", "blocks", "{}"), ("tokens", "tokens", "{}"), ("prefill ms", "prefill_ms", "{:.0f}"))
    for label, key, fmt in rows:
        cells = [fmt.format(st[key]) if key in st else "-" for st in (first_stats, second_stats)]
        table.add_row(label, *cells)
    return Group(table, verdict)


class CompareView(Static):
    """Live while the re-run streams; the table once it ends."""
