"""`cure inspect TRACE.jsonl`: step through the recorded blocks of a trace in a terminal UI."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import fail, friendly_errors, quiet_transformers


@friendly_errors
def inspect(
    trace: Annotated[Path, typer.Argument(help="A trace written by `cure generate --trace`, `cure bench` or `cure chat` (s).")],
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="Decode tokens with this tokenizer (folder or HF id). Default: the trace's target if it loads offline; else token ids are shown.")] = None,
    block: Annotated[int, typer.Option("--block", "-b", help="Start at this block number.")] = 0,
) -> None:
    """Step through a trace block by block: text, repair tree, margins, stats. No model is loaded."""
    quiet_transformers()
    from cure_core.trace import read_trace

    from .chat_cmd import needs_terminal
    from .tui.engine_protocol import load_trace_tokenizer

    data = read_trace(trace)
    n = len(data.blocks)
    if n == 0:
        fail(f"{trace} holds no blocks to inspect")
    if not 0 <= block < n:
        fail(f"--block {block} is out of range: the trace has blocks 0..{n - 1}")
    tok = load_trace_tokenizer(data.header.get("models") or {}, tokenizer)
    needs_terminal("inspect")
    from .tui.app_inspect import InspectApp
    InspectApp(data, tok, source=str(trace), start=block).run()
