"""Tree construction per strategy, from one drafted block.

  ar        no tree: the target verifies the root alone and emits its next token
  sd        branch 0 only (an autoregressive draft model's chain)
  parallel  branch 0 only (the block-parallel draft)
  cure      best-first (default): nodes by joint draft log-prob, as ddtree, but lower candidates' log-probs
            weighted by the acceptance the target showed (calibration.py), and the subtrees under the best
            substitutions (non-top-1 tokens) re-drafted conditioned on them, the re-drafted log-probs
            competing for the budget in the same heap
            paper: branch 0 + repair branches at Uncertainty Focal Points, suffixes re-drafted
  ddtree    best-first over the drafter's per-position top-k log-probs, no re-drafting: the reference
            rule (liranringel/ddtree, Algorithm 1), no per-depth width cap, children limited by the budget
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .block import UFP
from .config import DecodeConfig
from .drafters.base import DEFAULT_REDRAFTS, Drafter, Proposal, RedraftPolicy, chain_substitutions
from .lookup import Graft
from .tree import DraftTree


CHAIN_STRATEGIES = ("sd", "parallel")       # branch 0 only


@dataclass(frozen=True)
class TreePlan:
    tree: DraftTree
    ufps: tuple[UFP, ...] = ()
    redraft_ms: float = 0.0       # drafter compute spent re-drafting (cure only): it counts as draft time
    lookup_nodes: tuple[int, ...] = ()  # the node holding each grafted lookup token, shallow to deep, as far
                                        # as the tree holds the path (lookup.LookupStats learns from them)
    unrepaired: DraftTree | None = None  # cure best-first after a re-draft pass: the tree before it (what the
                                         # block would have verified without the pass: redraft_price.py)
    grafted: bool = False                # the lookup graft went into the heap (LookupStats.flips)
    ranks: tuple[int, ...] = ()          # best-first cure: per node its rank in its table (-1: grafted)...
    logq: tuple[float, ...] = ()         # ...and its own draft log-prob (calibration.NodeCalibration learns them)
    weight_alt: DraftTree | None = None  # best-first cure: the tree with the other node weight, where it is exactly
                                         # what the block would have verified otherwise (NodeCalibration.flips)
    lookup_alt: DraftTree | None = None  # the tree with the graft flipped (without it where grafted, with it where
                                         # withheld), where it is exactly what the block would have verified
                                         # otherwise (no re-draft pass ran): what LookupStats.flips learns from


def best_first_tree(cfg: DecodeConfig) -> bool:
    """ddtree and best-first cure spend the budget node by node over per-position top-k."""
    return cfg.strategy == "ddtree" or (cfg.strategy == "cure" and cfg.cure_tree == "best-first")


def proposal_width(cfg: DecodeConfig, budget: int) -> int:
    """Candidates per drafted position. Rule: a best-first tree may give one node as many children as the
    budget holds (the reference takes top-min(budget, vocab)); the paper tree grafts at most b_max."""
    return max(cfg.top_k, budget) if best_first_tree(cfg) else cfg.top_k


def uses_lookup(cfg: DecodeConfig) -> bool:
    """Rule: prompt lookup grafts into best-first cure only (ddtree stays the reference rule, the paper tree
    the paper's)."""
    return cfg.lookup > 0 and cfg.strategy == "cure" and cfg.cure_tree == "best-first"


def calibrates(cfg: DecodeConfig) -> bool:
    """Rule: best-first cure ranks nodes by the acceptance the target showed (`calibrate`; calibration.py);
    ddtree stays the reference rule, the paper tree the paper's."""
    return cfg.calibrate and cfg.strategy == "cure" and cfg.cure_tree == "best-first"


def admits(cfg: DecodeConfig) -> bool:
    """Rule: best-first cure under `--v-max auto` takes nodes past the tuner's budget while they pay
    (`admit`; BudgetTuner.admission). ddtree stays the reference rule, the paper tree the paper's, and a fixed
    budget is the user's."""
    return cfg.admit and cfg.auto_budget and cfg.strategy == "cure" and cfg.cure_tree == "best-first"


def floors(cfg: DecodeConfig, drafter) -> bool:
    """Rule: best-first cure under `--v-max auto` verifies a node off its drafted chain only where it pays for
    its row (`alt_floor`; BudgetTuner.alt_floor), where the chain's own positions were priced too: over a
    sequential drafter under the draft stop (`stops_drafting`). Over a block-parallel drafter the block's
    chain comes whole, however unlikely its deep positions, and a floor on the alternatives alone handed their
    rows to worse chain nodes (the default pair's tuning prompts: 0.991x; benchmarks/results/alt_floor_ab_cpu).
    ddtree stays the reference rule, the paper tree the paper's, and a fixed budget is the user's."""
    return cfg.alt_floor and cfg.auto_budget and stops_drafting(cfg, drafter)


def drafted_steps(cfg: DecodeConfig, budget: int) -> int:
    """Positions drafted, at most, for a tuner's budget of `budget` nodes (0: no draft, the target steps
    alone). Rule: min(budget, K-1), a shorter block; larger budgets leave room for width and repairs.
    (Best-first cure over a sequential drafter may stop sooner, where its chain gets unlikely:
    `draft_stop`.) Drafting ceil(budget / 2) positions for cure there, the rest of the budget repairs,
    was measured on held-out prompts and lost depth on code (benchmarks/results/peers60_qwen15b_halfdepth_cpu)."""
    return min(budget, cfg.depth) if budget > 0 else 0


def stops_drafting(cfg: DecodeConfig, drafter) -> bool:
    """Rule: best-first cure over a sequential drafter drafts position by position only while the chain
    is likely enough to pay for the next step (`draft_stop`); the budget it does not spend on depth goes
    to width and re-drafted repairs. Block-parallel drafters draft their block in one pass (nothing to
    save), and ddtree / sd stay their reference rules."""
    return (cfg.draft_stop and cfg.strategy == "cure" and cfg.cure_tree == "best-first"
            and getattr(drafter, "sequential", False))


def redraft_policy(cfg: DecodeConfig, drafter) -> RedraftPolicy:
    """Best-first cure's re-drafts: the config's `redrafts` / `redraft_weight` where set, else the drafter's."""
    own = getattr(drafter, "redraft_policy", DEFAULT_REDRAFTS)
    return RedraftPolicy(count=own.count if cfg.redrafts is None else cfg.redrafts,
                         weight=own.weight if cfg.redraft_weight is None else cfg.redraft_weight)


def prices_redraft_pass(cfg: DecodeConfig, drafter) -> bool:
    """Rule: best-first cure's re-draft pass (a drafter that does not re-draft inside its chain's steps:
    block-parallel) runs only where it pays (redraft_price.py: at the tuner's budget or a fixed one), unless
    the config asks for it on every block (`redraft_pass` always)."""
    return (cfg.strategy == "cure" and cfg.cure_tree == "best-first" and cfg.redraft_pass == "priced"
            and not getattr(drafter, "redrafts_while_drafting", False))


def redrafts_while_drafting(cfg: DecodeConfig, drafter, n: int) -> int:
    """Substitutions the drafter re-drafts inside its proposal (Drafter.propose_with_redrafts), 0 for none.
    Rule: only best-first cure with a causal chain drafter (which can batch them into the chain's own
    steps), and only when the budget leaves room past the n drafted nodes: a budget <= n is a shorter
    block, whose tree would rarely reach below a substitute."""
    if cfg.strategy != "cure" or cfg.cure_tree != "best-first" or not getattr(drafter, "redrafts_while_drafting", False):
        return 0
    return redraft_policy(cfg, drafter).count if cfg.v_max > n else 0


def propose(cfg: DecodeConfig, drafter: Drafter, root: int, n: int, stop_logp: float | None = None) -> Proposal:
    """Draft one block of n positions as `cfg`'s tree will need it (width; re-drafts in the same steps).
    `stop_logp` (stops_drafting): a chain drafter stops once its chain's joint log-prob falls below it, and
    then drafts its re-drafts too whatever the budget, since a stopped chain leaves the budget room."""
    width = proposal_width(cfg, cfg.v_max)
    if stop_logp is not None:                     # given only where stops_drafting (the engine's rule)
        return drafter.propose_with_redrafts(root, n, width, redraft_policy(cfg, drafter).count, stop_logp)
    count = redrafts_while_drafting(cfg, drafter, n)
    return drafter.propose_with_redrafts(root, n, width, count) if count else drafter.propose(root, n, width)


def build_tree(cfg: DecodeConfig, proposal: Proposal | None, drafter: Drafter | None,
               graft: Graft | None = None, redraft: bool = True, graft_on: bool = True,
               flip: bool = False, admit: Sequence[float] = (), weight: float = 1.0,
               weight_alt: float | None = None, floor: float = -math.inf) -> TreePlan:
    """The block's tree. `redraft=False`: best-first cure skips its re-draft pass (the tuner's
    `redraft_pays` or a fixed budget's RedraftPrice), so the tree is ddtree's (with the lookup graft).
    `graft_on=False`: the lookup continuation `graft` stays out of the heap (LookupStats.flips);
    `flip`: also build the tree with it flipped (TreePlan.lookup_alt), to measure what it wins.
    `admit`: best-first cure's nodes past the budget (best_first; BudgetTuner.admission), in every tree it
    builds, so what the re-draft pass and the graft win is measured between trees of the same rule.
    `weight`: best-first cure's weight of a lower candidate's log-prob (calibration.NodeCalibration), in every
    tree it builds; `weight_alt`: also build the tree with that weight instead (TreePlan.weight_alt).
    `floor`: best-first cure's score a node off the drafted chain needs (best_first; BudgetTuner.alt_floor),
    in every tree it builds."""
    if cfg.strategy == "ar" or proposal is None:
        return TreePlan(DraftTree())
    if cfg.strategy in CHAIN_STRATEGIES:
        tree = DraftTree()
        tree.add_path(proposal.tokens, branch=0)
        return TreePlan(tree)
    if cfg.strategy == "cure" and cfg.cure_tree == "paper":
        return build_cure_tree(cfg, proposal, drafter)
    if cfg.strategy == "cure":
        return build_cure_best_first(cfg, proposal, drafter, graft, redraft, graft_on, flip, admit, weight,
                                     weight_alt, floor)
    return TreePlan(build_ddtree(cfg, proposal))


# ---------------------------------------------------------------------------------------------
# Best-first over top-k tables (ddtree, cure best-first)
# ---------------------------------------------------------------------------------------------

class Rows(Sequence):
    """The rows of a [n, W] CPU tensor as host lists, each read when first asked for. Rule: a re-drafted
    table is read this way, not whole: best_first reaches about one row of each a block (tiny AR-chain
    pair, V 16 and 64), and reading 3 re-drafts whole ([~13, W] ids and log-probs each) cost 0.05-0.09 ms
    a block of host time (benchmarks/overhead.py)."""
    __slots__ = ("_t", "_rows")

    def __init__(self, t: torch.Tensor):
        self._t = t.numpy()                                 # a view: no copy
        self._rows: list[list | None] = [None] * len(self._t)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, r: int) -> list:
        row = self._rows[r]
        if row is None:
            row = self._rows[r] = self._t[r].tolist()
        return row


@dataclass(frozen=True)
class Table:
    """Per-position candidates for depths first .. first + len(ids) - 1: ids[r][j] is the j-th best token
    at depth first + r, logp[r][j] its draft log-prob (best first)."""
    ids: Sequence[list[int]]
    logp: Sequence[list[float]]
    first: int = 1

    @staticmethod
    def of(p: Proposal, first: int = 1) -> "Table":
        return Table(p.top_ids.tolist(), p.top_logprobs.tolist(), first)

    @staticmethod
    def lazy(p: Proposal, first: int = 1) -> "Table":
        """Table.of with each row read to the host when first needed (`Rows`)."""
        return Table(Rows(p.top_ids), Rows(p.top_logprobs), first)

    def last(self) -> int:
        return self.first + len(self.ids) - 1


@dataclass
class BestFirst:
    """A best-first tree and, per node, what built it: its score (joint log-prob, lower candidates weighted),
    its rank in the table it came from, its path of tokens from depth 1 (keys the re-drafted tables) and its
    own log-prob (what calibration.NodeCalibration learns from)."""
    tree: DraftTree = field(default_factory=DraftTree)
    scores: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    paths: list[tuple[int, ...]] = field(default_factory=list)
    logq: list[float] = field(default_factory=list)     # the node's own log-prob in its table (or the graft's)


PATH_RANK = 1 << 30        # heap ranks of grafted path tokens: after any table candidate at an equal score


def best_first(base: Table, budget: int, under: dict[tuple[int, ...], Table] | None = None,
               graft: Graft | None = None, admit: Sequence[float] = (), weight: float = 1.0,
               floor: float = -math.inf) -> BestFirst:
    """The `budget` nodes of highest joint draft log-prob (DDTree's Algorithm 1).

    A node at depth d holding the j-th candidate scores its parent's score + log q_d(candidate); every
    candidate scores at most its parent, so the best `budget` form a tree. Lazily: popping a node pushes
    its next sibling and its best child. Ties go to the lexicographically smaller rank path, as in the
    reference. Children come from the table of the node's nearest ancestor-or-self with an entry in
    `under` (keyed by token path: a re-drafted subtree), else from `base`. Impossible candidates
    (log-prob -inf: masked ids) are never pushed.
    `graft` (cure: a prompt-lookup continuation) is one more source in the same heap: its i-th token
    scores the (i-1)-th's score + graft.logp[i]; where a token is already in the tree the path goes on
    under that node at no cost; a node it adds gets no table children (rank -1: never a substitution).
    `admit` (BudgetTuner.admission): past `budget`, the (n+1)-th node still joins while its score is at least
    admit[n] (n < len(admit)); scores only fall as the heap pops, so the tree is still the best of its size.
    `weight` (best-first cure: calibration.NodeCalibration): a lower candidate (rank >= 1) adds weight x its
    log-prob, a top-1 candidate its log-prob; 1 is the reference rule.
    `floor` (best-first cure: BudgetTuner.alt_floor): a node off the base table's top-1 chain (a substitution,
    or anything below one) joins only with a score of at least `floor`; the chain's own nodes and the graft's
    are bounded by the budget alone. Its descendants score no more than it, so none is lost that could pass."""
    under = under or {}
    out = BestFirst()
    tree = out.tree
    heap: list = []
    grafted: set[int] = set()

    def push(score: float, ranks: tuple, parent: int, depth: int, rank: int, table: Table | None) -> None:
        if score > -math.inf:
            heapq.heappush(heap, (-score, ranks, parent, depth, rank, table))

    def add(token: int, parent: int, branch: int, score: float, rank: int, logq: float) -> int:
        node = tree.add_node(token, parent, branch)          # callers checked the trie holds no such node
        out.scores.append(score)
        out.ranks.append(rank)
        out.logq.append(logq)
        out.paths.append((out.paths[parent] if parent >= 0 else ()) + (token,))
        return node

    if base.ids:
        push(base.logp[0][0], (0,), -1, base.first, 0, base)
    if graft is not None and graft.tokens:
        push(graft.logp[0], (PATH_RANK, 0), -1, 1, 0, None)
    while heap and (len(tree) < budget or (len(tree) < len(admit) and -heap[0][0] >= admit[len(tree)])):
        neg, ranks, parent, depth, rank, table = heapq.heappop(heap)
        score = -neg
        if table is None:                                   # the grafted path's rank-th token
            token = graft.tokens[rank]
            node = tree._child.get((parent, token))
            if node is None:
                branch = tree.branches[parent] if parent in grafted else len(tree) + 1
                node = add(token, parent, branch, score, -1, graft.logp[rank])
                grafted.add(node)
            if rank + 1 < len(graft.tokens):
                push(score + graft.logp[rank + 1], (PATH_RANK, rank + 1), node, depth + 1, rank + 1, None)
            continue
        row = depth - table.first
        logq = table.logp[row][rank]
        if rank + 1 < len(table.ids[row]):                 # the next sibling candidate (rank >= 1: weighted)
            push(score - (weight if rank else 1.0) * logq + weight * table.logp[row][rank + 1],
                 ranks[:-1] + (rank + 1,), parent, depth, rank + 1, table)
        token = table.ids[row][rank]
        node = tree._child.get((parent, token))
        if node is not None and node not in grafted:        # a table repeating an id: one node, once
            continue
        # Rule: branch 0 is the base table's top-1 chain; a substitution starts a branch that its top-1
        # descendants continue (what the UI colours as repairs).
        # (A branch is numbered by its first node: index + 1.)
        on_chain = rank == 0 and table is base and (parent < 0 or tree.branches[parent] == 0)
        if node is None and not on_chain and score < floor:  # a new row off the chain that would not pay
            continue
        at = len(tree) if node is None else node
        branch = 0 if on_chain else (tree.branches[parent] if rank == 0 and parent >= 0 else at + 1)
        if node is None:
            node = add(token, parent, branch, score, rank, logq)
        else:                                               # the graft took this token first: the table
            grafted.discard(node)                           # adopts its node and goes on under it
            tree.branches[node], out.ranks[node], out.logq[node] = branch, rank, logq
        child_table = under.get(out.paths[node], table)
        if depth < child_table.last():                    # its best child
            push(score + child_table.logp[depth + 1 - child_table.first][0], ranks + (0,), node, depth + 1, 0,
                 child_table)
    return out


def path_nodes(tree: DraftTree, tokens) -> tuple[int, ...]:
    """The nodes holding `tokens` from depth 1, as far as the tree holds their path."""
    nodes, node = [], -1
    for token in tokens:
        node = tree._child.get((node, token))
        if node is None:
            break
        nodes.append(node)
    return tuple(nodes)


def graft_nodes(tree: DraftTree, graft: Graft | None) -> tuple[int, ...]:
    """The nodes holding the graft's tokens, from depth 1, as far as the tree holds its path."""
    return path_nodes(tree, graft.tokens if graft is not None else ())


def mix(base: Table, redrafted: Table, weight: float) -> Table:
    """One re-drafted table blended with the proposal's rows at the same depths (see `blend`)."""
    if weight >= 1.0:
        return redrafted
    return blend(torch.tensor(base.ids), torch.tensor(base.logp, dtype=torch.float64), base.first,
                 [(redrafted.first, torch.tensor(redrafted.ids), torch.tensor(redrafted.logp))], weight)[0]


def blend(base_ids: torch.Tensor, base_logp: torch.Tensor, base_first: int,
          redrafts: list[tuple[int, torch.Tensor, torch.Tensor]], weight: float) -> list[Table]:
    """The re-drafted rows blended with the proposal's rows at the same depths: per candidate
    p = weight * p_redraft + (1 - weight) * p_proposal (a candidate outside one table's top-k counts 0
    there), best first, each table as wide as its re-draft. All re-drafts' rows in one vectorised pass
    (this runs on every block that re-drafts; per-candidate Python cost ~0.2 ms at width 64).
    base_ids/base_logp: [n, Wb] from depth base_first; redrafts: (first depth, ids [r, W], logp [r, W])."""
    sizes = [ids.shape[0] for _, ids, _ in redrafts]
    rows = torch.cat([torch.arange(first - base_first, first - base_first + ids.shape[0])
                      for first, ids, _ in redrafts]).to(base_ids.device)         # [R] base row per blended row
    r_ids = torch.cat([ids for _, ids, _ in redrafts]).to(base_ids.device)       # [R, W]
    r_lp = torch.cat([lp for _, _, lp in redrafts]).to(base_ids.device, torch.float64)
    width = r_ids.shape[1]
    ids = torch.cat([r_ids, base_ids[rows]], dim=1)                              # [R, W + Wb]
    mass = torch.cat([weight * r_lp.exp(), (1.0 - weight) * base_logp[rows].to(torch.float64).exp()], dim=1)
    ids, order = ids.sort(dim=1, stable=True)                                    # equal ids side by side
    mass = mass.gather(1, order)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    run = starts.long().cumsum(1) - 1                                            # [R, W + Wb] run of each id
    summed = torch.zeros_like(mass).scatter_add_(1, run, mass)                   # mass per distinct id
    run_ids = torch.zeros_like(ids).scatter_(1, run, ids)
    top, at = summed.topk(width, dim=1)                                          # best first, [R, W]
    out_ids, out_lp = run_ids.gather(1, at).tolist(), top.log().tolist()         # mass 0 -> -inf: never pushed
    tables, i = [], 0
    for (first, _, _), n in zip(redrafts, sizes):
        tables.append(Table(out_ids[i:i + n], out_lp[i:i + n], first))
        i += n
    return tables


def build_ddtree(cfg: DecodeConfig, proposal: Proposal) -> DraftTree:
    """The reference DDTree: best-first over the drafter's per-position top-k, budget v_max."""
    return best_first(Table.of(proposal), cfg.v_max).tree


def substitutions(bf: BestFirst, depth_limit: int, count: int) -> list[int]:
    """Nodes whose subtree is worth re-drafting: substitutions (not the top-1 candidate where they
    stand) that the tree extends below, best joint log-prob first. Rule: a subtree the budget leaves
    empty would gain nothing from better candidates, so it is never re-drafted."""
    has_child = {p for p in bf.tree.parents if p >= 0}
    subs = [i for i in range(len(bf.tree)) if bf.ranks[i] > 0 and i in has_child and bf.tree.depths[i] < depth_limit]
    return sorted(subs, key=lambda i: -bf.scores[i])[:count]


def build_cure_best_first(cfg: DecodeConfig, proposal: Proposal, drafter: Drafter,
                          graft: Graft | None = None, redraft: bool = True, graft_on: bool = True,
                          flip: bool = False, admit: Sequence[float] = (), weight: float = 1.0,
                          weight_alt: float | None = None, floor: float = -math.inf) -> TreePlan:
    """Repair-aware best-first: the ddtree of the block, then the subtrees under its best substitutions
    (`redraft_policy`: how many, and the blend weight) re-drafted in ONE batched drafter pass conditioned
    on the substituted token, then best-first again with the re-drafted log-probs competing for the same
    budget. With no substitution worth it, this is ddtree's tree at no extra cost. Over a causal chain
    drafter the substitutions are its chain_substitutions, already re-drafted inside its proposal
    (redrafts_while_drafting), so no pass follows.
    The lookup `graft` goes in where `graft_on`; with `flip`, the tree with it flipped is built too where
    that is exactly the block's other tree: where neither tree runs a re-draft pass, or with a chain's own
    re-drafts (which do not depend on the tree). Where a pass ran, the flipped tree would have chosen its
    own substitutions: no measurement. The same holds for the tree with the node weight `weight_alt`."""
    used, other = (graft, None) if graft_on else (None, graft)
    flip = flip and graft is not None and bool(graft.tokens)
    graft = used
    n = len(proposal.tokens)
    policy = redraft_policy(cfg, drafter)
    base = Table.of(proposal)
    # a proposal carrying re-drafts was drafted with them (a stopped chain may hold them under any budget)
    fused = policy.count if proposal.redrafts else redrafts_while_drafting(cfg, drafter, n)

    def flipped(graft_: Graft | None, weight_: float, under: dict | None = None) -> DraftTree | None:
        """The block's tree with one choice flipped (the graft, or the node weight), where it is exactly the
        tree the block would otherwise have verified: with a chain's own re-drafts `under` (they do not depend
        on the tree), or with no pass where that tree would not have re-drafted either (None: no measurement)."""
        bf = best_first(base, cfg.v_max, under, graft_, admit, weight_, floor)
        return None if under is None and redraft and substitutions(bf, n, policy.count) else bf.tree
    if fused and proposal.redrafts:
        # A causal chain drafter chose its substitutions as it drafted (chain_substitutions, best first)
        # and re-drafted them in the chain's steps.
        prefixes = [list(p) for p in proposal.redrafts]
    elif fused:
        # a replay (no re-drafts in the proposal) asks for the same prefixes
        prefixes = [list(p) for p in chain_substitutions(proposal.top_ids, proposal.top_logprobs, fused, n)]
    else:
        first = best_first(base, cfg.v_max, graft=graft, admit=admit, weight=weight, floor=floor)
        prefixes = [list(first.paths[i]) for i in substitutions(first, n, policy.count)] if redraft else []
        if not prefixes:
            return TreePlan(first.tree, lookup_nodes=graft_nodes(first.tree, graft), grafted=graft is not None,
                            lookup_alt=flipped(other, weight) if flip else None,
                            ranks=tuple(first.ranks), logq=tuple(first.logq),
                            weight_alt=flipped(graft, weight_alt) if weight_alt is not None else None)
    t0 = time.perf_counter()
    if fused and proposal.redrafts:
        redrafted = [proposal.redrafts[tuple(p)] for p in prefixes]
    else:
        redrafted = drafter.redraft_topk(prefixes, [n - len(p) for p in prefixes], len(base.ids[0])) if prefixes else []
    redraft_ms = (time.perf_counter() - t0) * 1e3
    live = [(tuple(p), r) for p, r in zip(prefixes, redrafted) if len(r.tokens)]
    if policy.weight >= 1.0 or not live:
        under = {p: Table.lazy(r, len(p) + 1) for p, r in live}
    else:
        tables = blend(proposal.top_ids, proposal.top_logprobs, 1,
                       [(len(p) + 1, r.top_ids, r.top_logprobs) for p, r in live], policy.weight)
        under = {p: t for (p, _), t in zip(live, tables)}
    final = best_first(base, cfg.v_max, under, graft, admit, weight, floor)
    # the re-drafted substitutions that made it into the tree, as UFPs
    by_pos: dict[int, list[int]] = {}
    for p in prefixes:
        if len(path_nodes(final.tree, p)) == len(p):
            by_pos.setdefault(len(p) - 1, []).append(p[-1])
    margins = proposal.margins if by_pos else []
    ufps = tuple(UFP(position=pos, margin=margins[pos], budget=len(alts), alternatives=tuple(alts))
                 for pos, alts in sorted(by_pos.items()))
    return TreePlan(final.tree, ufps, redraft_ms=redraft_ms, lookup_nodes=graft_nodes(final.tree, graft),
                    unrepaired=None if fused else first.tree, grafted=graft is not None,
                    lookup_alt=flipped(other, weight, under) if flip and fused else None,
                    ranks=tuple(final.ranks), logq=tuple(final.logq),
                    weight_alt=flipped(graft, weight_alt, under) if weight_alt is not None and fused else None)


# ---------------------------------------------------------------------------------------------
# The paper's tree: branch 0 + repair branches at UFPs
# ---------------------------------------------------------------------------------------------

def select_ufps(cfg: DecodeConfig, margins: Sequence[float]) -> list[tuple[int, float, int]]:
    """(position, margin, budget) for up to max_ufps positions with m_i < tau_margin, most fragile
    first. Budget: u_i = clamp(1 - m_i/s, 0, 1); b_i = b_min + round(u_i (b_max - b_min))."""
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
    # Repair branches. Branch (k, c) = y_0..y_{k-1}, c, then a suffix re-drafted under c.
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
    # Trie merge under the budget. Branch 0 goes in first and whole (the budget never cuts it); repair
    # branches follow in UFP order, most probable substitute first.
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
