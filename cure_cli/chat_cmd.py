"""`cure chat`: the Textual TUI. Type a prompt, watch the answer stream in with its repair trees."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from cure_core.config import DecodeConfig
from cure_core.options import EngineArgs

from .chat_sessions import MODEL_FIELDS, find_session, list_sessions, sessions_dir
from .common import fail, friendly_errors, open_models, quiet_transformers
from .options import engine_options


def needs_terminal(command: str) -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        fail(f"`cure {command}` is an interactive terminal app and needs a terminal "
             f"(for scripts use `cure generate` / `cure analyze`)")


def list_chats() -> None:
    """The saved chats, the most recent first: ID, last update, turns, models, first prompt."""
    from rich.console import Console
    from rich.table import Table
    folder = sessions_dir()
    chats = list_sessions(folder)
    console = Console()
    if not chats:
        console.print(f"no saved chats in {folder}", highlight=False)
        return
    table = Table(title=f"Saved chats ({folder}); resume one with `cure chat --resume ID`", expand=True)
    table.add_column("ID", no_wrap=True, min_width=len(chats[0].id))          # never cut: it is what you type
    table.add_column("updated", no_wrap=True, min_width=16)
    table.add_column("turns", justify="right", no_wrap=True)
    table.add_column("models", ratio=1, overflow="fold")
    table.add_column("first prompt", ratio=1)
    for c in chats:
        short = {k: Path(v).name if v and Path(v).is_absolute() else v for k, v in c.models.items()}
        models = (short.get("target") or "?") + (f" ← {short['draft']}" if short.get("draft") else "")
        table.add_row(c.id, c.updated[:16].replace("T", " "), str(len(c.turns)), models, c.title)
    console.print(table)


def resumed_options(args: EngineArgs, record) -> tuple[EngineArgs, bool]:
    """The options a resumed chat opens with. Rules: the models (MODEL_FIELDS) are the saved ones unless
    given again; the saved decoding settings come back unless a decoding flag is given (returned flag)."""
    defaults = EngineArgs()
    saved = {f: record.engine[f] for f in MODEL_FIELDS
             if f in record.engine and getattr(args, f) == getattr(defaults, f)}
    given = [f for f in EngineArgs.__dataclass_fields__ if f not in MODEL_FIELDS
             and getattr(args, f) != getattr(defaults, f)]
    return args.with_(**saved), not given


@friendly_errors
@engine_options()
def chat(
    session: Annotated[Optional[str], typer.Argument(help="With --resume: the saved chat to continue (an ID from --list, or its start; default: the latest).", show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a saved chat (the latest, or SESSION): its conversation, models and settings.")] = False,
    list_saved: Annotated[bool, typer.Option("--list", help="List the saved chats and exit.")] = False,
    history: Annotated[bool, typer.Option("--history/--no-history", help="Save this conversation as it goes (turns, settings, stats, trace) under the user data directory ($CURE_DATA overrides it).")] = True,
    baseline_tps: Annotated[Optional[float], typer.Option("--baseline-tps", help="AR tokens/s for the speedup figure (skips the AR runs after each answer).")] = None,
    calibrate_tokens: Annotated[int, typer.Option("--calibrate-tokens", help="Tokens of the short AR run after each answer that the 'vs AR' speedup divides by, measured on its own engine under that answer's load (0: none).")] = 8,
    replay: Annotated[Optional[Path], typer.Option("--replay", help="Replay the generations of this trace instead of running a model (no model is loaded).")] = None,
    replay_delay: Annotated[float, typer.Option("--replay-delay", help="Seconds between replayed blocks.")] = 0.05,
    save: Annotated[Optional[Path], typer.Option("--save", help="Where `s` / ctrl+s saves the session trace (default: ./cure-chat-N.jsonl).")] = None,
    *, args: EngineArgs,
) -> None:
    """Chat in a terminal UI: answers as Markdown (or coloured by origin), the repair tree, margins and live
    stats; each turn prefills only its new tokens; every conversation is saved (--list, --resume)."""
    quiet_transformers()
    from cure_core.config import STRATEGIES

    from .tui.engine_protocol import ModelEngine, ReplayEngine, load_trace_tokenizer

    if list_saved:
        list_chats()
        return
    if session is not None and not resume:
        fail(f"give --resume to continue a saved chat: cure chat --resume {session}")
    record = None
    if resume:
        if replay is not None:
            fail("--resume continues a saved chat with its models; it does not combine with --replay")
        record = find_session(session)
        args, restore_settings = resumed_options(args, record)
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
        if record is not None and restore_settings and record.settings:
            cfg = DecodeConfig.from_dict(record.settings)
        engine = ModelEngine(loaded)
    cfg = engine.check(cfg)
    needs_terminal("chat")
    from .tui.app_chat import ChatApp
    store = sessions_dir() if history and replay is None else None     # a replay is a demo: nothing to keep
    ChatApp(engine, cfg, baseline_tps=baseline_tps, calibrate_tokens=calibrate_tokens, save_path=save, store=store,
            resume=record, launch={f: getattr(args, f) for f in MODEL_FIELDS}).run()
