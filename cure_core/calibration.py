"""Best-first cure ranks tree nodes by what the target accepts, not by what the drafter believes.

ddtree (and best-first cure before this rule) scores a node by its joint draft log-prob: every candidate's
log q counts the same, whether it is a table's top-1 guess or a lower candidate, a substitution. The target
does not treat them the same. On the 1.5B pair's PARD drafter (951 tuning blocks, HumanEval 1-20, GSM8K 21-40,
prose_tune10; nodes of 4-node trees whose parent the target accepted) a top-1 candidate was accepted with
probability about q^1.83, a lower candidate with about q^1.04: the drafter is overconfident in its top-1 and
about right on its alternatives, so a best-first tree on q under-spends on substitutions. Replayed on that pair's
held-out blocks (HumanEval 21-40, GSM8K 1-20, chat20; the learner starting cold, as here, gate included) the
calibrated trees accept 0.9-1.6% more tokens a block than ddtree's at 3-8 nodes with no drafter pass; on the
default pair's DFlash drafter, whose top-1 is better calibrated, -0.6% at 3 nodes, -0.1% at 4, +0.3-0.6% at 5-8
(benchmarks/calibration_replay.py; benchmarks/results/calibration_replay_*).

Rule: at T=0 the engine tells this learner, for every node whose parent the target accepted (or the root's
children), the node's kind (top-1 or lower candidate), its own draft log-prob log q and whether the target
accepted it. Per kind, gamma is the maximum-likelihood fit of P(accepted | parent accepted) = q^gamma
(budget.fit_power) over the last `window` such nodes. Best-first cure then scores a lower candidate's
log q times gamma_lower / gamma_top1 (strategies.best_first `weight`): the order of the fitted acceptance
probabilities, since multiplying every score by gamma_top1 changes no order. Until both kinds have
`min_samples` nodes the weight is 1 (ddtree's order). At T>0 nothing is learned (acceptance is sampled); the
weight T=0 generations learned on the same engine applies, and rejection sampling is lossless on any tree.

Whether the fitted weight is used at all is measured, per budget, as the lookup graft's is (lookup.py): at T=0
the engine also builds the block's tree with the other weight (1 where the fit is used, the fit where 1 is)
wherever that tree is exactly what the block would otherwise have verified (no re-draft pass ran), and the
target's greedy path walked down it says what it would have accepted. The fit is withheld at a budget while the
recent such gains there average below 0 (FlipGains); withheld blocks go on measuring.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .budget import fit_power
from .redraft_price import own_or_pooled

TOP1, LOWER = 0, 1          # node kinds: a table's best candidate, any other (a substitution)


@dataclass
class FlipGains:
    """Per budget, what one choice in best-first cure's tree (the lookup graft, lookup.py; the node weight, this
    module) wins in accepted tokens, measured at T=0 on the tree with the choice flipped (flip_gain).
    Rule: the choice is taken at budget v while the last `window` gains there average >= 0 (a choice that
    changes nothing costs only host work), once `min_samples` blocks there measured it. Before that, v follows
    every budget's gains pooled (the same rule over all of them), and with fewer than `min_samples` of those
    the choice is taken: a budget's first blocks do not each learn again what the others know (the budget
    tuner visits several). Blocks without the choice go on measuring, so a
    choice that starts to win comes back. Once v holds `window` gains, only every
    `every`-th block there builds the flipped tree (`measures`): that tree is a second best-first walk in
    Python on every block, and a full window turns only after several blocks' gains change sign anyway."""
    window: int = 32               # blocks per budget the mean gain is over
    min_samples: int = 8           # blocks at a budget before the choice may be withheld there
    every: int = 4                 # once a budget's window is full, the flipped tree is built on every 4th block
    gains: dict[int, deque] = field(default_factory=dict, repr=False, compare=False)   # budget -> recent gains
    _asked: dict[int, int] = field(default_factory=dict, repr=False, compare=False)    # budget -> blocks asked

    def allows(self, v: int) -> bool:
        """Whether trees of budget v take the choice (the rule)."""
        basis = own_or_pooled(self.gains, v, self.min_samples)
        return len(basis) < self.min_samples or sum(basis) >= 0

    def measures(self, v: int) -> bool:
        """Whether this block of budget v builds the flipped tree (one call per block that could)."""
        n = self._asked[v] = self._asked.get(v, 0) + 1
        return len(self.gains.get(v, ())) < self.window or n % self.every == 0

    def observe(self, v: int, used: bool, accepted: int, alt_held: int) -> None:
        """A block of budget v verified at T=0 accepted `accepted` nodes with the choice taken (`used`) or not;
        the tree with it flipped holds `alt_held` tokens of the target's greedy path (accepted + bonus)."""
        self.gains.setdefault(v, deque(maxlen=self.window)).append(flip_gain(used, accepted, alt_held))


@dataclass
class NodeCalibration:
    """Per node kind, the recent (log q, accepted) of nodes the target could have accepted, and the weight of
    a lower candidate's log q in best-first scores (the module's rule)."""
    window: int = 512             # nodes per kind the fit is over
    min_samples: int = 64         # nodes of each kind before the weight leaves 1
    refit_every: int = 8          # blocks between fits (a fit is a 49-point grid over <= window nodes)
    lo: float = 0.25              # the weight is clamped to [lo, hi]: one kind's fit at its grid's edge
    hi: float = 4.0               # cannot swing the tree to all width or all depth
    # per budget, whether the fitted weight is used: what it won against the tree with the other weight
    flips: FlipGains = field(default_factory=FlipGains, repr=False)
    blocks: int = field(default=0, init=False)                          # blocks observed
    gammas: tuple[float, float] | None = field(default=None, init=False)  # the last fit (top-1, lower)
    _weight: float = field(default=1.0, init=False, repr=False)
    seen: tuple[deque, deque] = field(init=False, repr=False)            # per kind: (log q, accepted)

    def __post_init__(self):
        self.seen = (deque(maxlen=self.window), deque(maxlen=self.window))

    def weight(self) -> float:
        """The fitted weight of a lower candidate's log q relative to a top-1's (1 until both kinds are fitted)."""
        return self._weight

    def observe(self, ranks: Sequence[int], logq: Sequence[float], parents: Sequence[int], accepted: set[int]) -> None:
        """One block verified at T=0: per tree node its rank in its table (-1: not from a table, e.g. a lookup
        graft, skipped), its own draft log-prob, its parent (-1: the root) and the accepted nodes."""
        for i, (rank, lq, parent) in enumerate(zip(ranks, logq, parents)):
            if rank >= 0 and (parent < 0 or parent in accepted) and lq < 0.0:
                self.seen[LOWER if rank > 0 else TOP1].append((lq, i in accepted))
        self.blocks += 1
        if self.blocks % self.refit_every == 0 and min(len(s) for s in self.seen) >= self.min_samples:
            top1, lower = (fit_power(np.array([lq for lq, _ in s]), np.array([hit for _, hit in s], dtype=bool),
                                     hi=self.hi) for s in self.seen)
            self.gammas = (top1, lower)
            self._weight = min(max(lower / top1, self.lo), self.hi)


def flip_gain(used: bool, accepted: int, alt_held: int) -> int:
    """Accepted tokens a choice won in a block verified at T=0: `accepted` with the choice taken (`used`) or not,
    `alt_held` the tokens of the target's greedy path (accepted + bonus) the tree with it flipped holds, which
    that tree would have accepted (alt_held == accepted + 1: it did at least one better; counted as one)."""
    return accepted - alt_held if used else alt_held - accepted
