"""The public entry point: load a pair with the CLI's defaults, then generate or stream.

    from cure_core import load
    model = load()                                   # the embedded default pair, the CLI's defaults
    out = model.generate("Write a Python function is_prime(n).", max_new_tokens=64)
    print(out.text, out.stats.tau)

`load(**options)` takes the EngineArgs fields as keywords (the same names as the CLI's flags) and is
what `cure generate`, `cure chat`, `cure bench` and the benchmark scripts open their models with
(`open_pair`): one opener, so Python decodes exactly as the command line does.
"""
from __future__ import annotations

from typing import Sequence

from .config import STRATEGIES, ConfigError
from .catalog import choose_models
from .errors import ModelLoadError
from .models import LoadedPair, load_pair
from .cpu_kernels import rows_exact, run_dtype
from .options import EngineArgs
from .thinking import choose_thinking, drafter_declaration, template_has_switch


def load(**options) -> LoadedPair:
    """Load the models `options` name (EngineArgs fields; nothing: the embedded default pair with its
    shipped drafter) and return them ready to decode with the CLI's defaults."""
    unknown = sorted(set(options) - set(EngineArgs.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}; options are the EngineArgs fields "
                          f"({', '.join(EngineArgs.__dataclass_fields__)})")
    return open_pair(EngineArgs(**options))


def open_pair(args: EngineArgs, strategies: Sequence[str] | None = None,
              target_of: LoadedPair | None = None) -> LoadedPair:
    """The one opener: models + config for `args`. `strategies`: every strategy the caller may run
    (bench's runs, chat's live switch); default: `args.strategy` alone. `target_of`: an opened pair whose
    target object this one shares (models.load_pair).

    Rules: `args.strategy`, when it cannot run with the default models, falls back to 'ar' with a note
    (an explicit `draft` that fails to load is an error, never a fallback); of several strategies, the
    ones that cannot run are named in a note, and a default chain draft that is not installed only
    removes the strategies that draft with it ('sd', and 'cure' where it repairs the chain)."""
    wanted = list(strategies) if strategies is not None else [args.strategy]
    bad = [s for s in wanted if s not in STRATEGIES]
    if bad:
        raise ConfigError(f"unknown strategy {bad[0]!r}; choose one of {', '.join(STRATEGIES)}")
    draft_vocab = args.draft_vocab_ids()
    kernels = args.load_kernels()
    # Validate the decoding knobs before loading anything; K is not known yet unless given (the drafter's
    # trained block size), so check with the smallest block, which every budget must hold anyway.
    args.decode_config(block_size=2)
    choice = choose_models(args.target, args.draft, args.ar_draft, wanted)
    notes = [f"{s} cannot run: {why}" for s, why in choice.unavailable.items() if s != args.strategy]
    strategy = args.strategy
    if strategy in choice.unavailable:
        notes.insert(0, f"{choice.unavailable[strategy]}; running 'ar'")
        strategy = "ar"

    def load_with(ar_draft: str | None) -> LoadedPair:
        return load_pair(choice.target, choice.draft, drafter=args.drafter, mask_token_id=args.mask_token_id,
                         ar_draft=ar_draft, device=args.device, dtype=args.target_dtype(),
                         device_map=args.device_map,
                         kernels=kernels, draft_vocab=draft_vocab, draft_dtype=args.draft_dtype,
                         target_of=target_of)
    try:
        loaded = load_with(choice.ar_draft)
    except ModelLoadError as e:
        # Rule: a default chain draft that is missing costs only the strategies that draft with it, and only
        # when others can run.
        lost = sorted(choice.chain_strategies & set(wanted))
        if choice.ar_draft is None or choice.ar_draft_given or set(wanted) <= set(lost):
            raise
        loaded = load_with(None)
        notes.append(f"the default chain draft {choice.ar_draft!r} is unavailable ({e}); "
                     f"{' and '.join(repr(s) for s in lost)} cannot run")
    loaded.pair.chain_strategies = choice.chain_strategies
    if "cure" in choice.chain_strategies and loaded.pair.ar_drafter is not None:
        notes.append(f"cure repairs the chain draft {choice.ar_draft or choice.draft}"
                     f"'s chains on {choice.target} (cure_core/catalog.py); `draft` names a block drafter for it")
    drafter = loaded.pair.drafter or loaded.pair.ar_drafter
    # Rule: K is the block drafter's trained K; a repaired chain with no block drafter gives its own.
    block_size = getattr(drafter, "block_size", None) or choice.chain_k
    loaded.config = args.decode_config(block_size).with_(strategy=strategy)
    loaded.chat = args.chat
    # Rule (cure_core/thinking.py): thinking follows the drafter's declaration, off for DFlash by default.
    declared = drafter_declaration(choice.draft) if loaded.pair.drafter is not None else None
    loaded.thinking, warnings = choose_thinking(args.thinking, loaded.drafter_kind, declared,
                                                template_has_switch(loaded.tokenizer))
    if not rows_exact(loaded.pair.target):
        notes.append(f"the {run_dtype(loaded.pair.target)} target is not made row-invariant here (that needs packed "
                     "CPU kernels), so a strategy can differ from ar where two logits nearly tie; float32 is exact")
    loaded.notes = tuple(notes)
    loaded.warnings = tuple(warnings)
    return loaded
