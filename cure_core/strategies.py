"""Tree construction per strategy (DESIGN.md steps 2-5), from one drafted block.

  ar        no tree: the target verifies the root alone and emits its next token
  sd        branch 0 only (an autoregressive draft model's chain)
  parallel  branch 0 only (the block-parallel draft)
  cure      branch 0 + repair branches at Uncertainty Focal Points, suffixes re-drafted
  ddtree    best-first tree over the drafter's per-position top-k log-probs, no re-drafting
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

from .block import UFP
from .config import DecodeConfig
from .drafters.base import Drafter, Proposal
from .tree import DraftTree


CHAIN_STRATEGIES = ("sd", "parallel")       # branch 0 only


@dataclass(frozen=True)
class TreePlan:
    tree: DraftTree
    ufps: tuple[UFP, ...] = ()
    redraft_ms: float = 0.0       # drafter compute spent re-drafting repair suffixes (cure only)


def build_tree(cfg: DecodeConfig, proposal: Proposal | None, drafter: Drafter | None) -> TreePlan:
    if cfg.strategy == "ar" or proposal is None:
        return TreePlan(DraftTree())
    if cfg.strategy in CHAIN_STRATEGIES:
        tree = DraftTree()
        tree.add_path(proposal.tokens, branch=0)
        return TreePlan(tree)
    if cfg.strategy == "cure":
        return build_cure_tree(cfg, proposal, drafter)
    return TreePlan(build_ddtree(cfg, proposal))


def select_ufps(cfg: DecodeConfig, margins: list[float]) -> list[tuple[int, float, int]]:
    """Steps 2-3: (position, margin, budget) for up to max_ufps positions with m_i < tau_margin,
    most fragile first. Budget: u_i = clamp(1 - m_i/s, 0, 1); b_i = b_min + round(u_i (b_max - b_min))."""
    fragile = sorted((m, i) for i, m in enumerate(margins) if m < cfg.tau_margin)[: cfg.max_ufps]
    picked = []
    for m, i in fragile:
        u = min(max(1.0 - m / cfg.scale, 0.0), 1.0)
        b = cfg.b_min + int(math.floor(u * (cfg.b_max - cfg.b_min) + 0.5))   # round half up
        picked.append((i, m, b))
    return picked


def build_cure_tree(cfg: DecodeConfig, proposal: Proposal, drafter: Drafter) -> TreePlan:
    block = proposal.tokens                                  # y_0..y_{n-1}
    n = len(block)
    picked = select_ufps(cfg, proposal.margins)
    # Step 4: repair branches. Branch (k, c) = y_0..y_{k-1}, c, then a suffix re-drafted under c.
    prefixes, lengths, owners = [], [], []
    ufps = []
    for pos, margin, budget in picked:
        # the next-best draft tokens at the UFP (never an impossible one)
        alts = [t for t, lp in zip(proposal.top_ids[pos, 1:].tolist(), proposal.top_logprobs[pos, 1:].tolist())
                if lp > float("-inf")][:budget]
        for c in alts:
            prefixes.append(block[:pos] + [c])
            lengths.append(n - pos - 1)                       # re-draft down to the block's depth
            owners.append(pos)
        ufps.append((pos, margin, budget, tuple(alts)))
    if cfg.keep_branch0:
        # Rule: only repairs that will get a node under V_max are re-drafted. Small budgets (the tuner's
        # shorter blocks, K = V + 1) leave no room past branch 0, and re-drafting there was pure cost.
        fit = repairs_that_fit(n, owners, lengths, cfg.v_max, cfg.beam)
        prefixes, lengths, owners = ([x for x, f in zip(xs, fit) if f] for xs in (prefixes, lengths, owners))
    t0 = time.perf_counter()
    suffixes = drafter.redraft(prefixes, lengths) if prefixes else []
    redraft_ms = (time.perf_counter() - t0) * 1e3
    # Step 5: trie merge under the budget. Branch 0 goes in first and whole (the budget never cuts
    # it); repair branches follow in UFP order, most probable substitute first.
    tree = DraftTree()
    has_repairs = bool(prefixes)
    if cfg.keep_branch0 or not has_repairs:
        tree.add_path(block, branch=0)
    else:
        # Ablation (no branch 0): keep only the drafted prefix the repairs share, up to the first UFP.
        tree.add_path(block[: min(owners)], branch=0)
    grafted: dict[int, list[int]] = {}
    for r, (prefix, suffix, pos) in enumerate(zip(prefixes, suffixes, owners), start=1):
        path = tree.add_path(prefix + suffix, branch=r, v_max=cfg.v_max, beam=cfg.beam)
        if len(path) > pos:                                   # the substituted token made it in
            grafted.setdefault(pos, []).append(prefix[-1])
    return TreePlan(tree, tuple(UFP(position=p, margin=m, budget=b, alternatives=tuple(grafted.get(p, ())))
                                for p, m, b, _ in ufps), redraft_ms=redraft_ms)


def repairs_that_fit(n: int, owners: list[int], lengths: list[int], v_max: int, beam: int | None) -> list[bool]:
    """Whether each repair branch, merged in order after a whole branch 0 of n nodes, adds at least one
    node: the trie merge's budget (v_max nodes) and width (beam repair nodes per depth) replayed
    without tokens. Every repair node is new (its substituted token differs from branch 0's and
    from the other repairs'), so the replay is exact."""
    total, width, fit = n, {}, []
    for pos, length in zip(owners, lengths):
        added = 0
        for depth in range(pos + 1, pos + 2 + length):       # the substitute at depth pos + 1, then its suffix
            if total >= v_max or (beam is not None and width.get(depth, 0) >= beam):
                break
            width[depth] = width.get(depth, 0) + 1
            total += 1
            added += 1
        fit.append(added > 0)
    return fit


def build_ddtree(cfg: DecodeConfig, proposal: Proposal) -> DraftTree:
    """Best-first expansion over per-position top-k: a node at depth d holding the j-th candidate of
    position d-1 scores parent score + log q_{d-1}(candidate). The V_max best-scoring nodes are
    kept (each node's parent scores higher, so the kept set is a tree); at most `top_k` children
    per node and `beam`+1 nodes per depth."""
    ids = proposal.top_ids.tolist()                          # [n, k]
    logp = proposal.top_logprobs.tolist()
    n, k = len(ids), len(ids[0])
    width = cfg.beam + 1
    tree = DraftTree()
    per_depth = [0] * (n + 1)
    # heap entries: (-score, tie, parent node, depth, rank); the first child of every expanded node
    # and the next sibling of every popped node are pushed (lazy top-k expansion).
    heap = [(-logp[0][0], 0, -1, 1, 0)]
    tie = 1
    while heap and len(tree) < cfg.v_max:
        neg, _, parent, depth, rank = heapq.heappop(heap)
        score = -neg
        if score == float("-inf"):                           # an impossible candidate, and all after it
            break
        if rank + 1 < k:                                     # the next sibling candidate
            parent_score = score - logp[depth - 1][rank]
            heapq.heappush(heap, (-(parent_score + logp[depth - 1][rank + 1]), tie, parent, depth, rank + 1))
            tie += 1
        if per_depth[depth] >= width:
            continue
        branch = 0 if (rank == 0 and (parent < 0 or tree.branches[parent] == 0)) else len(tree) + 1
        if rank == 0 and parent >= 0 and tree.branches[parent] != 0:
            branch = tree.branches[parent]
        node = tree.add_path([ids[depth - 1][rank]], branch=branch, parent=parent)[0]
        per_depth[depth] += 1
        if depth < n:                                        # its best child
            heapq.heappush(heap, (-(score + logp[depth][0]), tie, node, depth + 1, 0))
            tie += 1
    return tree
