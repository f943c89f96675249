"""`cure chat`: the Textual TUI. Type a prompt, watch the answer stream in with its repair trees."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import (DraftVocabN, resolve_draft_vocab, BMax, Compile, KVCache, Kernels, DType, Device, DeviceMap, Draft, DrafterKind, K, MaskTokenId, MaxNew, Seed, Strategy,
                     Target, TauMargin, Temperature, VMax, decode_config, drafter_block_size, err_console, fail, friendly_errors, load_kernels,
                     quiet_transformers)
from .defaults import default_models


def needs_terminal(command: str) -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        fail(f"`cure {command}` is an interactive terminal app and needs a terminal "
             f"(for scripts use `cure generate` / `cure analyze`)")


@friendly_errors
def chat(
    target: Target = None,
    draft: Draft = None,
    drafter: DrafterKind = "auto",
    mask_token_id: MaskTokenId = None,
    strategy: Strategy = "cure",
    max_new_tokens: MaxNew = 256,
    temperature: Temperature = 0.0,
    seed: Seed = 0,
    k: K = None,
    tau_margin: TauMargin = 1.0,
    b_max: BMax = 5,
    v_max: VMax = "auto",
    kv_cache: KVCache = "static",
    compile: Compile = False,
    kernels: Kernels = "auto",
    draft_vocab: DraftVocabN = "auto",
    device: Device = "cpu",
    dtype: DType = "float32",
    device_map: DeviceMap = None,
    chat_template: Annotated[Optional[bool], typer.Option("--chat/--raw", help="Use the chat template (default when the tokenizer has one) or raw text turns.")] = None,
    baseline_tps: Annotated[Optional[float], typer.Option("--baseline-tps", help="AR tokens/s for the speedup figure (skips the start-up AR calibration).")] = None,
    calibrate_tokens: Annotated[int, typer.Option("--calibrate-tokens", help="Tokens of the start-up AR calibration run (0: none).")] = 8,
    replay: Annotated[Optional[Path], typer.Option("--replay", help="Replay the generations of this trace instead of running a model (no model is loaded).")] = None,
    replay_delay: Annotated[float, typer.Option("--replay-delay", help="Seconds between replayed blocks.")] = 0.05,
    save: Annotated[Optional[Path], typer.Option("--save", help="Where `s` / ctrl+s saves the session trace (default: ./cure-chat-N.jsonl).")] = None,
) -> None:
    """Chat in a terminal UI: streamed answers coloured by origin, the repair tree, margins and live stats."""
    quiet_transformers()
    from .tui.engine_protocol import ModelEngine, ReplayEngine, load_trace_tokenizer

    cfg = decode_config(strategy, max_new_tokens, temperature, seed, k, tau_margin, b_max, v_max, kv_cache=kv_cache, compile=compile)
    if replay is not None:
        from cure_core.trace import read_trace
        trace = read_trace(replay)
        # --target names the tokenizer to decode with; else the trace header's target if it loads offline.
        tok = load_trace_tokenizer(trace.header.get("models") or {}, target)
        engine = ReplayEngine(trace, tok, delay=max(0.0, replay_delay))   # AR baseline: an ar run in the trace
    else:
        from cure_core.models import load_pair
        target, draft, note = default_models(target, draft, cfg.strategy)
        if note:
            err_console.print(f"[yellow]note:[/] {note.message}")
            cfg = cfg.with_(strategy=note.strategy)
        needs_terminal("chat")
        err_console.print(f"[dim]loading {target}{' + ' + draft if draft else ''}…[/]")
        loaded = load_pair(target, draft, drafter=drafter, mask_token_id=mask_token_id,
                           device=device, dtype=dtype, device_map=device_map,
                           kernels=load_kernels(kernels, compile),
                           draft_vocab=resolve_draft_vocab(draft_vocab, device, device_map))
        if k is None and (trained := drafter_block_size(loaded.pair)):
            cfg = cfg.with_(k=trained)                   # draft the block length the drafter was trained for
        engine = ModelEngine(loaded, chat=chat_template)   # a PARD drafter doubles as the `sd` chain drafter
    cfg = engine.check(cfg)
    needs_terminal("chat")
    from .tui.app_chat import ChatApp
    ChatApp(engine, cfg, baseline_tps=baseline_tps, calibrate_tokens=calibrate_tokens, save_path=save).run()
