"""Decoding configuration: one frozen, commented dataclass, validated on construction.

Defaults follow the CURE paper's primary configuration: block K=16 (tree depth 15),
tau_margin=1.0, b_min=1, b_max=5, verification beam 5 (strategies.PAPER_BEAM), at most one UFP per block.
`DecodeConfig.from_user` is the one rule that turns user-level knobs (the CLI's flags, the API's
keywords, the chat settings screen) into a config.

Errors name config fields in backticks (`v_max`); the CLI rewrites them as its flags (--v-max).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

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
class PaperTree:
    """The paper's tree (`cure_tree` paper): the uncertainty gate and the branch budget (build_paper_tree)."""
    tau_margin: float = 1.0       # positions with top1-top2 draft log-prob margin below this are UFPs
    b_min: int = 1                # repair branches granted at the least uncertain UFP
    b_max: int = 5                # repair branches granted at the most uncertain UFP
    max_ufps: int = 1             # UFPs repaired per block, taken in ascending margin
    top_k: int = 8                # draft alternatives kept per position (>= b_max + 1); best-first trees (ddtree,
                                  # cure best-first) take max(top_k, budget): a node may get as many children as
                                  # the budget holds


@dataclass(frozen=True)
class BestFirstTree:
    """cure's default tree (`cure_tree` best-first: policies.BestFirstCure)."""
    redrafts: int | None = None   # substitutions whose subtree is re-drafted per block (one pass); None: the
                                  # drafter's (Drafter.redraft_policy: 2 for DFlash, 3 for an AR chain, 0 for
                                  # one whose layers run int8: ArDrafter)
    redraft_weight: float | None = None  # weight of the re-drafted distribution below a substitution, blended with
                                  # the proposal's (1: the re-draft alone; strategies.blend); None: the drafter's
    lookup: int = 10              # graft up to this many tokens copied from the text so far (the continuation of
                                  # its last n-gram's latest earlier occurrence) into the heap (lookup.py); 0 = off
    alt_floor: bool = True        # under --v-max auto over a sequential drafter (with draft_stop): a node off the
                                  # drafted chain joins only where it pays for its row (BudgetTuner.alt_floor)
    draft_stop: bool = True       # over a sequential (AR chain) drafter: stop drafting once the chain is too
                                  # unlikely to pay for its next step (BudgetTuner.draft_stop)
    acceptance: bool = True       # rank nodes by the target's acceptance, P(accepted | parent accepted) per rank,
                                  # depth and draft log-prob, learned online at T=0 (acceptance.py); False: the
                                  # drafter's joint log-prob alone, as ddtree


@dataclass(frozen=True)
class Ablations:
    """The paper's Table 4 ablations."""
    keep_branch0: bool = True     # False: the drafted block is not verified unless a repair shares it
    resync: bool = True           # False: the drafter is fed branch 0's tokens instead of the emitted ones


@dataclass(frozen=True)
class Execution:
    """Speed only, never the output (lm.py)."""
    kv_cache: str = "static"      # static: preallocated K/V rows, compacted in place | dynamic: HF DynamicCache
    compile: bool = False         # torch.compile the target forward over padded static shapes (CUDA graphs on a
                                  # GPU), and a DFlash drafter's block passes (DFlashDrafter.compile_for)


GROUPS = {"paper": PaperTree, "best_first": BestFirstTree, "ablations": Ablations, "execution": Execution}
# a group's field name -> its group (the flat names `of`, `with_`, `to_dict` and the CLI use)
GROUP_OF = {f.name: g for g, cls in GROUPS.items() for f in fields(cls)}


@dataclass(frozen=True)
class DecodeConfig:
    """What a user chooses at the top; the rest in its group. `DecodeConfig.of(...)` and `with_(...)` take a
    group's field by its own name (tau_margin=, lookup=, kv_cache=...); `to_dict()` is flat."""
    strategy: str = "cure"        # ar | sd | parallel | cure | ddtree
    k: int = 16                   # block size: the root token plus K-1 drafted tokens (tree depth <= K-1)
    max_new_tokens: int = 256     # stop after this many emitted tokens
    temperature: float = 0.0      # 0 = greedy (token-identical to ar); > 0 = lossless rejection sampling
    seed: int = 0                 # seeds the sampler's torch.Generator when temperature > 0
    cure_tree: str = "best-first" # best-first: nodes by what the target accepts (acceptance.py), suffixes
                                  # re-drafted under the best substitutions | paper: branch 0 + repair branches at
                                  # UFPs (the paper's)
    v_max: int = 64               # node budget V(T) <= v_max (root excluded); cuts repair suffixes, never branch 0
    auto_budget: bool = False     # pick the budget per block from the measured cost curve (v_max = ceiling; budget.py)
    stop_at_eos: bool = True      # stop at the target's eos token(s)
    paper: PaperTree = PaperTree()
    best_first: BestFirstTree = BestFirstTree()
    ablations: Ablations = Ablations()
    execution: Execution = Execution()

    def __post_init__(self) -> None:
        # Rule: real-valued knobs are finite numbers (nan passes every `< 0` check; inf breaks sampling).
        for name, value in (("temperature", self.temperature), ("tau_margin", self.paper.tau_margin),
                            ("redraft_weight", self.best_first.redraft_weight)):
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"`{name}` must be a finite number, got {value}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.cure_tree not in CURE_TREES:
            raise ConfigError(f"unknown CURE tree {self.cure_tree!r}; choose one of {', '.join(CURE_TREES)}")
        if self.best_first.redraft_weight is not None and not 0.0 <= self.best_first.redraft_weight <= 1.0:
            raise ConfigError(f"`redraft_weight` must lie in [0, 1], got {self.best_first.redraft_weight}")
        if self.best_first.redrafts is not None and self.best_first.redrafts < 0:
            raise ConfigError(f"`redrafts` must be >= 0, got {self.best_first.redrafts}")
        if self.best_first.lookup < 0:
            raise ConfigError(f"`lookup` must be >= 0 (0: off), got {self.best_first.lookup}")
        if self.execution.kv_cache not in KV_LAYOUTS:
            raise ConfigError(f"unknown KV cache layout {self.execution.kv_cache!r}; choose one of {', '.join(KV_LAYOUTS)}")
        if self.execution.compile and self.execution.kv_cache != "static":
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
        if self.paper.tau_margin < 0:
            raise ConfigError(f"`tau_margin` must be >= 0, got {self.paper.tau_margin}")
        if not 0 <= self.paper.b_min <= self.paper.b_max:
            raise ConfigError(f"need 0 <= b_min <= `b_max`, got b_min={self.paper.b_min} b_max={self.paper.b_max}")
        if self.paper.max_ufps < 0:
            raise ConfigError(f"max_ufps must be >= 0, got {self.paper.max_ufps}")
        if self.paper.top_k < 2 or self.paper.top_k < self.paper.b_max + 1:
            raise ConfigError(f"top_k must be >= max(2, b_max + 1) = {max(2, self.paper.b_max + 1)}, got {self.paper.top_k}")
        # Rule: the budget never cuts branch 0, so it must at least hold the drafted block.
        if self.strategy in ("sd", "parallel", "cure", "ddtree") and self.v_max < self.k - 1:
            raise ConfigError(f"v_max={self.v_max} is smaller than the drafted block (K-1={self.k - 1}); "
                              f"raise `v_max` or lower `k`")

    @classmethod
    def of(cls, **flat) -> "DecodeConfig":
        """A config from flat keywords: top-level fields and groups' fields by their own names."""
        return cls().with_(**flat)

    @classmethod
    def from_dict(cls, data: dict) -> "DecodeConfig":
        """A config from `to_dict()`'s flat form (a trace's, a saved chat's); keys it no longer has are dropped."""
        return cls.of(**{k: v for k, v in data.items() if k in FLAT_FIELDS})

    @classmethod
    def from_user(cls, base: "DecodeConfig | None" = None, *, k: int | None = None, v_max: int | str = "auto",
                  b_max: int | None = None, **fields) -> "DecodeConfig":
        """The one rule from user-level knobs to a config (CLI flags, API keywords, chat settings).

        k None: 16 (the paper's block). v_max 'auto' (or None): the budget tuner picks the budget per
        block with AUTO_CEILING as its ceiling (never below the drafted block); a number fixes it.
        b_max sets the repair fan-out, and with it b_min = min(1, b_max) and top_k >= b_max + 1 (the
        alternatives a UFP can graft). Other fields pass through (flat names); `base` supplies the rest.
        """
        base = base or cls()
        k = 16 if k is None else k
        paper = base.paper
        b_max = paper.b_max if b_max is None else b_max
        budget = parse_auto_int(v_max, "v_max") if v_max is not None else None
        v = max(AUTO_CEILING, k - 1) if budget is None else budget
        return base.with_(k=k, b_max=b_max, b_min=min(paper.b_min, b_max), top_k=max(paper.top_k, b_max + 1),
                          v_max=v, auto_budget=budget is None, **fields)

    @property
    def depth(self) -> int:
        """Maximum tree depth: the drafted tokens per block."""
        return self.k - 1

    def with_(self, **changes) -> "DecodeConfig":
        """A copy with fields changed: top-level ones, whole groups, or a group's fields by their own names."""
        top, by_group = {}, {}
        for name, value in changes.items():
            group = GROUP_OF.get(name)
            if group is None:
                if name not in TOP_FIELDS:
                    raise ConfigError(f"unknown decoding option `{name}`")
                top[name] = value
            else:
                by_group.setdefault(group, {})[name] = value
        for group, values in by_group.items():
            top[group] = replace(top.get(group, getattr(self, group)), **values)
        return replace(self, **top)

    def to_dict(self) -> dict:
        """Flat: top-level fields and every group's fields by their own names (traces, saved chats, reports)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out.update(asdict(value) if f.name in GROUPS else {f.name: value})
        return out


TOP_FIELDS = frozenset(f.name for f in fields(DecodeConfig))
FLAT_FIELDS = frozenset((TOP_FIELDS - set(GROUPS)) | set(GROUP_OF))
