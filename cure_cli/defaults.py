"""Which models run when the user names none: the embedded default pair."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cure_core.embedded import DEFAULT_TARGET

ASSETS = Path(__file__).resolve().parent.parent / "assets"
# The autoregressive draft for each embedded target (naive SD, and the chain drafter CURE repairs
# when no block-parallel drafter ships for that target).
AR_DRAFT_FOR = {"qwen-coder-1.5b": "qwen-coder-0.5b"}


@dataclass(frozen=True)
class StrategyNote:
    strategy: str                  # the strategy that will run instead
    message: str


def shipped_drafter(target: str) -> str | None:
    """A block-parallel drafter committed under assets/drafters/<target alias>/, if one ships."""
    d = ASSETS / "drafters" / target
    return str(d) if (d / "config.json").exists() else None


def default_models(target: str | None, draft: str | None, strategy: str):
    """Fill in the embedded default target and its drafter. Returns (target, draft, note|None)."""
    target = target or DEFAULT_TARGET
    if draft is not None or strategy == "ar":
        return target, draft, None
    draft = shipped_drafter(target) or AR_DRAFT_FOR.get(target)
    if draft is None:
        return target, None, StrategyNote(
            "ar", f"no drafter ships for {target} yet and none was given with --draft; running 'ar' "
                  f"(try --target qwen-coder-1.5b, whose default draft is qwen-coder-0.5b)")
    return target, draft, None
