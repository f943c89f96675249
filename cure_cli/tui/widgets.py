"""The panels both apps share: Repair tree, Margins bar chart, Stats with a sparkline, and the
answer text coloured by where each token came from.

Every panel is drawn from Block records only (plus a TokenText for readable tokens), so chat (live)
and inspect (a trace) show exactly the same thing for the same block. Nothing relies on colour alone:
accepted / rejected / unreached nodes carry ✓ / ✗ / ·, the winning branch a ★, UFPs a ◆ / ▲.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Sequence

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import ScrollableContainer, Vertical
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Input, Label, Static

from cure_core.block import Block
from cure_core.metrics import summarize

from ..options import with_flags

from .tokens import PieceStream, TokenText

# ---- token origins (Conversation / Text colouring) ----------------------------------------------

ORIGIN_STYLES = {
    "branch0": Style(color="green"),
    "repair": Style(color="magenta", bold=True, underline=True),
    "bonus": Style(color="cyan", italic=True),
}
ORIGIN_NAMES = {"branch0": "branch 0", "repair": "repair", "bonus": "bonus"}
CURRENT_BLOCK = Style(reverse=True)


def token_origins(block: Block) -> list[str]:
    """Origin of each emitted token: 'branch0' (drafted block), 'repair' (a repair branch's node) or
    'bonus' (the target's own token after the winning path)."""
    out = []
    for j, _ in enumerate(block.emitted):
        if j < len(block.accepted):
            out.append("branch0" if block.nodes[block.accepted[j]].branch == 0 else "repair")
        else:
            out.append("bonus")
    return out


def origin_legend() -> Text:
    t = Text()
    for key in ("branch0", "repair", "bonus"):
        if t:
            t.append(" ")
        t.append(ORIGIN_NAMES[key], ORIGIN_STYLES[key])
    return t


class AnswerText:
    """A growing, coloured answer: blocks are appended as they arrive; each token keeps its block so
    one block can be highlighted (inspect) or clicked (chat: select it for the tree)."""

    def __init__(self, tokens: TokenText, click_action: str | None = None):
        self.tokens = tokens
        self.stream: PieceStream = tokens.stream()
        self.pieces: list[tuple[str, str, int]] = []     # (text, origin, block key)
        self.click_action = click_action

    def add_block(self, block: Block, key: int) -> None:
        for tok, origin in zip(block.emitted, token_origins(block)):
            piece = self.stream.push(tok)
            if piece:
                self.pieces.append((piece, origin, key))

    @property
    def text(self) -> str:
        """The answer so far as plain text (the Markdown view's source)."""
        return "".join(piece for piece, _, _ in self.pieces)

    def finish(self) -> None:
        rest = self.stream.flush()
        if rest:
            key = self.pieces[-1][2] if self.pieces else -1
            self.pieces.append((rest, "bonus", key))

    def render(self, highlight: int | None = None, upto: int | None = None, last: int | None = None) -> Text:
        """The answer; the block `highlight` reversed; only blocks up to `upto` when given; only about its
        `last` characters when given (a line says how many earlier ones are not drawn)."""
        text = Text()
        links: dict[int, Style] = {}
        end = len(self.pieces)
        if upto is not None:
            end = next((i for i, (_, _, key) in enumerate(self.pieces) if key > upto), end)
        start, kept = end, 0
        if last is None:
            start = 0
        else:
            while start > 0 and kept + len(self.pieces[start - 1][0]) <= last:
                start -= 1
                kept += len(self.pieces[start][0])
            if start > 0:
                skipped = sum(len(piece) for piece, _, _ in self.pieces[:start])
                text.append(f"… {skipped} earlier characters not drawn\n", Style(dim=True))
        for piece, origin, key in self.pieces[start:end]:
            style = ORIGIN_STYLES[origin]
            if highlight is not None and key == highlight:
                style = style + CURRENT_BLOCK
            if self.click_action:
                link = links.get(key)
                if link is None:        # one Style per block: hovering lights up the whole block
                    link = links[key] = Style(meta={"@click": f"{self.click_action}({key})"})
                style = style + link
            text.append(piece, style)
        return text


class AnswerView(Static):
    """An answer whose tokens are links to their blocks, keeping the origin colours (no link colour)."""

    @property
    def link_style(self) -> Style:
        return Style()

    @property
    def link_style_hover(self) -> Style:
        return Style(underline=True, bold=True)


# ---- Repair tree ---------------------------------------------------------------------------------

MARK = {"acc": "✓", "rej": "✗", "skip": "·"}
NODE_STYLES = {"acc": Style(color="green", bold=True), "rej": Style(color="red"), "skip": Style(dim=True)}


def node_states(block: Block) -> list[str]:
    """acc: on the winning path; rej: verified (parent accepted) but the target disagreed;
    skip: below a rejected node, never compared."""
    out = []
    for n in block.nodes:
        if n.accepted:
            out.append("acc")
        elif n.parent == -1 or block.nodes[n.parent].accepted:
            out.append("rej")
        else:
            out.append("skip")
    return out


def branch_name(b: int) -> str:
    return "b0" if b == 0 else f"r{b}"


REASON_WIDTH = 40          # columns a no-draft reason wraps at in the tree panel
# What one tree panel draws at most (a trace may hold a block of any size): depth rows, branch columns,
# tokens of the collapsed accepted prefix, UFP lines. Past these a line says how much is not drawn, so a
# huge block renders in bounded time and the keys stay live.
TREE_MAX_ROWS = 200
TREE_MAX_BRANCHES = 24
TREE_MAX_PREFIX = 48
TREE_MAX_UFPS = 8


def render_tree(block: Block | None, tokens: TokenText, cell: int = 8) -> Text:
    """Branch 0 and each repair branch as columns, depth as rows; ✓ accepted (bold), ✗ rejected,
    · not reached (dim); the winner's column ★; UFP rows ◆ with margin and budget."""
    t = Text(no_wrap=True, overflow="ignore")
    if block is None:
        t.append("no block yet: type a prompt and press Enter", Style(dim=True))
        return t
    lab = tokens.label
    t.append(f"block {block.index}", Style(bold=True))
    t.append(f" · {block.strategy} · V {block.tree_size} · root ")
    t.append(lab(block.root, 12), Style(bold=True))
    t.append("\n")
    a = block.accept_length
    winner = block.winner if a else None
    t.append(f"accepted {a}", NODE_STYLES["acc"] if a else Style())
    t.append(" +bonus ")
    t.append(lab(block.bonus, 12), ORIGIN_STYLES["bonus"])
    if not block.nodes:
        # the panel scrolls sideways (no wrap): a reason in words is wrapped here, to a narrow panel's width
        reason = textwrap.wrap(f"no draft tree: {with_flags(block.no_draft_reason)}", REASON_WIDTH)
        t.append("\n" + "\n".join(reason), Style(dim=True))
        return t
    if winner is not None:
        won = block.repair_won
        t.append(" · ")
        t.append(f"★{branch_name(winner)}", Style(bold=True, reverse=won, color="magenta" if won else "green"))
        if won:
            t.append(f" +{block.delta_a} vs b0", Style(color="magenta", bold=True))
    else:
        t.append(" · none accepted", Style(color="red"))
    ufp_depths = {}
    for n_ufp, u in enumerate(block.ufps):
        ufp_depths[u.position + 1] = u
        if n_ufp == TREE_MAX_UFPS:
            t.append(f"\n◆ … {len(block.ufps) - TREE_MAX_UFPS} more UFPs", Style(color="yellow", dim=True))
        if n_ufp >= TREE_MAX_UFPS:
            continue
        t.append("\n◆ ", Style(color="yellow", bold=True))
        t.append(f"UFP d{u.position + 1} m={u.margin:.2f} b={u.budget}", Style(color="yellow"))
        if u.alternatives:
            t.append(" alts " + " ".join(lab(c, 6) for c in u.alternatives), Style(dim=True))
    if block.meta.get("redraft") == "skipped":       # redraft_price.py: why no repair is re-drafted
        v = block.meta.get("v_max")                  # absent at a fixed budget (no tuner)
        at = f"at V {v}" if v is not None else "at this budget"
        t.append(f"\nre-draft pass skipped: {at} it has not paid for its time", Style(dim=True))

    states = node_states(block)
    all_branches = sorted({n.branch for n in block.nodes})
    cols: dict[int, dict[int, list[int]]] = {b: {} for b in all_branches}
    for i, n in enumerate(block.nodes):
        cols[n.branch].setdefault(n.depth, []).append(i)
    # Rule: past TREE_MAX_BRANCHES columns, branch 0 and the winner are drawn first, then the lowest.
    first = [b for b in (0, winner) if b in cols]
    branches = sorted({*first, *[b for b in all_branches if b not in first][:TREE_MAX_BRANCHES - len(first)]})
    fork = {b: min(cols[b]) for b in branches}
    max_depth = max(n.depth for n in block.nodes)

    # A run of accepted depths that only branch 0 holds (the shared prefix before any fork) is one row:
    # it keeps the forks in view in a small terminal.
    prefix = 0
    while (prefix + 1 <= max_depth and prefix + 1 not in ufp_depths
           and all(b == 0 or prefix + 1 not in cols[b] for b in branches)
           and 0 in branches and prefix + 1 in cols[0] and states[cols[0][prefix + 1][0]] == "acc"):
        prefix += 1
    if prefix < 3:
        prefix = 0
    last_row = min(max_depth, prefix + TREE_MAX_ROWS)
    drawn = [cols[b][d][0] for b in branches for d in range(prefix + 1, last_row + 1) if d in cols[b]]
    width = min(cell, max((len(lab(block.nodes[i].token)) for i in drawn), default=1)) + 1   # marker + token
    width = max(width, 3)

    t.append("\n     ")
    for b in branches:
        name = branch_name(b) + ("★" if b == winner else "")
        style = Style(bold=True, reverse=True) if b == winner else Style(bold=True, dim=b != 0 and b != winner)
        t.append(name.ljust(width)[:width], style)
        t.append(" ")
    if prefix:
        t.append("\n")
        t.append(f"1-{prefix}".rjust(4) + " ", Style(dim=True))
        t.append(MARK["acc"] + "│".join(lab(block.nodes[cols[0][d][0]].token, cell)
                                        for d in range(1, min(prefix, TREE_MAX_PREFIX) + 1)), NODE_STYLES["acc"])
        if prefix > TREE_MAX_PREFIX:
            t.append(f"│… {prefix - TREE_MAX_PREFIX} more", Style(dim=True))
    for d in range(prefix + 1, last_row + 1):
        t.append("\n")
        u = ufp_depths.get(d)
        t.append(f"{d:>4}", Style(dim=u is None))
        t.append("◆" if u else " ", Style(color="yellow", bold=True))
        for b in branches:
            own = cols[b].get(d)
            if own:
                i = own[0]
                st = states[i]
                body = MARK[st] + lab(block.nodes[i].token, width - 1)
                style = NODE_STYLES[st]
                if st == "acc" and block.nodes[i].branch != 0:
                    style = style + Style(color="magenta")
                t.append(body.ljust(width), style)
            elif d < fork[b]:
                t.append("┆".ljust(width), Style(dim=True))
            else:
                t.append(" " * width)
            t.append(" ")
    hidden = [f"depths {last_row + 1}-{max_depth}"] if last_row < max_depth else []
    if len(branches) < len(all_branches):
        hidden.append(f"{len(all_branches) - len(branches)} of {len(all_branches)} branches")
    if hidden:
        t.append(f"\n… not drawn: {' and '.join(hidden)} ({len(block.nodes)} nodes in all)", Style(dim=True))
    return t


TREE_LEGEND = "✓ accepted ✗ rejected · not reached ★ winner"
TREE_LEGEND_SHORT = "✓ acc ✗ rej · skip ★ win"


def tree_legend(width: int) -> str:
    return TREE_LEGEND if width >= len(TREE_LEGEND) + 6 else TREE_LEGEND_SHORT


class RepairTree(ScrollableContainer):
    """Scrollable (both ways) view of one block's tree."""

    DEFAULT_CSS = """
    RepairTree { height: 1fr; }
    RepairTree > Static { width: auto; height: auto; }
    """

    def __init__(self, tokens: TokenText, **kwargs):
        super().__init__(**kwargs)
        self.tokens = tokens
        self.block: Block | None = None

    def compose(self) -> ComposeResult:
        yield Static(render_tree(None, self.tokens), id="tree-body")

    def show(self, block: Block | None) -> None:
        if block is self.block and block is not None:
            return
        self.block = block
        self.query_one("#tree-body", Static).update(render_tree(block, self.tokens))


# ---- Margins -------------------------------------------------------------------------------------

BARS = " ▁▂▃▄▅▆▇█"


def render_margins(block: Block | None, tau: float, width: int, height: int) -> Text:
    """Vertical bars, one per drafted position: the top1-top2 draft log-prob margin, with the
    tau_margin threshold as a dashed line; positions under it in yellow, chosen UFPs red and ▲."""
    t = Text(no_wrap=True, overflow="crop")
    if block is None or not block.margins:
        why = ("no block yet" if block is None else "ar: no draft margins" if block.strategy == "ar"
               else f"no draft margins: {with_flags(block.no_draft_reason or 'none recorded')}")
        t.append(why, Style(dim=True))
        return t
    margins = list(block.margins)
    ufps = {u.position: u for u in block.ufps}
    axis = 5
    n = len(margins)
    step = 2 if axis + 2 * n <= width else 1
    shown = min(n, max(1, (width - axis) // step))
    rows = max(1, height - 2)
    finite = [m for m in margins if math.isfinite(m)]
    top = max(finite, default=1.0)
    if tau > 0:
        top = max(tau * 2.0, min(top, tau * 4.0))
    top = top or 1.0
    tau_row = None
    if tau > 0:
        tau_row = min(rows - 1, int(tau / top * rows))     # rows counted from the bottom
    for r in range(rows - 1, -1, -1):
        if r == tau_row:
            t.append(" τ  ┤", Style(color="yellow"))
        elif r == rows - 1:
            t.append(f"{top:4.1f}"[:4].rjust(4) + "┤", Style(dim=True))
        else:
            t.append("    │", Style(dim=True))
        for p in range(shown):
            m = margins[p]
            level = (m / top) * rows * 8 if math.isfinite(m) else rows * 8
            fill = int(max(0, min(8, round(level - r * 8))))
            if r == 0 and fill == 0 and m > 0:
                fill = 1                                  # a tiny margin still shows
            if p in ufps:
                style = Style(color="red", bold=True)
            elif m < tau:
                style = Style(color="yellow")
            else:
                style = Style(color="green")
            if fill == 0 and r == tau_row:
                t.append("╌" * step, Style(color="yellow", dim=True))
            else:
                ch = BARS[fill]
                if r == rows - 1 and level > rows * 8:
                    ch = "↑"
                t.append(ch, style)
                if step == 2:
                    t.append("╌" if r == tau_row else " ", Style(color="yellow", dim=True))
        t.append("\n")
    t.append("    └", Style(dim=True))
    for p in range(shown):
        if p in ufps:
            t.append("▲", Style(color="red", bold=True))
        else:
            t.append(str((p + 1) % 10), Style(dim=True))
        if step == 2:
            t.append(" ")
    t.append("\n")
    below = sum(m < tau for m in margins)
    legend = f"τ={tau:g} · {below}/{n} under"
    if block.ufps:
        legend += " · ▲ " + " ".join(f"d{u.position + 1} m={u.margin:.2f} b={u.budget}" for u in block.ufps)
    if shown < n:
        legend += f" · {n - shown} more →"
    t.append(legend, Style(dim=True))
    return t


class MarginsChart(Widget):
    DEFAULT_CSS = "MarginsChart { height: 7; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.block: Block | None = None
        self.tau = 1.0

    def show(self, block: Block | None, tau: float) -> None:
        if block is self.block and tau == self.tau and block is not None:
            return
        self.block, self.tau = block, tau
        self.refresh()

    def render(self) -> Text:
        return render_margins(self.block, self.tau, self.content_size.width, self.content_size.height)


# ---- Stats ---------------------------------------------------------------------------------------

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int, highlight: int | None = None) -> Text:
    """One character per value (the last `width`, or a window around `highlight`); highlighted reversed."""
    t = Text(no_wrap=True, overflow="crop")
    if not values or width <= 0:
        return t
    start = max(0, len(values) - width)
    if highlight is not None and not start <= highlight < start + width:
        start = max(0, min(highlight - width // 2, len(values) - width))
    window = values[start:start + width]
    top = max(max(values), 1e-9)
    for i, v in enumerate(window, start=start):
        ch = SPARK[min(7, max(0, int(round(v / top * 7))))]
        t.append(ch, Style(color="cyan", reverse=i == highlight, bold=i == highlight))
    return t


@dataclass
class StatsView:
    items: list[tuple[str, str]]          # (label, value), flowed into lines
    taus: list[float]                     # tau per block, for the sparkline
    highlight: int | None = None          # which sparkline entry is the current block
    note: str = ""                        # one dim line (calibration state...)


def fmt_rate(x: float) -> str:
    return f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def short_dtype(dtype: str) -> str:
    """'float32' -> 'f32', 'bfloat16' -> 'bf16', 'float16' -> 'f16' (others, e.g. 'int8', as they are)."""
    name = str(dtype).removeprefix("torch.")
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(name, name)


def stats_view(blocks: Sequence[Block], latest: Block | None, session: Sequence[Block], ar_tps: float | None,
               ar_note: str = "", highlight: int | None = None, spark: Sequence[Block] | None = None,
               ar_dtype: str | None = None) -> StatsView:
    """`blocks`: the answer (or generation prefix) whose speed is shown; `session`: blocks for the
    running means; `spark`: blocks for the sparkline (default: `session`); `latest`: the block whose
    tau is 'latest'; `ar_dtype`: the dtype the AR reference ran in ('float32'), named short in the speedup's label."""
    ar_dtype = short_dtype(ar_dtype) if ar_dtype else None
    s = summarize(blocks) if blocks else None
    mean = summarize(session) if session else None
    speed = f"{s.tokens_per_s / ar_tps:.2f}x" if ar_tps and s and s.tokens_per_s else "-"
    items = [("tok/s", fmt_rate(s.tokens_per_s) if s else "-"),
             ("TPOT", f"{s.tpot_ms:.1f}ms" if s and s.new_tokens else "-"),
             (f"vs AR {ar_dtype}" if ar_dtype else "vs AR", speed),
             ("τ", (f"{len(latest.emitted)}" if latest else "-") + (f" avg {mean.tau:.2f}" if mean else "")),
             ("wins", f"{mean.repair_win_rate:.0%}" if mean else "-"),
             ("V", f"{mean.mean_tree_size:.1f}" if mean else "-"),
             ("prefill", prefill_text(blocks[0]) if blocks and blocks[0].index == 0 else "-")]
    ar = f"AR{' ' + ar_dtype if ar_dtype else ''} {fmt_rate(ar_tps)} tok/s" if ar_tps else "AR baseline unknown"
    ar_note = f"{ar} ({ar_note})" if ar_note else ar
    spark = session if spark is None else spark
    return StatsView(items=items, taus=[float(len(b.emitted)) for b in spark], highlight=highlight, note=ar_note)


def prefill_text(first: Block) -> str:
    """A generation's prefill (its first block's timings): time, tokens forwarded, tokens the cache gave."""
    t = first.timings
    text = f"{t.prefill_ms:.0f}ms"
    if t.prefill_tokens or t.reused_tokens:
        text += f" {t.prefill_tokens} tok"
    if t.reused_tokens:
        text += f" +{t.reused_tokens} cached"
    return text


class StatsPanel(Widget):
    DEFAULT_CSS = "StatsPanel { height: 7; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.view = StatsView(items=[], taus=[])

    def show(self, view: StatsView) -> None:
        self.view = view
        self.refresh()

    def render(self) -> Text:
        width = max(10, self.content_size.width)
        t = Text(no_wrap=True, overflow="crop")
        line = 0
        for label, value in self.view.items:
            piece = len(label) + 1 + len(value)
            if line and line + 2 + piece > width:
                t.append("\n")
                line = 0
            if line:
                t.append("  ")
                line += 2
            t.append(label + " ", Style(dim=True))
            t.append(value, Style(bold=True))
            line += piece
        if self.view.note:
            t.append("\n")
            t.append(self.view.note, Style(dim=True, italic=True))
        t.append("\nτ/blk ", Style(dim=True))
        t.append_text(sparkline(self.view.taus, width - 6, self.view.highlight))
        return t


# ---- small modal screens shared by both apps -----------------------------------------------------



def key_label(keys: str) -> str:
    names = {"question_mark": "?", "left_square_bracket": "[", "right_square_bracket": "]", "slash": "/",
             "greater_than_sign": ">", "less_than_sign": "<", "colon": ":"}
    return " / ".join(names.get(k.strip(), k.strip()) for k in keys.split(","))


class HelpScreen(ModalScreen[None]):
    """Every key binding of the app, plus the colour/marker legend. Any key closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: auto; max-width: 90%; height: auto; max-height: 90%;
                            border: round $accent; padding: 0 1; background: $surface; }
    HelpScreen Static { width: auto; height: auto; }
    """
    BINDINGS = [Binding("escape,q,question_mark,f1,enter", "dismiss_help", "Close")]

    def __init__(self, bindings: Sequence[tuple[str, str]], legend: Text | None = None):
        super().__init__()
        self.rows = bindings
        self.legend = legend

    def compose(self) -> ComposeResult:
        t = Text(no_wrap=True)
        width = max((len(k) for k, _ in self.rows), default=4)
        for keys, what in self.rows:
            t.append(keys.ljust(width + 2), Style(bold=True, color="yellow"))
            t.append(what + "\n")
        if self.legend is not None:
            t.append("\n")
            t.append_text(self.legend)
        with Vertical() as v:
            v.border_title = "Keys"
            v.border_subtitle = "any key closes"
            yield Static(t)

    def on_key(self, event) -> None:
        event.stop()
        self.dismiss(None)

    def action_dismiss_help(self) -> None:
        self.dismiss(None)


def binding_rows(bindings) -> list[tuple[str, str]]:
    rows = []
    for b in bindings:
        if isinstance(b, Binding) and b.description:
            rows.append((key_label(b.key), b.tooltip or b.description))
    return rows


class JumpScreen(ModalScreen[int | None]):
    """Ask for a block number."""

    DEFAULT_CSS = """
    JumpScreen { align: center middle; }
    JumpScreen > Vertical { width: 40; height: auto; border: round $accent; background: $surface; }
    JumpScreen #jump-error { color: $error; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, last: int):
        super().__init__()
        self.last = last

    def compose(self) -> ComposeResult:
        with Vertical() as v:
            v.border_title = "Jump to block"
            yield Label(f"block number, 0..{self.last}")
            yield Input(placeholder="e.g. 12", type="integer", id="jump-input")
            yield Label("", id="jump-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            n = int(event.value)
        except ValueError:
            self.query_one("#jump-error", Label).update("type a whole number")
            return
        if not 0 <= n <= self.last:
            self.query_one("#jump-error", Label).update(f"no block {n}: blocks are 0..{self.last}")
            return
        self.dismiss(n)

    def action_cancel(self) -> None:
        self.dismiss(None)


def side_panels(tokens) -> ComposeResult:
    """The Repair tree / Margins / Stats column shared by chat and inspect (titles are how people find them)."""
    tree = RepairTree(tokens, id="tree", classes="panel")
    tree.border_title = "Repair tree"
    tree.border_subtitle = TREE_LEGEND_SHORT
    yield tree
    margins = MarginsChart(id="margins", classes="panel")
    margins.border_title = "Margins"
    yield margins
    stats = StatsPanel(id="stats", classes="panel")
    stats.border_title = "Stats"
    yield stats
