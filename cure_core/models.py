"""The drafter factory: checkpoints (loaded by checkpoints.py) into a ModelPair, with clear errors for bad input.

`load_pair` (checkpoints by name) and `build_pair` (models already in memory: tests, benchmark
scripts) are the only places drafters are built, the chain drafter a PARD checkpoint doubles as
included. `LoadedPair` is what a load returns: the pair, its tokenizer and one Engine that keeps
what it learns across generations (cure_core/api.py's `load()` fills in the CLI's defaults).
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .block import Block
from .checkpoints import (DTYPES, check_tokenizers_match, config_kind, draft_folder_config, load_model,
                          load_tokenizer, torch_dtype)
from .config import DecodeConfig
from .cpu_kernels import (KERNELS, bf16_kernels, int8_kernels, pack_linears, resolve_kernels, row_invariant,
                          unavailable_reason)
from .cpu_kernels import int8_target as int8_target_layers
from .attention import use_exact_attention
from .drafters.causal import ArDrafter, PardDrafter
from .drafters.dflash import DFlashModel, drafter_from_model, is_dflash_config, load_dflash_model
from .drafters.vocab import lowest_ids
from .engine import Engine, ModelPair
from .errors import ModelLoadError
from .metrics import GenerationStats, summarize
from .progress import phase
from .prompt_text import check_text
from .thinking import template_has_switch
from .trace import traced

DRAFTER_KINDS = ("auto", "pard", "ar", "dflash")


@dataclass
class Generation:
    """One finished generation: the text, its token ids, every Block, the summary stats and what ran it."""
    text: str
    token_ids: list[int]
    blocks: list[Block]
    stats: GenerationStats
    strategy: str = ""            # the config's (stats.strategy is the blocks': "" when there are none)
    kernels: str = "eager"        # the LoadedPair's kernels, draft_vocab and draft_dtype
    draft_vocab: int = 0
    draft_dtype: str = "float32"

    # the stats `to_dict` gives (the rest, and every block: `stream(prompt, trace=FILE)`)
    HEADLINE = ("tau", "tpot_ms", "tokens_per_s", "blocks", "new_tokens", "repair_win_rate", "mean_tree_size")

    def to_dict(self) -> dict:
        """One JSON object (`cure generate --json`): text, token ids, strategy, the headline stats, and the
        kernels, draft vocabulary and draft dtype it ran with."""
        stats = self.stats.to_dict()
        return {"text": self.text, "token_ids": list(self.token_ids), "strategy": self.strategy,
                "stats": {k: stats[k] for k in self.HEADLINE}, "kernels": self.kernels,
                "draft_vocab": self.draft_vocab, "draft_dtype": self.draft_dtype}


@dataclass
class LoadedPair:
    pair: ModelPair
    tokenizer: object             # the target's tokenizer
    drafter_kind: str | None      # what `drafter` auto resolved to
    kernels: str = "eager"        # what `kernels` auto resolved to: packed | eager (cpu_kernels.py)
    config: DecodeConfig = field(default_factory=DecodeConfig)   # what generate() runs unless told otherwise
    draft_vocab: int = 0          # causal drafters' fixed id count (0: the whole vocabulary)
    draft_dtype: str = "float32"  # the drafters' networks' dtype (--draft-dtype, auto resolved)
    chat: bool | None = None      # chat template for text prompts; None: when the tokenizer has one
    thinking: bool | None = None  # the template's enable_thinking; None: its default (cure_core/thinking.py)
    notes: tuple[str, ...] = ()   # what the defaults changed (e.g. a strategy that cannot run here)
    warnings: tuple[str, ...] = ()   # choices that will cost speed (e.g. thinking against the drafter's training)
    _engine: Engine | None = field(default=None, repr=False)

    @property
    def engine(self) -> Engine:
        """One engine for the pair's lifetime: its budget tuners carry over between generations."""
        if self._engine is None:
            self._engine = Engine(self.pair, self.config)
        return self._engine

    def encode(self, prompt: str, history: list[dict] | None = None, chat: bool | None = None) -> list[int]:
        """Prompt text -> ids: the chat template (with the generation prompt) when the tokenizer has one,
        unless `chat` (or the pair's `chat`) says raw."""
        chat = chat if chat is not None else self.chat
        use = chat if chat is not None else bool(getattr(self.tokenizer, "chat_template", None))
        return encode_prompt(self.tokenizer, prompt, use, history=history, thinking=self.thinking)

    def config_for(self, **changes) -> DecodeConfig:
        """The default config with some fields changed (e.g. strategy, max_new_tokens). Rule: `v_max`, `k` and
        `b_max` go through DecodeConfig.from_user, as the command line's do, so a number fixes the budget and
        'auto' hands it to the tuner (a plain with_ kept the defaults' tuner under a fixed v_max)."""
        cfg = self.config
        if not changes:
            return cfg
        if "auto_budget" in changes or not {"v_max", "k", "b_max"} & changes.keys():
            return cfg.with_(**changes)
        v_max = changes.pop("v_max", "auto" if cfg.auto_budget else cfg.v_max)
        return DecodeConfig.from_user(cfg, k=changes.pop("k", cfg.k), v_max=v_max, b_max=changes.pop("b_max", None),
                                      **changes)

    def stream(self, prompt: str | Sequence[int], *, trace: str | os.PathLike | None = None,
               **changes) -> Iterator[Block]:
        """Blocks of one generation as they are accepted; `prompt` is text (encoded now) or token ids.
        `trace`: a file the generation is written to, block by block (trace.traced: an interrupted one keeps
        what finished); its header records the models, the config and the thinking mode."""
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        config = self.config_for(**changes)
        blocks = self.engine.generate(ids, config)
        if trace is None:
            return blocks
        return traced(blocks, trace, models=self.pair.names, config=config.to_dict(), strategy=config.strategy,
                      prompt_ids=ids, prompt=prompt if isinstance(prompt, str) else None,
                      extra={"thinking": self.thinking})

    def generation(self, blocks: Sequence[Block], config: DecodeConfig | None = None) -> Generation:
        """The Generation of `blocks` (a whole `stream`), run with `config` (default: the pair's)."""
        ids = [t for b in blocks for t in b.emitted]
        return Generation(text=self.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                          blocks=list(blocks), stats=summarize(blocks), strategy=(config or self.config).strategy,
                          kernels=self.kernels, draft_vocab=self.draft_vocab, draft_dtype=self.draft_dtype)

    def generate(self, prompt: str | Sequence[int], *, trace: str | os.PathLike | None = None,
                 **changes) -> Generation:
        """One whole generation (`stream`, collected)."""
        return self.generation(list(self.stream(prompt, trace=trace, **changes)), self.config_for(**changes))


def detect_drafter(model, kind: str, mask_token_id: int | None) -> tuple[str, int | None]:
    """--drafter auto: `config_kind`, and a causal LM given a mask token id is PARD."""
    cfg = model.config
    if kind == "auto":
        kind = config_kind(cfg)
        if kind == "ar" and mask_token_id is not None:
            kind = "pard"
    if kind == "pard":
        mask_token_id = mask_token_id if mask_token_id is not None else getattr(cfg, "pard_token", None)
        if mask_token_id is None:
            raise ModelLoadError("a PARD drafter needs its mask token id: give `mask_token_id` "
                                 "(or use a checkpoint whose config has pard_token)")
    if kind == "dflash" and not is_dflash_config(cfg):
        raise ModelLoadError("`drafter` dflash needs a DFlash checkpoint (a config with a DFlash architecture "
                             "or a dflash_config section)")
    return kind, mask_token_id


def load_pair(target: str, draft: str | None = None, *, drafter: str = "auto", mask_token_id: int | None = None,
              ar_draft: str | None = None, device: str = "cpu", dtype: str = "float32",
              device_map: str | None = None, kernels: str = "auto", draft_vocab: int = 0,
              draft_dtype: str | None = None, target_of: "LoadedPair | None" = None) -> LoadedPair:
    """The target, its tokenizer and the drafters a decode needs, loaded by name. `draft_vocab` N > 0
    limits causal drafters' heads (PARD, AR, the chain draft) to ids < N plus the context's
    (DraftVocab); a DFlash drafter uses the vocabulary saved in its checkpoint, if any. `draft_dtype`:
    the drafters' networks (a DFlash drafter's own layers; it embeds and reads out with the target's
    table in the target's dtype); None: `dtype`; "auto": `auto_draft_dtype`'s rule for causal drafters,
    `dtype` for a DFlash drafter; "int8": the network loads in `int8_network_dtype()` and packs with int8
    copies of its layers but the head (cpu_kernels.Int8Linear: CPU, packed kernels). `target_of`: a
    loaded pair whose target object (and tokenizer and kernels) this one shares instead of loading its
    own (benchmarks compare drafter dtypes in one process without a second copy of the target)."""
    if drafter not in DRAFTER_KINDS:
        raise ModelLoadError(f"unknown drafter kind {drafter!r}; choose one of {', '.join(DRAFTER_KINDS)}")
    if kernels not in KERNELS:
        raise ModelLoadError(f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)}")
    if kernels == "packed" and device_map:
        raise ModelLoadError("`kernels` packed does not combine with `device_map` (accelerate's hooks)")
    if draft_vocab < 0:
        raise ModelLoadError(f"`draft_vocab` must be >= 0 (0: the whole vocabulary), got {draft_vocab}")
    # the causal drafters' dtype (PARD, AR, the chain draft) and a DFlash drafter's layers'
    if draft_dtype not in (None, "auto", "int8", *DTYPES):
        raise ModelLoadError(f"unknown draft dtype {draft_dtype!r}; "
                             "choose one of float32, float16, bfloat16, int8, auto")
    if dtype not in (*DTYPES, "int8"):
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of float32, float16, bfloat16, int8")
    int8_target = dtype == "int8"
    if int8_target and (why := int8_unavailable(device, device_map, kernels, "int8 targets")):
        raise ModelLoadError(f"`dtype` int8: {why}")
    if int8_target and draft_dtype is None:
        draft_dtype = "int8"                           # None: the drafters run in the target's dtype
    dtype = "float32" if int8_target else dtype       # the network's dtype: an int8 target's norms, attention
    auto = draft_dtype == "auto"                       # and embedding run in float32 (RowInt8Linear)
    asked = auto_draft_dtype(dtype, device, device_map, kernels) if auto else draft_dtype or dtype
    int8 = asked == "int8"
    if int8 and (why := int8_unavailable(device, device_map, kernels)):
        raise ModelLoadError(f"`draft_dtype` int8: {why}")
    causal = torch_dtype(int8_network_dtype() if int8 else asked, "draft dtype")   # what causal drafters load in
    loads_as = str(causal).removeprefix("torch.")                                  # (an alias: its full name)
    causal_dtype = "int8" if int8 else loads_as                                    # what they run in, as reported
    # Rule: under an int8 target, auto runs a DFlash drafter's layers as an int8 drafter's network loads
    # (bfloat16 where oneDNN runs it natively): cure 1.034x over float32 layers on the 0.5B pair, each set
    # ahead (benchmarks/results/llamacpp_s45_cpu)
    flash_auto = int8_network_dtype() if int8_target else dtype
    draft_torch_dtype = torch_dtype(flash_auto, "draft dtype") if auto else causal
    flash_dtype = causal_dtype if not auto else str(draft_torch_dtype).removeprefix("torch.")
    if target_of is None:
        tmodel, tpath = load_model(target, device, dtype, device_map)
        tok = load_tokenizer(tpath)
        if int8_target:
            with phase("quantizing the target to int8 (--dtype int8, or auto on this CPU; float32 keeps the weights as saved)"):
                int8_target_layers(tmodel)
                use_exact_attention(tmodel)
    else:
        tmodel, tok = target_of.pair.target, target_of.tokenizer
    names = {"target": target}
    draft_device = device if not device_map else str(next(tmodel.parameters()).device)
    dmodel, dflash_vocab, amodel = None, None, None
    dfolder, dcfg = draft_folder_config(draft) if draft else (None, None)
    if draft and dcfg is not None and is_dflash_config(dcfg):
        # A DFlash checkpoint is not a causal LM: its own layers, the target's embedding and lm_head.
        if drafter not in ("auto", "dflash"):
            raise ModelLoadError(f"{draft!r} is a DFlash drafter, not a causal LM; use `drafter` dflash (or auto)")
        check_tokenizers_match(tok, load_tokenizer(dfolder, required=False), draft)
        with phase(f"loading the DFlash drafter {draft}"):
            dmodel, dflash_vocab = load_dflash_model(dfolder, tmodel, draft_torch_dtype)
    elif draft:
        dmodel, dpath = load_model(draft, draft_device, loads_as)
        check_tokenizers_match(tok, load_tokenizer(dpath, required=False), draft)
    if draft:
        names["draft"] = draft
    if ar_draft and ar_draft != draft:
        amodel, apath = load_model(ar_draft, draft_device, loads_as)
        check_tokenizers_match(tok, load_tokenizer(apath, required=False), ar_draft)
    if ar_draft:
        names["ar_draft"] = ar_draft
    pair, kind = build_pair(tmodel, dmodel, drafter=drafter, mask_token_id=mask_token_id,
                            ar_draft=amodel if amodel is not None else (dmodel if ar_draft else None),
                            vocab_size=len(tok), draft_vocab=draft_vocab, dflash_vocab=dflash_vocab,
                            eos_ids=eos_ids(tmodel, tok), names=names)
    models = [m for m in (tmodel, dmodel, amodel) if m is not None]   # every network a decode runs
    if target_of is not None:           # the shared target is already what it is: its drafters follow it
        models, kernels = models[1:], target_of.kernels
    elif int8_target:                   # already int8: the drafters pack around it
        models = models[1:]
    # what each drafter network runs in: a DFlash drafter's layers flash_dtype, causal drafters causal_dtype
    runs_in = [(m, flash_dtype if m is dmodel and kind == "dflash" else causal_dtype)
               for m in (dmodel, amodel) if m is not None]
    packed = apply_kernels(kernels if not device_map else "eager", models,
                           int8=[m for m, d in runs_in if d == "int8"])      # Int8Linear layers for these
    if packed and target_of is None and dtype == "bfloat16":        # (float16 never packs: unavailable_reason)
        with phase("probing which row counts give bfloat16 rows the same bits (once per load)"):
            row_invariant(tmodel)           # every verify row what a one-row ar step gives it
            use_exact_attention(tmodel)
    # what the drafters run in: one dtype, or a DFlash drafter's and the chain draft's when they differ
    ran = {d for _, d in runs_in}
    if not ran:
        named = "int8" if int8_target else dtype        # no drafter: nothing runs in a draft dtype
    elif len(ran) == 1:
        named = ran.pop()
    else:
        named = f"{flash_dtype} (dflash), {causal_dtype} (chain)"
    trim_heap()
    return LoadedPair(pair=pair, tokenizer=tok, drafter_kind=kind, kernels="packed" if packed else "eager",
                      draft_vocab=draft_vocab, draft_dtype=named)


def trim_heap() -> None:
    """Hand the heap that loading freed back to the OS. Why: casting, quantizing and packing weights free
    their float32 copies, and glibc keeps much of that mapped (the 1.5B pair with its drafters: 10.6 GB
    resident after loading, 8.6 GB after a trim). A no-op where the C library has no malloc_trim."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def int8_network_dtype() -> str:
    """What an int8 drafter's network loads in (its norms, attention, embedding and head, and its long
    passes): bfloat16 where oneDNN runs it natively, else float32."""
    return "bfloat16" if bf16_kernels() else "float32"


def int8_unavailable(device: str, device_map: str | None, kernels: str, what: str = "int8 drafters") -> str | None:
    """Why `draft_dtype` (or `dtype`) int8 cannot run with these options, or None. It is a CPU kernel
    (Int8Linear, RowInt8Linear)."""
    if device != "cpu" or device_map:
        return f"{what} run on the CPU only (device {device_map or device}); use bfloat16"
    if kernels == "eager":
        return f"{what} run on packed kernels, not `kernels` eager (nor `compile`)"
    if not int8_kernels():
        return "this torch build has no fbgemm int8 matmuls"
    return None


def auto_draft_dtype(dtype: str, device: str, device_map: str | None, kernels: str) -> str:
    """`draft_dtype` auto for a causal drafter (PARD, AR, the chain draft). Rule: under a float32 or bfloat16
    target on a CPU, with kernels that may pack, int8 where torch has fbgemm's int8 matmuls, else bfloat16 where
    oneDNN runs bfloat16 matmuls; else the target's dtype. Why: a drafter's short passes are bandwidth-bound, so
    fewer bytes per weight are faster at the same acceptance (benchmarks/results/SUMMARY.md, History of the
    rules). A DFlash drafter keeps the target's dtype under auto (its layers are small; not measured to pay)."""
    if dtype in ("float32", "bfloat16") and device == "cpu" and not device_map and kernels != "eager":
        if int8_kernels():
            return "int8"
        if bf16_kernels():
            return "bfloat16"
    return dtype


def build_pair(target, draft=None, *, drafter: str = "auto", mask_token_id: int | None = None, ar_draft=None,
               vocab_size: int | None = None, draft_vocab: int = 0, dflash_vocab: torch.Tensor | None = None,
               eos_ids: Sequence[int] = (), names: dict | None = None,
               max_context: int | None = None) -> tuple[ModelPair, str | None]:
    """Drafters over models already in memory -> (ModelPair, the drafter kind `auto` resolved to).

    `draft`: a causal LM (PARD or AR, by `drafter` / its config) or a DFlashModel; `ar_draft`: a causal
    LM drafting sd's chains. Rules: an AR draft is both the block drafter (chains CURE repairs) and the
    chain drafter; a PARD drafter doubles as the chain drafter (same weights, its own cache) unless a
    separate `ar_draft` is given. `vocab_size`: the target tokenizer's (drafts past it never proposed)."""
    vocab = vocab_size if vocab_size is not None else int(target.config.vocab_size)
    low = lowest_ids(draft_vocab, vocab)
    block, chain, kind = None, None, None
    if isinstance(draft, DFlashModel):
        if drafter not in ("auto", "dflash"):
            raise ModelLoadError(f"a DFlash network is not a causal LM; use `drafter` dflash (or auto), not {drafter!r}")
        block, kind = drafter_from_model(draft, target, vocab_size=vocab, draft_vocab=dflash_vocab), "dflash"
    elif draft is not None:
        kind, mask_token_id = detect_drafter(draft, drafter, mask_token_id)
        if kind == "pard":
            block = PardDrafter(draft, mask_token_id, vocab_size=vocab, draft_vocab=low,
                                block_size=getattr(draft.config, "pard_block_size", None))
            chain = block.chain()
        else:
            block = chain = ArDrafter(draft, vocab_size=vocab, draft_vocab=low)
    if ar_draft is not None and ar_draft is not draft:
        chain = ArDrafter(ar_draft, vocab_size=vocab, draft_vocab=low)
    pair = ModelPair(target=target, drafter=block, ar_drafter=chain, eos_ids=tuple(eos_ids),
                     max_context=max_context, names=dict(names or {}))
    return pair, kind


def eos_ids(model, tokenizer) -> tuple[int, ...]:
    """Every end-of-sequence id the model's generation config, its config and its tokenizer name."""
    eos = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        eos.update([e] if isinstance(e, int) else (e or []))
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return tuple(sorted(eos))


def apply_kernels(kernels: str, models: list, int8: Sequence = ()) -> bool:
    """Pack every model's linears (cpu_kernels.py) when `kernels` asks for it and all of them allow it;
    returns whether they were packed. All or none: drafter and target run the same kind of kernels.
    The models in `int8` (drafters under `draft_dtype` int8) get int8 copies too; they need packing."""
    try:
        use = all(resolve_kernels(kernels, m) for m in models)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    if int8 and not use:
        raise ModelLoadError("`draft_dtype` int8 runs on packed CPU kernels, and these models cannot pack: "
                             f"{next((w for m in models if (w := unavailable_reason(m))), 'kernels eager')}")
    if use:
        with phase("packing the weights for oneDNN (--kernels packed)", total=len(models)) as update:
            for i, m in enumerate(models):
                pack_linears(m, int8=any(m is x for x in int8))
                update(i + 1)
    return use


def encode_prompt(tokenizer, text: str, chat: bool, history: list[dict] | None = None,
                  thinking: bool | None = None) -> list[int]:
    """Chat template (with the generation prompt) or raw text -> token ids. `thinking` (True / False) goes
    to the template as `enable_thinking` where it has that switch; None keeps the template's default."""
    text = check_text(text)         # one clear error for bytes that are not UTF-8; a CheckedText passes as is
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ModelLoadError("this tokenizer has no chat template; send raw text (`chat`=False)")
        messages = list(history or []) + [{"role": "user", "content": text}]
        extra = {"enable_thinking": thinking} if thinking is not None and template_has_switch(tokenizer) else {}
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer.encode(text, add_special_tokens=False)
