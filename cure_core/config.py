"""Decoding configuration: one frozen, commented dataclass, validated on construction.

Defaults follow the CURE paper's primary configuration: block K=16 (tree depth 15),
tau_margin=1.0, b_min=1, b_max=5, verification beam 5, at most one UFP per block.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from .errors import CureError

STRATEGIES = ("ar", "sd", "parallel", "cure", "ddtree")
KV_LAYOUTS = ("static", "dynamic")


class ConfigError(CureError, ValueError):
    """An invalid decoding configuration (bad K, budget, temperature...)."""


@dataclass(frozen=True)
class DecodeConfig:
    strategy: str = "cure"        # ar | sd | parallel | cure | ddtree
    k: int = 16                   # block size: the root token plus K-1 drafted tokens (tree depth <= K-1)
    max_new_tokens: int = 256     # stop after this many emitted tokens
    temperature: float = 0.0      # 0 = greedy (token-identical to ar); > 0 = lossless rejection sampling
    seed: int = 0                 # seeds the sampler's torch.Generator when temperature > 0
    # --- CURE: uncertainty gate and branch budget (DESIGN.md steps 2-5) ---
    tau_margin: float = 1.0       # positions with top1-top2 draft log-prob margin below this are UFPs
    margin_scale: float | None = None  # s in u_i = clamp(1 - m_i/s, 0, 1); None = tau_margin
    b_min: int = 1                # repair branches granted at the least uncertain UFP
    b_max: int = 5                # repair branches granted at the most uncertain UFP
    max_ufps: int = 1             # UFPs repaired per block, taken in ascending margin
    v_max: int = 64               # node budget V(T) <= v_max (root excluded); cuts repair suffixes, never branch 0
    auto_budget: bool = False     # pick the budget per block from the measured cost curve (v_max = ceiling; budget.py)
    beam: int = 5                 # repair-branch frontier: at most this many repair nodes at any depth
    top_k: int = 8                # draft alternatives kept per position (>= b_max + 1; ddtree's per-depth width)
    # --- ablations (paper Table 4) ---
    keep_branch0: bool = True     # False: the drafted block is not verified unless a repair shares it
    resync: bool = True           # False: the drafter is fed branch 0's tokens instead of the emitted ones
    # --- stopping ---
    stop_at_eos: bool = True      # stop at the target's eos token(s)
    # --- execution: speed only, never the output (lm.py) ---
    kv_cache: str = "static"      # static: preallocated K/V rows, compacted in place | dynamic: HF DynamicCache
    compile: bool = False         # torch.compile the target forward over padded static shapes (CUDA graphs on a GPU)

    def __post_init__(self) -> None:
        # Rule: real-valued knobs are finite numbers (nan passes every `< 0` check; inf breaks sampling).
        for name in ("temperature", "tau_margin", "margin_scale"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.kv_cache not in KV_LAYOUTS:
            raise ConfigError(f"unknown KV cache layout {self.kv_cache!r}; choose one of {', '.join(KV_LAYOUTS)}")
        if self.compile and self.kv_cache != "static":
            raise ConfigError("--compile needs the static KV cache (--kv-cache static)")
        if self.k < 2:
            raise ConfigError(f"K must be at least 2 (the root plus one drafted token), got {self.k}")
        if self.k > 128:
            raise ConfigError(f"K={self.k} is too large (at most 128)")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.tau_margin < 0:
            raise ConfigError(f"tau_margin must be >= 0, got {self.tau_margin}")
        if self.margin_scale is not None and self.margin_scale <= 0:
            raise ConfigError(f"margin_scale must be > 0, got {self.margin_scale}")
        if not 0 <= self.b_min <= self.b_max:
            raise ConfigError(f"need 0 <= b_min <= b_max, got b_min={self.b_min} b_max={self.b_max}")
        if self.max_ufps < 0:
            raise ConfigError(f"max_ufps must be >= 0, got {self.max_ufps}")
        if self.beam < 1:
            raise ConfigError(f"beam must be at least 1, got {self.beam}")
        if self.top_k < 2 or self.top_k < self.b_max + 1:
            raise ConfigError(f"top_k must be >= max(2, b_max + 1) = {max(2, self.b_max + 1)}, got {self.top_k}")
        # Rule: the budget never cuts branch 0, so it must at least hold the drafted block.
        if self.strategy in ("sd", "parallel", "cure", "ddtree") and self.v_max < self.k - 1:
            raise ConfigError(f"v_max={self.v_max} is smaller than the drafted block (K-1={self.k - 1}); "
                              f"raise --v-max or lower --k")

    @property
    def depth(self) -> int:
        """Maximum tree depth: the drafted tokens per block."""
        return self.k - 1

    @property
    def scale(self) -> float:
        return self.margin_scale if self.margin_scale is not None else max(self.tau_margin, 1e-9)

    def with_(self, **changes) -> "DecodeConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)
