"""`cure generate PROMPT`: stream one answer to the terminal, or print one JSON object."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from cure_core.metrics import summarize
from cure_core.trace import TraceWriter

from .common import (DraftVocabN, resolve_draft_vocab, BMax, Compile, KVCache, Kernels, DType, Device, DeviceMap, Draft, DrafterKind, K, MaskTokenId, MaxNew, Seed, Strategy,
                     Target, TauMargin, Temperature, VMax, decode_config, drafter_block_size, err_console, fail, friendly_errors, load_kernels,
                     quiet_transformers)
from .defaults import default_models


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


@friendly_errors
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt text ('-' reads it from standard input).")],
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
    chat: Annotated[Optional[bool], typer.Option("--chat/--raw", help="Wrap the prompt in the chat template (default when the tokenizer has one) or send raw text.")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write every Block to this JSONL trace (for `cure inspect`).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object instead of streaming text.")] = False,
) -> None:
    """Generate text with one decoding strategy; streams tokens as blocks are accepted."""
    from cure_core.engine import Engine                    # torch / transformers load here, not at --help
    from cure_core.models import encode_prompt, load_pair
    quiet_transformers()
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        fail("the prompt is empty")
    cfg = decode_config(strategy, max_new_tokens, temperature, seed, k, tau_margin, b_max, v_max, kv_cache=kv_cache, compile=compile)
    target, draft, strategy_note = default_models(target, draft, cfg.strategy)
    if strategy_note:
        err_console.print(f"[yellow]note:[/] {strategy_note.message}")
        cfg = cfg.with_(strategy=strategy_note.strategy)
    draft_vocab = resolve_draft_vocab(draft_vocab, device, device_map)     # "auto" -> a number of ids
    loaded = load_pair(target, draft, drafter=drafter, mask_token_id=mask_token_id,
                       ar_draft=draft if cfg.strategy == "sd" else None, device=device, dtype=dtype,
                       device_map=device_map, kernels=load_kernels(kernels, compile), draft_vocab=draft_vocab)
    if k is None and (trained := drafter_block_size(loaded.pair)):
        cfg = cfg.with_(k=trained)                       # draft the block length the drafter was trained for
    tok = loaded.tokenizer
    use_chat = chat if chat is not None else bool(getattr(tok, "chat_template", None))
    ids = encode_prompt(tok, prompt, use_chat)
    engine = Engine(loaded.pair, cfg)
    stream = TextStream(tok)
    blocks = []
    writer = TraceWriter(trace, models=loaded.pair.names, config=cfg.to_dict()) if trace else None
    try:
        if writer:
            writer.begin(ids, prompt, cfg.strategy, cfg.to_dict())
        for block in engine.generate(ids):
            blocks.append(block)
            if writer:
                writer.block(block)
            delta = stream.push(block.emitted)
            if not as_json and delta:
                sys.stdout.write(delta)
                sys.stdout.flush()
        if writer:
            writer.end()
            writer.close()
    except BaseException:
        if writer:
            writer.abort() if not blocks else writer.close("interrupted")
        raise
    stats = summarize(blocks)
    if as_json:
        print(json.dumps({
            "text": stream.tok.decode(stream.ids, skip_special_tokens=True),
            "token_ids": stream.ids,
            "strategy": cfg.strategy,
            "stats": {"tau": stats.tau, "tpot_ms": stats.tpot_ms, "tokens_per_s": stats.tokens_per_s,
                      "blocks": stats.blocks, "new_tokens": stats.new_tokens,
                      "repair_win_rate": stats.repair_win_rate, "mean_tree_size": stats.mean_tree_size},
            "kernels": loaded.kernels,
            "draft_vocab": draft_vocab,
        }))
        return
    sys.stdout.write(stream.flush() + "\n")
    err_console.print(
        f"[dim]{cfg.strategy}: {stats.new_tokens} tokens in {stats.blocks} blocks | tau {stats.tau:.2f} | "
        f"{stats.tokens_per_s:.1f} tok/s | TPOT {stats.tpot_ms:.1f} ms | repair wins {stats.repair_win_rate:.0%} | "
        f"mean tree {stats.mean_tree_size:.1f} | prefill {stats.prefill_ms:.0f} ms[/]", highlight=False)
