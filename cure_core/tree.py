"""The draft tree: a trie of candidate paths under the root, its attention mask and acceptance.

Nodes are stored parent-before-child in flat lists, so the tree is a handful of int arrays:
tokens[i], parents[i] (-1 = the root), depths[i] (1..K-1), branches[i]. Acceptance is computed one
depth level at a time; the ancestor mask one node at a time (fill_ancestors: cheaper at tree sizes).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    branches: list[int] = field(default_factory=list)
    _child: dict = field(default_factory=dict)   # (parent, token) -> node index: the trie merge
    _repair_width: dict = field(default_factory=dict)  # depth -> repair nodes at that depth (beam)

    def __len__(self) -> int:
        return len(self.tokens)

    def add_node(self, token: int, parent: int, branch: int) -> int:
        """One new node under `parent` (-1: the root) that the trie does not hold yet: add_path's bookkeeping
        for a single token without its loop (best-first adds every node this way, up to 64 a tree)."""
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        depth = self.depths[parent] + 1 if parent >= 0 else 1
        self.depths.append(depth)
        self.branches.append(branch)
        self._child[(parent, token)] = node
        if branch != 0:
            self._repair_width[depth] = self._repair_width.get(depth, 0) + 1
        return node

    def add_path(self, tokens, branch: int, *, v_max: int | None = None, beam: int | None = None,
                 parent: int = -1) -> list[int]:
        """Merge one candidate path (tokens from depth 1, or below `parent`) into the trie.

        Shared prefixes reuse existing nodes. New nodes stop when the node budget `v_max` is
        reached or, for repair branches (branch != 0), when `beam` repair nodes already sit at
        that depth: the budget cuts the path's suffix, never what is already in the tree.
        Returns the node index of every token of the path that is in the tree.
        """
        path = []
        depth = self.depths[parent] if parent >= 0 else 0
        child, width = self._child, self._repair_width
        tokens_, parents_, depths_, branches_ = self.tokens, self.parents, self.depths, self.branches
        for tok in tokens:
            tok = int(tok)
            depth += 1
            node = child.get((parent, tok))
            if node is None:
                if v_max is not None and len(tokens_) >= v_max:
                    break
                if branch != 0 and beam is not None and width.get(depth, 0) >= beam:
                    break
                node = len(tokens_)
                tokens_.append(tok)
                parents_.append(parent)
                depths_.append(depth)
                branches_.append(branch)
                child[(parent, tok)] = node
                if branch != 0:
                    width[depth] = width.get(depth, 0) + 1
            path.append(node)
            parent = node
        return path

    def path_to(self, node: int) -> list[int]:
        """Node indices from depth 1 down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_matrix(self) -> np.ndarray:
        """anc[i, j] = node j is node i or one of its ancestors. [N, N] bool."""
        anc = np.zeros((len(self), len(self)), dtype=bool)
        fill_ancestors(anc, self.parents, 0)
        return anc


def fill_ancestors(anc: np.ndarray, parents, start: int) -> None:
    """Write the ancestor-or-self rows of nodes start, start + 1, ... (parents[j]: node start + j's parent,
    an earlier node, -1 for none) into `anc`, whose rows from `start` on must be all False. The draft
    tree and the KV cache's scratch nodes (CachedLM, into a buffer it reuses) both use this one rule.
    Rule: a node sees exactly what its parent sees, plus itself; its parent's row is False past the parent.
    One row at a time: two small slice writes a node cost less host time than vectorising per depth level
    (numpy's per-call cost dominates at these sizes: a 64-node tree ~30 us against ~58 us)."""
    for j, p in enumerate(parents):
        i = start + j
        if p >= 0:
            anc[i, :p + 1] = anc[p, :p + 1]
        anc[i, i] = True


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> [...] long: the index of the first maximum, as torch.argmax gives it.
    Why not torch.argmax: on CPU, max(-1).indices (the same first maximum) reads a tree's [N+1, V] float32
    logits (CachedLM's) 2-3x faster, and bfloat16 ones 4-5x (benchmarks/results/argmax_s45_cpu)."""
    return logits.max(-1).indices


def greedy_accept(tree: DraftTree, target_argmax: torch.Tensor | list[int]) -> list[int]:
    """Longest accepted path at temperature 0.

    target_argmax: [N+1] long (a tensor, or already on the host as a list), the target's argmax at
    [root, node_0, ...].
    Rule: a node is accepted iff its parent is accepted (the root always is) and its token equals
    the target's argmax at the parent. Children of one parent hold distinct tokens, so the accepted
    nodes form a single chain: the winning path. Returns its node indices, shallow to deep.
    """
    n = len(tree)
    if n == 0:
        return []
    pred = target_argmax.tolist() if isinstance(target_argmax, torch.Tensor) else target_argmax
    tokens = np.asarray(tree.tokens)
    parents = np.asarray(tree.parents)
    depths = np.asarray(tree.depths)
    pred_at_parent = np.asarray(pred)[parents + 1]          # [N] argmax after each node's parent
    ok = tokens == pred_at_parent
    accepted = np.zeros(n, dtype=bool)
    idx = np.arange(n)
    for d in range(1, int(depths.max()) + 1):
        level = idx[depths == d]
        par = parents[level]
        parent_ok = np.where(par >= 0, accepted[np.maximum(par, 0)], True)
        accepted[level] = ok[level] & parent_ok
        if not accepted[level].any():
            break
    chain = idx[accepted]
    return sorted(chain.tolist(), key=lambda i: tree.depths[i])


def sample_accept(tree: DraftTree, logits: torch.Tensor, temperature: float,
                  generator: torch.Generator) -> tuple[list[int], int]:
    """Lossless multi-candidate rejection sampling over the tree (temperature > 0).

    logits: [N+1, V] target logits at [root, node_0, ...].
    At the current node, p = softmax(logits / T). Its children (deterministic draft candidates,
    distinct tokens) are tried in turn: child token t is accepted with probability
    p(t) / sum(p); on rejection t is removed from p (the residual). If every child is rejected,
    the bonus token is sampled from the residual. Trying distinct candidates one at a time against
    the residual is sampling from p without replacement, so each emitted token has exactly the
    target's distribution. Returns (accepted node indices, bonus token).
    """
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    path: list[int] = []
    node = -1
    while True:
        p = torch.softmax(logits[node + 1].double().cpu() / temperature, dim=-1)   # [V], sampled on the CPU
        chosen = None
        for child in children.get(node, []):
            tok = tree.tokens[child]
            mass = p.sum()
            if mass <= 0:
                break
            u = torch.rand((), generator=generator, dtype=torch.float64)
            if u < p[tok] / mass:
                chosen = child
                break
            p[tok] = 0.0
        if chosen is None:
            bonus = int(torch.multinomial(p / p.sum(), 1, generator=generator))
            return path, bonus
        path.append(chosen)
        node = chosen
