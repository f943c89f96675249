"""Decoding configuration: one frozen, commented dataclass, validated on construction.

Defaults follow the CURE paper's primary configuration: block K=16 (tree depth 15),
tau_margin=1.0, b_min=1, b_max=5, verification beam 5 (strategies.PAPER_BEAM), at most one UFP per block.
`DecodeConfig.from_user` is the one rule that turns user-level knobs (the CLI's flags, the API's
keywords, the chat settings screen) into a config.

Errors name config fields in backticks (`v_max`); the CLI rewrites them as its flags (--v-max).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from .errors import CureError

STRATEGIES = ("ar", "sd", "parallel", "cure", "ddtree")
CURE_TREES = ("best-first", "paper")
KV_LAYOUTS = ("static", "dynamic")


class ConfigError(CureError, ValueError):
    """An invalid decoding configuration (bad K, budget, temperature...)."""


AUTO_CEILING = 64                 # v_max "auto": the largest tree the budget tuner may choose


def parse_auto_int(value, field: str) -> int | None:
    """'auto' -> None; an int or a numeric string -> int; anything else is a ConfigError naming `field`."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"`{field}` takes a number or auto, got {value!r}") from None


@dataclass(frozen=True)
class DecodeConfig:
    strategy: str = "cure"        # ar | sd | parallel | cure | ddtree
    k: int = 16                   # block size: the root token plus K-1 drafted tokens (tree depth <= K-1)
    max_new_tokens: int = 256     # stop after this many emitted tokens
    temperature: float = 0.0      # 0 = greedy (token-identical to ar); > 0 = lossless rejection sampling
    seed: int = 0                 # seeds the sampler's torch.Generator when temperature > 0
    # --- the paper tree: uncertainty gate and branch budget (strategies.build_paper_tree) ---
    tau_margin: float = 1.0       # positions with top1-top2 draft log-prob margin below this are UFPs
    b_min: int = 1                # repair branches granted at the least uncertain UFP
    b_max: int = 5                # repair branches granted at the most uncertain UFP
    max_ufps: int = 1             # UFPs repaired per block, taken in ascending margin
    v_max: int = 64               # node budget V(T) <= v_max (root excluded); cuts repair suffixes, never branch 0
    auto_budget: bool = False     # pick the budget per block from the measured cost curve (v_max = ceiling; budget.py)
    top_k: int = 8                # draft alternatives kept per position for the paper tree (>= b_max + 1);
                                  # best-first trees (ddtree, cure best-first) take max(top_k, budget), so a
                                  # node may get as many children as the budget holds (strategies.proposal_width)
    # --- CURE's tree (strategies.py) ---
    cure_tree: str = "best-first" # best-first: nodes by what the target accepts (acceptance.py), suffixes
                                  # re-drafted under the best substitutions | paper: branch 0 + repair branches at
                                  # UFPs (the paper's)
    redrafts: int | None = None   # best-first: substitutions whose subtree is re-drafted per block (one pass);
                                  # None: the drafter's (Drafter.redraft_policy: 2 for DFlash, 3 for an AR
                                  # chain, 0 for one whose layers run int8: ArDrafter)
    redraft_weight: float | None = None  # best-first: weight of the re-drafted distribution below a substitution,
                                  # blended with the proposal's (1: the re-draft alone; strategies.blend);
                                  # None: the drafter's (0.5 for DFlash, 1 for an AR chain)
    lookup: int = 10              # best-first: graft up to this many tokens copied from the text so far (the
                                  # continuation of its last n-gram's latest earlier occurrence) into the
                                  # heap, scored by their measured acceptance (lookup.py); 0 = off
    alt_floor: bool = True        # best-first under --v-max auto over a sequential drafter (with draft_stop): a
                                  # node off the drafted chain (a substitution or below one) joins only where
                                  # its calibrated acceptance pays for its row (BudgetTuner.alt_floor)
    draft_stop: bool = True       # best-first over a sequential (AR chain) drafter: stop drafting once the
                                  # chain is too unlikely to pay for its next step (BudgetTuner.draft_stop)
    acceptance: bool = True       # best-first: rank nodes by the target's acceptance, P(accepted | parent
                                  # accepted) per rank, depth and draft log-prob, learned online at T=0
                                  # (acceptance.py); False: the drafter's joint log-prob alone, as ddtree
    # --- ablations (paper Table 4) ---
    keep_branch0: bool = True     # False: the drafted block is not verified unless a repair shares it
    resync: bool = True           # False: the drafter is fed branch 0's tokens instead of the emitted ones
    # --- stopping ---
    stop_at_eos: bool = True      # stop at the target's eos token(s)
    # --- execution: speed only, never the output (lm.py) ---
    kv_cache: str = "static"      # static: preallocated K/V rows, compacted in place | dynamic: HF DynamicCache
    compile: bool = False         # torch.compile the target forward over padded static shapes (CUDA graphs on a GPU),
                                  # and a DFlash drafter's block passes (DFlashDrafter.compile_for)

    def __post_init__(self) -> None:
        # Rule: real-valued knobs are finite numbers (nan passes every `< 0` check; inf breaks sampling).
        for name in ("temperature", "tau_margin", "redraft_weight"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"`{name}` must be a finite number, got {value}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.cure_tree not in CURE_TREES:
            raise ConfigError(f"unknown CURE tree {self.cure_tree!r}; choose one of {', '.join(CURE_TREES)}")
        if self.redraft_weight is not None and not 0.0 <= self.redraft_weight <= 1.0:
            raise ConfigError(f"`redraft_weight` must lie in [0, 1], got {self.redraft_weight}")
        if self.redrafts is not None and self.redrafts < 0:
            raise ConfigError(f"`redrafts` must be >= 0, got {self.redrafts}")
        if self.lookup < 0:
            raise ConfigError(f"`lookup` must be >= 0 (0: off), got {self.lookup}")
        if self.kv_cache not in KV_LAYOUTS:
            raise ConfigError(f"unknown KV cache layout {self.kv_cache!r}; choose one of {', '.join(KV_LAYOUTS)}")
        if self.compile and self.kv_cache != "static":
            raise ConfigError("`compile` needs the static KV cache (`kv_cache` static)")
        if self.k < 2:
            raise ConfigError(f"K must be at least 2 (the root plus one drafted token), got {self.k}")
        if self.k > 128:
            raise ConfigError(f"K={self.k} is too large (at most 128)")
        if self.max_new_tokens < 1:
            raise ConfigError(f"`max_new_tokens` must be at least 1, got {self.max_new_tokens}")
        if not 0 <= self.seed < 2 ** 64:
            raise ConfigError(f"`seed` must lie in [0, 2**64 - 1], got {self.seed}")
        if self.temperature < 0:
            raise ConfigError(f"`temperature` must be >= 0, got {self.temperature}")
        if self.tau_margin < 0:
            raise ConfigError(f"`tau_margin` must be >= 0, got {self.tau_margin}")
        if not 0 <= self.b_min <= self.b_max:
            raise ConfigError(f"need 0 <= b_min <= `b_max`, got b_min={self.b_min} b_max={self.b_max}")
        if self.max_ufps < 0:
            raise ConfigError(f"max_ufps must be >= 0, got {self.max_ufps}")
        if self.top_k < 2 or self.top_k < self.b_max + 1:
            raise ConfigError(f"top_k must be >= max(2, b_max + 1) = {max(2, self.b_max + 1)}, got {self.top_k}")
        # Rule: the budget never cuts branch 0, so it must at least hold the drafted block.
        if self.strategy in ("sd", "parallel", "cure", "ddtree") and self.v_max < self.k - 1:
            raise ConfigError(f"v_max={self.v_max} is smaller than the drafted block (K-1={self.k - 1}); "
                              f"raise `v_max` or lower `k`")

    @classmethod
    def from_user(cls, base: "DecodeConfig | None" = None, *, k: int | None = None, v_max: int | str = "auto",
                  b_max: int | None = None, **fields) -> "DecodeConfig":
        """The one rule from user-level knobs to a config (CLI flags, API keywords, chat settings).

        k None: 16 (the paper's block). v_max 'auto' (or None): the budget tuner picks the budget per
        block with AUTO_CEILING as its ceiling (never below the drafted block); a number fixes it.
        b_max sets the repair fan-out, and with it b_min = min(1, b_max) and top_k >= b_max + 1 (the
        alternatives a UFP can graft). Other fields pass through; `base` supplies the rest.
        """
        base = base or cls()
        k = 16 if k is None else k
        b_max = base.b_max if b_max is None else b_max
        budget = parse_auto_int(v_max, "v_max") if v_max is not None else None
        v = max(AUTO_CEILING, k - 1) if budget is None else budget
        return replace(base, k=k, b_max=b_max, b_min=min(base.b_min, b_max), top_k=max(base.top_k, b_max + 1),
                       v_max=v, auto_budget=budget is None, **fields)

    @property
    def depth(self) -> int:
        """Maximum tree depth: the drafted tokens per block."""
        return self.k - 1

    def with_(self, **changes) -> "DecodeConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)
