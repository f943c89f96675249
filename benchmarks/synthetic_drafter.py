"""A SYNTHETIC benchmark drafter: proposals that agree with the target's greedy continuation at a set
per-depth rate, so that trees on random weights have realistic sizes (#13's GPU must-show).

No weights reach the GPU machines, and a random drafter agrees with a random target on nothing, so
every tree there accepts ~0 tokens and a timing of it says nothing about trees of the sizes a real
drafter (DFlash-8B: tau ~6.5 at K=16) makes. This drafter knows the answer instead: it is given the
target's greedy output for the prompt (`expect`, from an `ar` run: every lossless strategy emits it
at T=0) and draws, for each drafted position, where the target's token sits among its candidates.
Every number it produces is SYNTHETIC and is labelled so wherever it appears (result keys, printouts).

The model, per drafted row at depth d (1-based, below the block's root), calibrated by construction:
- the row's candidate probabilities: the top-1's p1 ~ Beta(m c, (1 - m) c) with m = `rates[d-1]` (the
  profile: constant by default, solved so that a chain's expected tau is the one asked for,
  `profile_for_tau`) and c = `concentration`; the rest falls geometrically by rank (`_probs`);
- the target's token then sits at rank j with probability p_j, absent past the row's width (`_rank`).
  So the top-1 is right with probability m on average, a sure row more often than an unsure one
  (margins carry signal, as a trained drafter's do: CURE's UFPs, the calibration), and a tree's
  alternatives hold the target's token where a chain misses, as often as their probabilities say;
- `confidence` c: the drafter reports c x log p renormalised (c < 1 under-confident, > 1 over-confident)
  while the target's token is still placed by the true p: the same accuracy, another calibration;
- rows of the block below its first wrong top-1 draw at `below_miss` x the rate (1.0 by default: a
  block-parallel drafter drafts every position from the context alone, so a miss above does not bias
  a row). A re-draft under a prefix that follows the target's tokens draws its rows afresh at the
  profile's rates (at their depths); rows under any other prefix, or past the known output, hold
  random tokens (the target's continuation there is unknown).
Draws are seeded by the block's position (and the prefix), so every strategy sees the same proposal
at the same position: their trees differ only by how they spend the candidates.

`inner`: a real drafter run alongside for its cost (its forwards, the target features it asks for):
its proposals are discarded. Time spent drawing the synthetic rows is kept in `seconds`, so that a
host-overhead measurement can count it as drafting (the forward it stands in for), not as engine work.
"""
from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from cure_core.drafters.base import DEFAULT_REDRAFTS, Drafter, Proposal

STRIDES = (7919, 7927)  # primes: base + j * stride (mod span) are distinct for j < span where gcd(stride, span) = 1


def expected_tau(rates: Sequence[float], k: int) -> float:
    """A chain's expected tau at block size k: 1 + sum_d prod_{j<=d} rates[j] (bonus included)."""
    tau, run = 1.0, 1.0
    for d in range(1, k):
        run *= rates[min(d, len(rates)) - 1]
        tau += run
    return tau


def profile_for_tau(tau: float, k: int) -> tuple[float, ...]:
    """The constant per-depth agreement rate whose chain reaches `tau` at block size k (bisection)."""
    if not 1.0 <= tau <= k:
        raise ValueError(f"a chain's tau at K={k} lies in [1, {k}], not {tau}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tau([mid], k) < tau else (lo, mid)
    return ((lo + hi) / 2,)


@dataclass(frozen=True)
class Profile:
    rates: tuple[float, ...]      # [D] P(top-1 is the target's token) at depth 1..D (the last one repeats)
    below_miss: float = 1.0       # rate multiplier for a block's rows below its first wrong top-1
    concentration: float = 4.0    # of the top-1 probability's Beta draw: lower spreads sure and unsure rows apart
    confidence: float = 1.0       # the reported log-probs are this x the true ones, renormalised: < 1 an
                                  # under-confident drafter (flatter), > 1 an over-confident one, at the same accuracy
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rates or not all(0.0 <= r <= 1.0 for r in self.rates):
            raise ValueError(f"agreement rates must lie in [0, 1]: {self.rates}")
        if not 0.0 <= self.below_miss <= 1.0:
            raise ValueError(f"below_miss must lie in [0, 1]: {self.below_miss}")
        if not 0.0 < self.confidence <= 16.0:
            raise ValueError(f"confidence must lie in (0, 16]: {self.confidence}")

    def rate(self, depth: int) -> float:
        return self.rates[min(depth, len(self.rates)) - 1]


class SyntheticDrafter(Drafter):
    """The Drafter protocol (drafters/base.py) over a known greedy output; block-parallel, one pass."""
    sequential = False
    redrafts_while_drafting = False

    def __init__(self, profile: Profile, vocab_size: int, block_size: int, inner=None, mask_token_id: int | None = None):
        self.profile = profile
        self.vocab = int(vocab_size)
        self.block_size = int(block_size)
        self.inner = inner
        self.mask = mask_token_id
        span = self.vocab - (mask_token_id is not None and 0 <= mask_token_id < self.vocab)
        self.stride = next(s for s in STRIDES if math.gcd(s, span) == 1)
        self.name = f"synthetic({inner.name})" if inner is not None else "synthetic"
        self.target_layers = tuple(inner.target_layers) if inner is not None else ()
        self.redraft_policy = getattr(inner, "redraft_policy", DEFAULT_REDRAFTS)
        self.reference: list[int] = []      # prompt + the target's greedy output (`expect`)
        self.seq: list[int] = []            # the committed tokens (context + advanced)
        self.agree = 0                      # len of the common prefix of seq and reference
        self._root_at = 0                   # the last proposal's root position
        self._root_on = False               # whether that root continued the target's output
        self.seconds = 0.0                  # time drawing synthetic rows (not the inner drafter's)

    # ---- the truth ----

    def expect(self, reference: Sequence[int]) -> None:
        """The target's greedy output for the next generation(s): prompt tokens + generated tokens."""
        self.reference = [int(t) for t in reference]
        self.agree = self._common(0)

    def _common(self, start: int) -> int:
        n, ref, seq = start, self.reference, self.seq
        while n < len(seq) and n < len(ref) and seq[n] == ref[n]:
            n += 1
        return n

    def _truth(self, at: int) -> int:
        return self.reference[at] if at < len(self.reference) else -1

    # ---- the protocol ----

    def reset(self, context: Sequence[int], hidden: torch.Tensor | None) -> None:
        self.seq = [int(t) for t in context]
        self.agree = self._common(0)
        if self.inner is not None:
            self.inner.reset(context, hidden)

    def truncate(self, n: int) -> None:
        if not 0 <= n <= len(self.seq):
            raise ValueError(f"truncate({n}): the drafter holds {len(self.seq)} context tokens")
        self.seq = self.seq[:n]
        self.agree = min(self.agree, n)
        if self.inner is not None:
            self.inner.truncate(n)

    def advance(self, tokens: Sequence[int], hidden: torch.Tensor | None) -> None:
        on = self.agree == len(self.seq)
        self.seq.extend(int(t) for t in tokens)
        if on:
            self.agree = self._common(self.agree)
        if self.inner is not None:
            self.inner.advance(tokens, hidden)

    def prefill(self) -> None:
        if self.inner is not None and hasattr(self.inner, "prefill"):
            self.inner.prefill()

    def propose(self, root: int, n: int, top_k: int) -> Proposal:
        if self.inner is not None:
            self.inner.propose(root, n, top_k)                 # for its cost; its rows are discarded
        t0 = time.perf_counter()
        p = len(self.seq)                                      # the root's position
        self._root_at = p
        on = self.agree == p and self._truth(p) == int(root)
        self._root_on = on
        truths = [self._truth(p + d) if on else -1 for d in range(1, n + 1)]
        rng = np.random.default_rng((self.profile.seed, p, 0))
        out = self._rows(rng, truths, [self.profile.rate(d) for d in range(1, n + 1)], top_k, chain=True)
        self.seconds += time.perf_counter() - t0
        return out

    def redraft_topk(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int], top_k: int) -> list[Proposal]:
        if self.inner is not None:
            self.inner.redraft_topk(prefixes, lengths, top_k)
        t0 = time.perf_counter()
        p = self._root_at                                      # re-drafts hang off the last proposal's root
        out = []
        for prefix, length in zip(prefixes, lengths):
            prefix = [int(t) for t in prefix]
            follows = self._root_on and prefix == self.reference[p + 1:p + 1 + len(prefix)]
            depth0 = len(prefix)                               # rows sit at depths depth0+1 ..
            truths = [self._truth(p + depth0 + i) if follows else -1 for i in range(1, length + 1)]
            key = zlib.crc32(np.asarray(prefix, dtype=np.int64).tobytes())
            rng = np.random.default_rng((self.profile.seed, p, 1, depth0, key))
            rates = [self.profile.rate(depth0 + i) for i in range(1, length + 1)]
            out.append(self._rows(rng, truths, rates, top_k, chain=False))
        self.seconds += time.perf_counter() - t0
        return out

    def redraft(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
        return [q.tokens for q in self.redraft_topk(prefixes, lengths, 1)]

    # ---- the draws ----

    def _rows(self, rng: np.random.Generator, truths: list[int], rates: list[float], width: int,
              chain: bool) -> Proposal:
        """Rows with the target's token `truths[i]` (-1: unknown) placed by the profile -> a Proposal."""
        n, w = len(truths), max(1, int(width))
        if w + 1 > self.vocab - 1:
            raise ValueError(f"a row of {w} candidates needs a vocabulary of more than {w + 1} ids")
        if n == 0:
            empty = torch.zeros((0, w), dtype=torch.long)
            return Proposal([], empty, empty.float())
        truth = np.asarray(truths, dtype=np.int64)                           # [n]
        known = truth >= 0
        rate = np.asarray(rates, dtype=np.float64)                            # [n]
        u = rng.random(n)
        if chain and self.profile.below_miss != 1.0:
            probs = np.empty((n, w))
            rank = np.empty(n, dtype=np.int64)
            scale = 1.0
            for i in range(n):                                                # rows below the first miss
                probs[i] = self._probs(rng, rate[i:i + 1] * scale, w)[0]
                rank[i] = self._rank(probs[i:i + 1], u[i:i + 1])[0]
                if not (known[i] and rank[i] == 0):
                    scale = self.profile.below_miss
        else:
            probs = self._probs(rng, rate, w)                                 # [n, w]
            rank = self._rank(probs, u)                                       # [n]: w = not among the w
        rank = np.where(known, rank, w)
        # w + 1 distinct ids per row, never the mask id (drawn over the other ids, then shifted past it);
        # the truth, where drawn among them, gives its place to the spare
        span = self.vocab - (self.mask is not None and 0 <= self.mask < self.vocab)
        base = rng.integers(0, span, n)
        cand = (base[:, None] + np.arange(w + 1)[None, :] * self.stride) % span     # [n, w+1]
        if span < self.vocab:
            cand = cand + (cand >= self.mask)
        hit = cand[:, :w] == truth[:, None]
        ids = np.where(hit, cand[:, w:w + 1], cand[:, :w])                         # [n, w]
        rows = np.flatnonzero(rank < w)
        ids[rows, rank[rows]] = truth[rows]
        logp = np.log(np.maximum(probs, 1e-30))                                      # [n, w] the true log-probs
        if self.profile.confidence != 1.0:
            # Rule: the target's token was placed by the true probabilities (the accuracy); only what the drafter
            # reports changes: c x log p over the row's candidates and the mass beyond them, renormalised.
            rest = np.log(np.maximum(1.0 - probs.sum(axis=1, keepdims=True), 1e-30))   # [n, 1]
            scaled = self.profile.confidence * np.concatenate([logp, rest], axis=1)
            logp = (scaled - np.logaddexp.reduce(scaled, axis=1, keepdims=True))[:, :w]
        logp = torch.from_numpy(logp).float()
        top_ids = torch.from_numpy(ids)
        return Proposal(tokens=top_ids[:, 0].tolist(), top_ids=top_ids, top_logprobs=logp)

    def _probs(self, rng: np.random.Generator, mean: np.ndarray, w: int) -> np.ndarray:
        """[n] mean top-1 probabilities -> [n, w] candidate probabilities, best first.

        Rule (calibrated by construction): the top-1's probability p1 ~ Beta(m c, (1 - m) c) (c =
        `concentration`), so E[p1] is the profile's rate; the rest falls geometrically by rank, with a ratio
        of at least 1/2 and enough that the 2nd candidate is never above the 1st. The target's token is then
        drawn at rank j with probability p_j (`_rank`), so a candidate's draft probability is its chance."""
        m = np.clip(mean, 1e-3, 1 - 1e-3)
        c = self.profile.concentration
        p1 = rng.beta(m * c, (1 - m) * c)                                         # [n]
        ratio = np.maximum(0.5, (1 - 2 * p1) / np.maximum(1 - p1, 1e-12))          # p2 <= p1
        ratio = np.minimum(ratio, 1 - 1e-6)
        rest = ((1 - p1) * (1 - ratio))[:, None] * ratio[:, None] ** np.arange(w - 1)[None, :]   # [n, w-1]
        return np.concatenate([p1[:, None], rest], axis=1)

    @staticmethod
    def _rank(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Where the target's token sits: rank j with probability probs[:, j]; w (absent) with the rest."""
        return (np.cumsum(probs, axis=1) <= u[:, None]).sum(axis=1)
