"""Prompt lookup: a continuation copied from the text so far, one more source of cure's tree.

A drafter that knows code misses what prose and word problems repeat: the question's numbers, a name,
a phrase. Prompt lookup drafts by copying (the idea behind transformers' `prompt_lookup_num_tokens`):
find the latest earlier occurrence of the last n tokens (n = policies.LOOKUP_NGRAM down to 1) and propose the
tokens that followed it. In best-first cure that path joins the heap beside the drafter's tables
(strategies.best_first `graft`); its nodes are scored by how often lookup tokens at that depth were
accepted so far, apart where they repeat the drafter's chain and where they depart from it (LookupStats),
so they compete with the drafter's nodes for the budget instead of taking it. Verification is the same tree pass, so output stays lossless.

The graft's score is already what the acceptance model ranks the drafter's nodes by, P(accepted | parent
accepted), so it takes the budget only where it is the likelier guess.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np



@dataclass(frozen=True)
class Graft:
    """A path grafted into the best-first heap from depth 1: tokens[i] with log-prob logp[i] given tokens[:i]."""
    tokens: list[int]
    logp: list[float]


def continuation(history: Sequence[int], max_ngram: int, length: int) -> list[int]:
    """Up to `length` tokens that followed the latest earlier occurrence of the last n tokens of
    `history` (the longest n <= max_ngram with a match); [] when nothing matches."""
    h = np.asarray(history, dtype=np.int64)                       # [L]
    if length <= 0 or h.size < 2:
        return []
    for n in range(min(max_ngram, h.size - 1), 0, -1):
        tail = h[-n:]
        # windows starting at j = 0 .. L-n-1: every occurrence but the tail itself, each with a next token
        windows = np.lib.stride_tricks.sliding_window_view(h[:-1], n)      # [L-n, n]
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n                             # the latest occurrence
            return h[start: start + length].tolist()
    return []


class NgramIndex:
    """`continuation` over a growing text in O(max_ngram) a block instead of O(text): the latest start
    of every n-gram (n <= max_ngram) that has a next token, kept as tokens arrive. Rule: the window at
    j..j+n-1 is indexed once token j+n exists, so a query sees exactly the windows of history[:-1]
    that `continuation` scans, and later starts overwrite earlier ones (the latest occurrence)."""

    def __init__(self, max_ngram: int, tokens: Sequence[int] = ()):
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}    # n-gram -> its latest start with a next token
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.tokens.append(int(t))
            end = len(self.tokens) - 1                  # windows ending just before `end` now have a next token
            for n in range(1, min(self.max_ngram, end) + 1):
                self.latest[tuple(self.tokens[end - n:end])] = end - n

    def continuation(self, length: int) -> list[int]:
        """continuation(self.tokens, max_ngram, length), from the index."""
        h = self.tokens
        if length <= 0 or len(h) < 2:
            return []
        for n in range(min(self.max_ngram, len(h) - 1), 0, -1):
            j = self.latest.get(tuple(h[-n:]))
            if j is not None:
                return h[j + n: j + n + length]
        return []


@dataclass
class DepthRate:
    """P(accepted | parent accepted) by path depth: tried (its parent was accepted) and accepted, with one prior
    success and one prior failure (so an unseen depth scores log 1/2)."""
    tried: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def logp(self, depth: int) -> float:
        """log-prob that the token at path depth `depth` (1-based) is accepted given its parent was."""
        i = depth - 1
        t = self.tried[i] if i < len(self.tried) else 0
        a = self.accepted[i] if i < len(self.accepted) else 0
        return math.log((a + 1) / (t + 2))

    def count(self, depth: int, hit: bool) -> None:
        while len(self.tried) < depth:
            self.tried.append(0)
            self.accepted.append(0)
        self.tried[depth - 1] += 1
        self.accepted[depth - 1] += hit


@dataclass
class LookupStats:
    """Acceptance of lookup tokens by depth along their path, kept over one engine's generations like the budget
    tuner, on the acceptance model's scale (acceptance.py), so a graft competes with the drafter's nodes in the
    same units. Rule: a lookup token that repeats the drafter's top-1 chain (the graft's first `agree` tokens)
    and one that departs from it are counted apart. Where they agree the drafter's node is there anyway and
    the graft only carries its score on; where they part, the graft's own token is right only where the drafter
    is wrong, and one pooled rate lets a drafter that is right make the graft's own nodes look right."""
    on_chain: DepthRate = field(default_factory=DepthRate)
    own: DepthRate = field(default_factory=DepthRate)

    def path_logp(self, n: int, agree: int) -> list[float]:
        """The scores of a graft of n tokens whose first `agree` repeat the drafter's top-1 chain."""
        return [(self.on_chain if d <= agree else self.own).logp(d) for d in range(1, n + 1)]

    def observe(self, lookup_nodes: Sequence[int], accepted: set[int], agree: int) -> None:
        """lookup_nodes: the tree node holding each lookup token, shallow to deep, as far as the tree
        took the path; accepted: the accepted node indices; agree: as in path_logp."""
        for i, node in enumerate(lookup_nodes):
            if i > 0 and lookup_nodes[i - 1] not in accepted:
                break                                            # its parent was rejected: not tried
            (self.on_chain if i < agree else self.own).count(i + 1, node in accepted)
