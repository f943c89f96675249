"""The immutable record of one decoding iteration.

The engine yields one `Block` per target forward; the TUI, the trace writer, bench metrics and
`cure inspect` only read these records. Everything here is plain Python data (ints, floats,
tuples), so a Block is cheap to post across threads and round-trips through JSON exactly.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class UFP:
    """An Uncertainty Focal Point: a drafted position whose top1-top2 margin is below tau_margin."""
    position: int                 # index in the drafted block (node depth = position + 1)
    margin: float                 # m_i = l_{i,1} - l_{i,2} (draft log-probs)
    budget: int                   # b_i: repair branches granted here
    alternatives: tuple[int, ...]  # substituted tokens actually grafted (next-best draft tokens)


@dataclass(frozen=True)
class TreeNode:
    token: int
    parent: int                   # index of the parent node in Block.nodes; -1 = the root
    depth: int                    # 1..K-1 (the root has depth 0)
    branch: int                   # 0 = branch 0 (the drafted block); r >= 1 = the r-th other branch
    accepted: bool                # on the accepted (winning) path


@dataclass(frozen=True)
class Timings:
    prefill_ms: float = 0.0       # only on the first block of a generation
    prefill_tokens: int = 0       # first block: prompt tokens the prefill forwarded...
    reused_tokens: int = 0        # ...and those whose K/V rows a previous generation left (reuse_prefix)
    draft_ms: float = 0.0         # drafter: block proposal and repair re-drafts
    tree_ms: float = 0.0          # UFPs, budget, trie merge, masks (no model compute)
    verify_ms: float = 0.0        # the one target forward over the tree, plus acceptance
    commit_ms: float = 0.0        # KV compaction and drafter resync bookkeeping
    learn_ms: float = 0.0         # the policy's learners taking in the verified block (policy.learn)

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.tree_ms + self.verify_ms + self.commit_ms + self.learn_ms


@dataclass(frozen=True)
class Resync:
    mode: str                     # "winner": drafter fed the emitted path; "branch0": the no-resync ablation; "none"
    tokens: tuple[int, ...]       # tokens the drafter's state advanced by (its pending context)


@dataclass(frozen=True)
class Block:
    index: int                    # 0-based iteration number within the generation
    strategy: str
    context_len: int              # committed tokens before this block, prompt included, root excluded
    root: int                     # last emitted token: the tree's root, verified in this block's forward
    draft: tuple[int, ...]        # branch 0: the drafted block y_0..y_{K-2} (empty for ar)
    margins: tuple[float, ...]    # per drafted position, top1 - top2 draft log-prob (empty when unknown)
    ufps: tuple[UFP, ...]
    nodes: tuple[TreeNode, ...]   # every tree node, parents before children
    accepted: tuple[int, ...]     # node indices of the winning path, root excluded, shallow to deep
    winner: int                   # branch of the winning path's deepest node (0 if branch 0 or nothing won)
    branch0_accepted: int         # a(pi_0): tokens branch 0 alone would have had accepted
    bonus: int                    # the target's token after the winning path (argmax, or sampled)
    emitted: tuple[int, ...]      # tokens emitted this block (accepted path + bonus), cut at a stop
    resync: Resync
    timings: Timings
    stop: str | None = None       # "eos" | "max_new_tokens" | "context" when the generation ended here
    meta: dict = field(default_factory=dict)  # free-form extras (e.g. ddtree scores); JSON-safe

    # --- derived metrics (DESIGN.md: names as vLLM uses them) ---
    @property
    def accept_length(self) -> int:
        """a(pi*): drafted tokens accepted on the winning path (bonus excluded)."""
        return len(self.accepted)

    @property
    def tree_size(self) -> int:
        """V(T): node count, root excluded."""
        return len(self.nodes)

    @property
    def repair_won(self) -> bool:
        """A repair branch beat branch 0 (strictly more accepted tokens)."""
        return self.accept_length > self.branch0_accepted

    @property
    def delta_a(self) -> int:
        """Extra tokens the tree gained over branch 0 alone."""
        return self.accept_length - self.branch0_accepted

    @property
    def no_draft_reason(self) -> str | None:
        """Why this block verified no draft tree, in words (the tree panel, `cure generate`'s stats line);
        None when it had one. Rule: derived from what the block recorded: ar drafts nothing; the budget
        tuner's budget 0 (meta: its choice and the best tree it was chosen over, engine._budget_meta);
        else the length limit left no room. Config fields in backticks (the CLI shows flags)."""
        if self.nodes:
            return None
        if self.strategy == "ar":
            return "ar drafts nothing"
        if self.meta.get("v_max") == 0:
            best = self.meta.get("best_tree")
            if not best:
                return "budget 0: the budget tuner has no tree to compare it with yet"
            v, k = best["v_max"], best["k"]
            force = f"`v_max`={v}" if k is None else f"`k`={k} `v_max`={v}"   # k: a shorter block it needs
            return (f"budget 0: on this machine a tree costs more than the drafts win back (the best, V={v}, "
                    f"is predicted at {best['predicted_speedup']:.2f}x of no tree); {force} forces one")
        return "no room left to draft: the answer reached its length limit"

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Block":
        d = dict(d)
        d["ufps"] = tuple(UFP(**{**u, "alternatives": tuple(u["alternatives"])}) for u in d["ufps"])
        d["nodes"] = tuple(TreeNode(**n) for n in d["nodes"])
        d["timings"] = Timings(**d["timings"])
        d["resync"] = Resync(mode=d["resync"]["mode"], tokens=tuple(d["resync"]["tokens"]))
        for key in ("draft", "margins", "accepted", "emitted"):
            d[key] = tuple(d[key])
        return Block(**d)
