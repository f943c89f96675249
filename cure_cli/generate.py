"""`cure generate PROMPT`: stream one answer to the terminal, or print one JSON object."""
from __future__ import annotations

import json
import sys
from contextlib import closing
from pathlib import Path
from typing import Annotated, Optional

import typer

from cure_core.options import EngineArgs
from cure_core.prompt_text import check_text

from .common import err_console, fail, friendly_errors, open_models, quiet_transformers, sigterm_as_interrupt
from .options import engine_options, with_flags


class TextStream:
    """Decode the growing token list and return only the new text (multi-byte safe)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, ids) -> str:
        self.ids.extend(ids)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):          # an incomplete UTF-8 sequence: wait for the next block
            return ""
        delta, self.text = text[len(self.text):], text
        return delta

    def flush(self) -> str:
        """Whatever is left at the end, incomplete bytes included."""
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        delta, self.text = text[len(self.text):], text
        return delta


def check_trace_path(trace: Path) -> None:
    """Fail before loading anything when the trace cannot be written."""
    if trace.is_dir():
        fail(f"--trace {trace} is a directory; give a file path")
    parent = trace.expanduser().resolve().parent
    if not parent.is_dir():
        fail(f"--trace {trace}: the folder {parent} does not exist")


@friendly_errors
@engine_options()
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt text ('-' reads it from standard input).")],
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write every Block to this JSONL trace (for `cure inspect`).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object instead of streaming text.")] = False,
    *, args: EngineArgs,
) -> None:
    """Generate text with one decoding strategy; streams tokens as blocks are accepted."""
    quiet_transformers()
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        fail("the prompt is empty")
    prompt = check_text(prompt)                          # before anything loads: one line, not three
    if trace is not None:
        check_trace_path(trace)
    loaded = open_models(args)
    stream = TextStream(loaded.tokenizer)
    blocks = []
    with sigterm_as_interrupt(), closing(loaded.stream(prompt, trace=trace)) as generation:
        for block in generation:                         # `kill` keeps what was generated, like Ctrl+C
            blocks.append(block)
            if not as_json and (delta := stream.push(block.emitted)):
                sys.stdout.write(delta)
                sys.stdout.flush()
    out = loaded.generation(blocks)
    if as_json:
        print(json.dumps(out.to_dict()))
        return
    stats = out.stats
    sys.stdout.write(stream.flush() + "\n")
    err_console.print(
        f"[dim]{out.strategy}: {stats.new_tokens} tokens in {stats.blocks} blocks | tau {stats.tau:.2f} | "
        f"{stats.tokens_per_s:.1f} tok/s | TPOT {stats.tpot_ms:.1f} ms | repair wins {stats.repair_win_rate:.0%} | "
        f"mean tree {stats.mean_tree_size:.1f} | prefill {stats.prefill_ms:.0f} ms[/]", highlight=False)
    budget0 = [b for b in blocks if b.meta.get("v_max") == 0]
    if budget0:                      # the tuner's budget 0, in words: what it was chosen over, how to force a tree
        err_console.print(f"[dim]{len(budget0)} of {len(blocks)} blocks drafted nothing: "
                          f"{with_flags(budget0[-1].no_draft_reason)}[/]", highlight=False, soft_wrap=True)
