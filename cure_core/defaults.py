"""Which models run when the user names none: the embedded default target, its shipped drafter and
its chain draft. The one place this policy lives (generate, chat, bench, benchmarks and the API)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .embedded import DEFAULT_TARGET, EMBEDDED_MODELS

ASSETS = Path(__file__).resolve().parent.parent / "assets"
# The autoregressive chain draft for each embedded target: naive SD's draft, and the drafter CURE
# repairs when no block-parallel drafter ships for that target.
AR_DRAFT_FOR = {"qwen-coder-1.5b": "qwen-coder-0.5b"}
# Targets whose `cure` repairs the chain draft's chains (best-first, re-drafts batched into the chain's
# steps) instead of the shipped block drafter's blocks, and the K it repairs at. Measured on held-out
# prompts with every method in one process: benchmarks/results/peers60_qwen15b_s33_cpu (K from the
# tuning prompts, benchmarks/results/README.md). parallel and ddtree keep the shipped drafter, which
# they ran faster over.
CURE_OVER_CHAIN = {"qwen-coder-1.5b": 8}
BLOCK_STRATEGIES = ("parallel", "cure", "ddtree")


def shipped_drafter(target: str) -> str | None:
    """A block-parallel drafter committed under assets/drafters/<target alias>/, if one ships (embedded
    aliases only: a folder or HF id is not an alias, and a path would escape assets/)."""
    if target not in EMBEDDED_MODELS:
        return None
    d = ASSETS / "drafters" / target
    return str(d) if (d / "config.json").exists() else None


@dataclass(frozen=True)
class ModelChoice:
    target: str
    draft: str | None                  # the block drafter to load (an AR model here drafts chains)
    ar_draft: str | None               # a separate chain draft for 'sd' (None: none, or the draft doubles)
    ar_draft_given: bool               # the user named ar_draft (a failure to load it is then an error)
    unavailable: dict = field(default_factory=dict)   # strategy -> why it cannot run with these models
    chain_strategies: frozenset = frozenset({"sd"})   # the strategies that draft with the chain draft
    chain_k: int | None = None         # K when a repaired chain sets it (no block drafter's trained K)


def choose_models(target: str | None, draft: str | None, ar_draft: str | None,
                  strategies: Sequence[str]) -> ModelChoice:
    """Fill in what the user left out, for the strategies that will run.

    Rules: the target defaults to the embedded default. A block strategy with no --draft takes the
    drafter shipped for the target, else the target's chain draft (an AR drafter drafts chains that
    CURE repairs). 'sd' with no --ar-draft takes the target's chain draft, unless the block drafter is
    that same model (a PARD or AR drafter doubles as the chain drafter: load_pair). With no --draft,
    'cure' on a CURE_OVER_CHAIN target drafts with the chain draft (--ar-draft, else the target's) at
    that K unless --k says otherwise. Nothing is loaded for a strategy that will not run, so
    `--strategy ar` loads the target alone."""
    target = target or DEFAULT_TARGET
    want = set(strategies)
    chain = AR_DRAFT_FOR.get(target)
    given = ar_draft is not None
    chained = {"sd"}
    if draft is None and "cure" in want and target in CURE_OVER_CHAIN and (given or chain is not None):
        chained.add("cure")
    need_block = bool(want & (set(BLOCK_STRATEGIES) - chained))
    if draft is None and need_block:
        draft = shipped_drafter(target) or chain
    if ar_draft is None and want & chained and chain is not None and chain != draft:
        ar_draft = chain
    unavailable = {}
    if draft is None:
        why = (f"no drafter ships for {target} and none was given (`draft`); try `target` qwen-coder-1.5b, "
               f"whose default draft is qwen-coder-0.5b")
        unavailable.update({s: why for s in want if s in BLOCK_STRATEGIES and s not in chained})
        if ar_draft is None and "sd" in want:
            unavailable["sd"] = f"no chain draft for {target}: give one (`ar_draft`)"
    k = CURE_OVER_CHAIN[target] if "cure" in chained else None
    return ModelChoice(target, draft, ar_draft, given, unavailable, frozenset(chained), k)
