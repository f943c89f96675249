"""What the chat app drives: anything that turns a conversation into a stream of Blocks.

`ModelEngine` wraps the real `Engine` + `LoadedPair`; `ReplayEngine` replays the generations of a
trace file (no model runs: tests, snapshots, demos). Both are used from a worker thread, one call at
a time; `stream()` is a generator, so closing it early stops a generation cleanly.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator, Protocol, Sequence, runtime_checkable

from cure_core.block import Block
from cure_core.cpu_kernels import run_dtype
from cure_core.config import FLAT_FIELDS, DecodeConfig
from cure_core.engine import Engine
from cure_core.errors import CureError, ModelLoadError
from cure_core.metrics import summarize
from cure_core.trace import Trace, read_trace

from .tokens import TokenText

Message = dict  # {"role": "user" | "assistant", "content": str}


@runtime_checkable
class ChatEngine(Protocol):
    label: str            # one line for the UI: what is decoding
    models: dict          # trace header "models" (target/draft names)
    tokens: TokenText     # token ids -> readable text (the target's tokenizer, or ids)
    calibration_note: str  # where calibrate()'s AR baseline comes from, for the Stats panel
    ar_dtype: str | None   # the dtype AR runs in ("float32", "int8"; as traces record it), named in "vs AR"; None: unknown
    thinking: bool | None  # the chat template's enable_thinking choice (None: its default), saved with chats

    def encode(self, messages: Sequence[Message]) -> list[int]:
        """The prompt ids for a conversation whose last message is the user's new turn."""

    def stream(self, messages: Sequence[Message], cfg: DecodeConfig) -> Iterator[Block]:
        """Blocks of the answer to the conversation, as they are accepted (closing it stops between blocks)."""

    def decode(self, ids: Sequence[int]) -> str:
        """Answer text for the chat history (specials dropped)."""

    def check(self, cfg: DecodeConfig) -> DecodeConfig:
        """The config a turn would actually run with; raises CureError if it cannot run."""

    def calibrate(self, cfg: DecodeConfig, tokens: int) -> float | None:
        """AR tokens/s on the same model (a short greedy run), or None when unknown. It must leave the
        conversation's cached prefix as it was (the chat measures it after every turn)."""


class ModelEngine:
    """The real thing: the loaded pair's one `Engine` (its budget tuners carry over from turn to turn, and
    each turn reuses the KV rows and drafter state the last one left: only its new tokens are prefilled)."""

    def __init__(self, loaded, chat: bool | None = None, calibration_prompt: str = "Hello"):
        self.loaded = loaded
        self.pair = loaded.pair
        tok = loaded.tokenizer
        chat = chat if chat is not None else getattr(loaded, "chat", None)
        self.chat = chat if chat is not None else bool(getattr(tok, "chat_template", None))
        self.tokens = TokenText(tok)
        self.models = dict(self.pair.names)
        names = self.pair.names
        label = names.get("target", "target") + (f" ← {names['draft']}" if names.get("draft") else "")
        if "cure" in self.pair.chain_strategies and names.get("ar_draft"):     # defaults.CURE_OVER_CHAIN
            label += (f" (cure repairs {names['ar_draft']})" if names.get("draft")
                      else f" ← {names['ar_draft']} (cure repairs its chains)")
        self.label = label
        self.calibration_prompt = calibration_prompt
        self.calibration_note = "measured after the last answer"
        self.ar_dtype = run_dtype(self.pair.target)
        self._ar_engine: Engine | None = None      # calibrate()'s own: the chat's keeps its cached prefix
        self.thinking = getattr(loaded, "thinking", None)
        self._lock = threading.Lock()   # one generation at a time: drafters keep state

    def encode(self, messages: Sequence[Message]) -> list[int]:
        if not messages:
            raise CureError("nothing to answer: the conversation is empty")
        if self.chat:      # the pair's encoding: its chat template, with its thinking choice
            return self.loaded.encode(messages[-1]["content"], history=list(messages[:-1]), chat=True)
        # No chat template: the raw turns, one after another.
        return self.loaded.encode("".join(m["content"] for m in messages), chat=False)

    def check(self, cfg: DecodeConfig) -> DecodeConfig:
        self.pair.drafter_for(cfg.strategy)          # ConfigError if the strategy has no drafter
        return cfg

    def stream(self, messages: Sequence[Message], cfg: DecodeConfig) -> Iterator[Block]:
        ids = self.encode(messages)
        with self._lock:
            gen = self.loaded.engine.generate(ids, cfg, reuse_prefix=True)     # the cross-turn cache
            try:
                yield from gen
            finally:
                gen.close()

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokens.decode(ids)

    def calibrate(self, cfg: DecodeConfig, tokens: int) -> float | None:
        if tokens <= 0:
            return None
        ids = self.encode([{"role": "user", "content": self.calibration_prompt}])
        ar = cfg.with_(strategy="ar", max_new_tokens=tokens, stop_at_eos=False, temperature=0.0)
        with self._lock:
            if self._ar_engine is None:
                self._ar_engine = Engine(self.pair)
            blocks = list(self._ar_engine.generate(ids, ar))
        stats = summarize(blocks)
        return stats.tokens_per_s or None


class ReplayEngine:
    """Replays a trace: each turn streams the next recorded generation (cycling), whatever was typed.
    The config of a turn is the recorded one, so panels show what really ran."""

    def __init__(self, trace: Trace | str | Path, tokenizer=None, delay: float = 0.0):
        self.trace = trace if isinstance(trace, Trace) else read_trace(trace)
        gens = [g for g in self.trace.generations if g.blocks]
        if not gens:
            raise CureError("the trace holds no blocks to replay")
        self.generations = gens
        self.tokens = TokenText(tokenizer)
        self.models = dict(self.trace.header.get("models") or {})
        draft = self.models.get("draft") or self.models.get("ar_draft")
        self.label = "replay of " + (self.models.get("target") or "a trace") + (f" ← {draft}" if draft else "")
        self.delay = delay
        self.calibration_note = "the trace's ar run"
        self.ar_dtype = trace_dtype(self.trace.header)
        self.thinking = self.trace.header.get("thinking")
        self._next = 0
        self._lock = threading.Lock()

    def _peek(self):
        return self.generations[self._next % len(self.generations)]

    def encode(self, messages: Sequence[Message]) -> list[int]:
        return list(self._peek().prompt_ids)

    def check(self, cfg: DecodeConfig) -> DecodeConfig:
        conf = {k: v for k, v in self._peek().config.items() if k in FLAT_FIELDS}
        if conf and "cure_tree" not in conf:
            conf["cure_tree"] = "paper"              # recorded before cure had another tree: the paper's
        try:
            return DecodeConfig.of(**conf) if conf else cfg.with_(strategy=self._peek().strategy)
        except (TypeError, CureError):
            return cfg

    def stream(self, messages: Sequence[Message], cfg: DecodeConfig) -> Iterator[Block]:
        with self._lock:
            gen = self._peek()
            self._next += 1
        for block in gen.blocks:
            if self.delay:
                time.sleep(self.delay)
            yield block

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokens.decode(ids)

    def calibrate(self, cfg: DecodeConfig, tokens: int) -> float | None:
        """An `ar` generation recorded in the same trace gives the baseline; else unknown."""
        ar = [b for g in self.trace.generations if g.strategy == "ar" for b in g.blocks]
        return (summarize(ar).tokens_per_s or None) if ar else None


def trace_dtype(header: dict) -> str | None:
    """The dtype a trace's target ran in ('float32', 'int8'); None where the trace does not say (older ones)."""
    dtype = header.get("dtype")
    return dtype if isinstance(dtype, str) and dtype else None


def _offline_tokenizer(name: str):
    """A tokenizer that loads without the network: an embedded alias already built in the cache, a
    local folder, or an HF id in the local cache. None otherwise."""
    from cure_core.models import load_tokenizer
    try:
        from cure_core.embedded import EMBEDDED_MODELS, model_status
        if name in EMBEDDED_MODELS:
            st = model_status(name)
            return load_tokenizer(str(st.cache_path), required=False) if st.cached else None
    except Exception:  # noqa: BLE001 - a broken cache must not stop inspect
        return None
    p = Path(name).expanduser()
    if name.startswith((".", "/", "~")) and not p.is_dir():
        return None
    return load_tokenizer(str(p) if p.is_dir() else name, required=False)


def load_trace_tokenizer(models: dict, explicit: str | None = None):
    """The tokenizer for a trace: `explicit` (alias / folder / HF id) if given, else the header's target
    when it loads offline. None when there is none (tokens then show as ids)."""
    if explicit:
        tok = _offline_tokenizer(explicit)
        if tok is None:
            raise ModelLoadError(f"no usable tokenizer for {explicit!r} on this machine (offline: a local "
                                 f"folder, a cached HF id, or a built embedded alias)")
        return tok
    name = (models or {}).get("target")
    return _offline_tokenizer(name) if name else None
