"""What the target accepts: P(a node is accepted | its parent was), learned online from verified blocks.

ddtree ranks a node by its joint draft probability:
the product of the drafter's q along its path. That is the target's acceptance only where the drafter is
calibrated. A drafter that is right but unsure (every top-1 correct at q = 0.1) loses its depth to width
under that ranking, and an over-confident one gets too deep a chain. So best-first cure ranks a node by

    score(node) = sum over its path of log P(accepted | parent accepted; rank, depth, log q)

The model, per rank class (a table's top-1, its second candidate, any lower one), depth band (1, 2-3, 4-7,
8+) and bin of the node's own draft log-prob (13 bins):
  - a Beta estimate of the acceptance rate, whose prior mean is q^gamma: gamma is the rank class's
    maximum-likelihood power (budget.fit_power) over its recent nodes, so a bin nothing fell in follows the
    class's calibration;
  - each depth band shrinks toward the class's pooled curve (its depth bands summed), so a rare band borrows
    from the others;
  - each curve is made non-decreasing in log q (pool adjacent violators): a likelier candidate is never
    estimated less acceptable than an unlikelier one of the same kind;
  - between bin centres the log-ratio to the prior is interpolated, so before any block (every count 0,
    gamma 1) the score is exactly the joint draft log-prob: ddtree's order.
Counts decay by `decay` per block, so the model follows a drafter whose regime changes (code, then prose).
At T>0 nothing is learned (acceptance is sampled); rejection sampling is lossless on any tree.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .budget import fit_power

RANK_CLASSES = 3                          # top-1, second, lower
BAND_STARTS = (1, 2, 4, 8)                # depth bands: 1, 2-3, 4-7, 8+
EDGES = np.array([-8.0, -6.0, -5.0, -4.0, -3.0, -2.5, -2.0, -1.5, -1.0, -0.6, -0.3, -0.1])   # 13 log q bins
CENTRES = np.concatenate([[-9.0], (EDGES[:-1] + EDGES[1:]) / 2, [-0.05]])               # [13] a bin's log q


def rank_class(rank: int) -> int:
    return min(rank, RANK_CLASSES - 1)


def depth_band(depth: int) -> int:
    return sum(depth >= s for s in BAND_STARTS) - 1


def _pav(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) fit of y [n] by pooling adjacent violators."""
    means, weights, sizes = [], [], []
    for yi, wi in zip(y.tolist(), w.tolist()):
        means.append(yi)
        weights.append(wi)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m1, w1, n1 = means.pop(), weights.pop(), sizes.pop()
            total = weights[-1] + w1
            means[-1] = (means[-1] * weights[-1] + m1 * w1) / total if total > 0 else (means[-1] + m1) / 2
            weights[-1] = total
            sizes[-1] += n1
    return np.repeat(means, sizes)


@dataclass
class AcceptanceModel:
    """The module's model: `logp(rank, depth, logq)` is a node's log P(accepted | parent accepted)."""
    strength: float = 2.0         # pseudo-nodes of the prior in each Beta estimate (and of the pooled curve)
    decay: float = 0.995          # counts kept per block (half-life ~140 blocks)
    window: int = 512             # recent nodes per rank class the power gamma is fitted over
    refit_every: int = 8          # blocks between gamma fits, after the first `eager` blocks (fitted after each)
    eager: int = 32
    min_fit: int = 1              # nodes of a class before its gamma leaves 1
    hits: np.ndarray = field(init=False, repr=False)       # [R, bands, bins] accepted (decayed)
    seen: np.ndarray = field(init=False, repr=False)       # [R, bands, bins] tried (decayed)
    gammas: np.ndarray = field(init=False)                 # [R] prior powers
    blocks: int = field(default=0, init=False)
    _recent: list = field(init=False, repr=False)          # per class: deque of (log q, accepted)
    _corr: np.ndarray = field(init=False, repr=False)      # [R, bands, bins] log P_bin - gamma x centre
    _learned: bool = field(default=False, init=False)      # any node seen: corrections may be non-zero

    def __post_init__(self):
        shape = (RANK_CLASSES, len(BAND_STARTS), len(CENTRES))
        self.hits, self.seen = np.zeros(shape), np.zeros(shape)
        self.gammas = np.ones(RANK_CLASSES)
        self._recent = [deque(maxlen=self.window) for _ in range(RANK_CLASSES)]
        self._corr = np.zeros(shape)

    def logp(self, rank: int, depth: int, logq: float) -> float:
        """log P(accepted | parent accepted) of a node holding its table's `rank`-th candidate (0: top-1) at
        `depth`, with draft log-prob `logq` (<= 0)."""
        r = rank_class(rank)
        prior = self.gammas[r] * logq
        if not self._learned or logq == -math.inf:
            return prior
        corr = self._corr[r, depth_band(depth)]
        c = float(np.interp(logq, CENTRES, corr))
        return min(prior + c, 0.0)

    def observe(self, ranks: Sequence[int], logq: Sequence[float], parents: Sequence[int],
                depths: Sequence[int], accepted: set[int]) -> None:
        """One block verified at T=0: per tree node its rank in its table (-1: not from a table, such as a
        lookup graft: skipped), its draft log-prob, parent (-1: the root), depth; and the accepted nodes.
        Only nodes the target could have accepted count: those whose parent it accepted."""
        self.hits *= self.decay
        self.seen *= self.decay
        for i, (rank, lq, parent, depth) in enumerate(zip(ranks, logq, parents, depths)):
            if rank < 0 or not (parent < 0 or parent in accepted) or lq == -math.inf:
                continue
            r, b, x, hit = rank_class(rank), depth_band(depth), int(np.searchsorted(EDGES, lq)), i in accepted
            self.seen[r, b, x] += 1.0
            self.hits[r, b, x] += hit
            self._recent[r].append((min(lq, 0.0), hit))
            self._learned = True
        self.blocks += 1
        if self.blocks <= self.eager or self.blocks % self.refit_every == 0:
            for r, recent in enumerate(self._recent):
                if len(recent) >= self.min_fit:
                    arr = np.array(recent, dtype=np.float64)
                    self.gammas[r] = fit_power(arr[:, 0], arr[:, 1] > 0.5, hi=4.0)
        if self._learned:
            self._refit()

    def _refit(self) -> None:
        """The per-bin estimates, shrunk and made isotonic, as log-ratios to the prior at each bin's centre."""
        k = self.strength
        prior = np.exp(self.gammas[:, None] * CENTRES[None, :])                  # [R, bins]
        pooled = (self.hits.sum(1) + k * prior) / (self.seen.sum(1) + k)       # [R, bins]
        est = (self.hits + k * pooled[:, None, :]) / (self.seen + k)           # [R, bands, bins]
        weight = self.seen + k
        for r in range(RANK_CLASSES):
            for b in range(len(BAND_STARTS)):
                est[r, b] = _pav(est[r, b], weight[r, b])
        self._corr = np.log(np.clip(est, 1e-6, 1.0)) - self.gammas[:, None, None] * CENTRES[None, None, :]
