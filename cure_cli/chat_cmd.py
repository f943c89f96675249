"""`cure chat`: the Textual TUI. Type a prompt, watch the answer stream in with its repair trees."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from cure_core.options import EngineArgs

from .common import fail, friendly_errors, open_models, quiet_transformers
from .options import engine_options


def needs_terminal(command: str) -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        fail(f"`cure {command}` is an interactive terminal app and needs a terminal "
             f"(for scripts use `cure generate` / `cure analyze`)")


@friendly_errors
@engine_options()
def chat(
    baseline_tps: Annotated[Optional[float], typer.Option("--baseline-tps", help="AR tokens/s for the speedup figure (skips the start-up AR calibration).")] = None,
    calibrate_tokens: Annotated[int, typer.Option("--calibrate-tokens", help="Tokens of the start-up AR calibration run (0: none).")] = 8,
    replay: Annotated[Optional[Path], typer.Option("--replay", help="Replay the generations of this trace instead of running a model (no model is loaded).")] = None,
    replay_delay: Annotated[float, typer.Option("--replay-delay", help="Seconds between replayed blocks.")] = 0.05,
    save: Annotated[Optional[Path], typer.Option("--save", help="Where `s` / ctrl+s saves the session trace (default: ./cure-chat-N.jsonl).")] = None,
    *, args: EngineArgs,
) -> None:
    """Chat in a terminal UI: streamed answers coloured by origin, the repair tree, margins and live stats."""
    quiet_transformers()
    from cure_core.config import STRATEGIES

    from .tui.engine_protocol import ModelEngine, ReplayEngine, load_trace_tokenizer

    if replay is not None:
        from cure_core.trace import read_trace
        cfg = args.decode_config()
        trace = read_trace(replay)
        # --target names the tokenizer to decode with; else the trace header's target if it loads offline.
        tok = load_trace_tokenizer(trace.header.get("models") or {}, args.target)
        engine = ReplayEngine(trace, tok, delay=max(0.0, replay_delay))   # AR baseline: an ar run in the trace
    else:
        needs_terminal("chat")
        loaded = open_models(args, strategies=STRATEGIES)    # every strategy is one key away in the app
        cfg = loaded.config
        engine = ModelEngine(loaded)
    cfg = engine.check(cfg)
    needs_terminal("chat")
    from .tui.app_chat import ChatApp
    ChatApp(engine, cfg, baseline_tps=baseline_tps, calibrate_tokens=calibrate_tokens, save_path=save).run()
