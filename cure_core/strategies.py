"""The tree builders, one per tree rule, from one drafted block. Each takes the plan's inputs only (the
proposal, the drafter where it re-drafts, the block's node budget and the rule's own parameters);
which rule a strategy runs, and what it learns, is its policy's (policies.py).

  chain       branch 0 only: sd (an autoregressive draft model's chain), parallel (the block-parallel draft)
  ddtree      best-first over the drafter's per-position top-k log-probs, no re-drafting: the reference
              rule (liranringel/ddtree, Algorithm 1), no per-depth width cap, children limited by the budget
  best-first  cure's default: best-first as ddtree, but nodes ranked by the acceptance model's
  cure        P(accepted | parent accepted) (acceptance.py) instead of the draft probability, and the subtrees
              under the best substitutions (non-top-1 tokens) re-drafted conditioned on them, the re-drafted
              candidates competing for the same budget in the same heap
  paper cure  branch 0 + repair branches at Uncertainty Focal Points, suffixes re-drafted (the paper's)
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .block import UFP
from .config import DecodeConfig
from .drafters.base import Drafter, Proposal, RedraftPolicy, chain_substitutions
from .lookup import Graft
from .tree import DraftTree

CHAIN_STRATEGIES = ("sd", "parallel")       # branch 0 only
PAPER_BEAM = 5                              # the paper tree: at most this many repair nodes at any depth

# A node's score increment: (rank in its table, depth, its draft log-prob) -> log P(accepted | parent).
# None: the draft log-prob itself (the reference rule).
Score = Callable[[int, int, float], float]


@dataclass
class TreePlan:
    """One block's tree and what built it. The builders fill the tree's part; the policy the rest."""
    tree: DraftTree
    ufps: tuple[UFP, ...] = ()
    redraft_ms: float = 0.0       # drafter compute spent re-drafting (cure only): it counts as draft time
    lookup_nodes: tuple[int, ...] = ()  # the node holding each grafted lookup token, shallow to deep, as far
                                        # as the tree holds the path (lookup.LookupStats learns from them)
    unrepaired: DraftTree | None = None  # best-first cure after a re-draft pass: the tree before it (what the
                                         # block would have verified without the pass: redraft_price.py)
    ranks: tuple[int, ...] = ()          # best-first: per node its rank in its table (-1: grafted)...
    logq: tuple[float, ...] = ()         # ...and its own draft log-prob (acceptance.AcceptanceModel learns them)
    # --- the policy's part ---
    proposal: Proposal | None = None     # the drafted block (None: no draft this block)
    budget: int = 0                      # the block's node budget (the tuner's choice, or v_max)
    clipped: bool = False                # the generation's end, not the budget, bounded this block
    draft_ms: float = 0.0                # drafting, re-drafts included
    tree_ms: float = 0.0                 # building the tree, re-drafts excluded
    meta: dict = field(default_factory=dict)   # what the block records of the policy's choices (Block.meta)


def proposal_width(best_first_rule: bool, top_k: int, budget: int) -> int:
    """Candidates per drafted position. Rule: a best-first tree may give one node as many children as the
    budget holds (the reference takes top-min(budget, vocab)); the paper tree grafts at most b_max."""
    return max(top_k, budget) if best_first_rule else top_k


def drafted_steps(cfg: DecodeConfig, budget: int) -> int:
    """Positions drafted, at most, for a tuner's budget of `budget` nodes (0: no draft, the target steps
    alone). Rule: min(budget, K-1), a shorter block; larger budgets leave room for width and repairs.
    (Best-first cure over a sequential drafter may stop sooner, where its chain gets unlikely:
    `draft_stop`.)"""
    return min(budget, cfg.depth) if budget > 0 else 0


def redraft_policy(cfg: DecodeConfig, drafter: Drafter) -> RedraftPolicy:
    """Best-first cure's re-drafts: the config's `redrafts` / `redraft_weight` where set, else the drafter's."""
    own = drafter.redraft_policy
    return RedraftPolicy(count=own.count if cfg.best_first.redrafts is None else cfg.best_first.redrafts,
                         weight=own.weight if cfg.best_first.redraft_weight is None else cfg.best_first.redraft_weight)


def chain_tree(proposal: Proposal | None) -> DraftTree:
    """sd / parallel: the drafted block as one path, branch 0."""
    tree = DraftTree()
    if proposal is not None:
        tree.add_path(proposal.tokens, branch=0)
    return tree


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
    """A best-first tree and, per node, what built it: its score, its rank in the table it came from, its path
    of tokens from depth 1 (keys the re-drafted tables), its own draft log-prob (what the acceptance model
    learns from) and its joint draft log-prob (what the alternatives' floor compares)."""
    tree: DraftTree = field(default_factory=DraftTree)
    scores: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    paths: list[tuple[int, ...]] = field(default_factory=list)
    logq: list[float] = field(default_factory=list)     # the node's own log-prob in its table (or the graft's)
    raw: list[float] = field(default_factory=list)      # the node's joint draft log-prob (0 along a graft)


PATH_RANK = 1 << 30        # heap ranks of grafted path tokens: after any table candidate at an equal score


def best_first(base: Table, budget: int, under: dict[tuple[int, ...], Table] | None = None,
               graft: Graft | None = None, score: Score | None = None, floor: float = -math.inf) -> BestFirst:
    """The `budget` nodes of highest score (DDTree's Algorithm 1 where `score` is None: the joint draft log-prob).

    A node at depth d holding the j-th candidate scores its parent's score + score(j, d, log q_d(candidate))
    (<= 0), so every node scores at most its parent and the best `budget` form a tree. Lazily: popping a node
    pushes its next sibling and its best child. Rule: a sibling's increment is capped at the one before it,
    so siblings come off the heap in table order under any `score` and the lazy heap stays exact (the tree
    is the best of its size under the capped scores; with the draft log-prob the cap never binds). Ties go
    to the lexicographically smaller rank path, as in the reference. Children come from the table of the
    node's nearest ancestor-or-self with an entry in `under` (keyed by token path: a re-drafted subtree),
    else from `base`. Impossible candidates (log-prob -inf: masked ids) are never pushed.
    `graft` (cure: a prompt-lookup continuation) is one more source in the same heap: its i-th token
    scores the (i-1)-th's score + graft.logp[i] (already an acceptance log-prob); where a token is already
    in the tree the path goes on under that node at no cost; a node it adds gets no table children (rank -1:
    never a substitution).
    `floor` (best-first cure over a chain drafter: BudgetTuner.alt_floor): a node off the base table's top-1
    chain (a substitution, or anything below one) joins only with a joint DRAFT log-prob of at least
    `floor`; the chain's own nodes and the graft's are bounded by the budget alone. Its descendants' joint
    draft log-probs are no larger, so none is lost that could pass."""
    inc = score if score is not None else (lambda rank, depth, logq: logq)
    under = under or {}
    out = BestFirst()
    tree = out.tree
    heap: list = []
    grafted: set[int] = set()

    # heap entry: (-score, rank path, parent, depth, rank, table, joint draft log-prob, this increment)
    def push(s: float, ranks: tuple, parent: int, depth: int, rank: int, table: Table | None,
             raw: float, step: float) -> None:
        if s > -math.inf:
            heapq.heappush(heap, (-s, ranks, parent, depth, rank, table, raw, step))

    def add(token: int, parent: int, branch: int, s: float, rank: int, logq: float, raw: float) -> int:
        node = tree.add_node(token, parent, branch)          # callers checked the trie holds no such node
        out.scores.append(s)
        out.ranks.append(rank)
        out.logq.append(logq)
        out.raw.append(raw)
        out.paths.append((out.paths[parent] if parent >= 0 else ()) + (token,))
        return node

    if base.ids:
        lq = base.logp[0][0]
        step = inc(0, base.first, lq) if lq > -math.inf else -math.inf
        push(step, (0,), -1, base.first, 0, base, lq, step)
    if graft is not None and graft.tokens:
        push(graft.logp[0], (PATH_RANK, 0), -1, 1, 0, None, 0.0, graft.logp[0])
    while heap and len(tree) < budget:
        neg, ranks, parent, depth, rank, table, raw, step = heapq.heappop(heap)
        s = -neg
        if table is None:                                   # the grafted path's rank-th token
            token = graft.tokens[rank]
            node = tree._child.get((parent, token))
            if node is None:
                branch = tree.branches[parent] if parent in grafted else len(tree) + 1
                node = add(token, parent, branch, s, -1, graft.logp[rank], raw)
                grafted.add(node)
            if rank + 1 < len(graft.tokens):
                nxt = graft.logp[rank + 1]
                push(s + nxt, (PATH_RANK, rank + 1), node, depth + 1, rank + 1, None, raw, nxt)
            continue
        row = depth - table.first
        logq = table.logp[row][rank]
        parent_raw = raw - logq
        if rank + 1 < len(table.ids[row]):                 # the next sibling candidate, capped at this one's
            lq = table.logp[row][rank + 1]
            if lq > -math.inf:
                nxt = min(inc(rank + 1, depth, lq), step)
                push(s - step + nxt, ranks[:-1] + (rank + 1,), parent, depth, rank + 1, table, parent_raw + lq, nxt)
        token = table.ids[row][rank]
        node = tree._child.get((parent, token))
        if node is not None and node not in grafted:        # a table repeating an id: one node, once
            continue
        # Rule: branch 0 is the base table's top-1 chain; a substitution starts a branch that its top-1
        # descendants continue (what the UI colours as repairs).
        # (A branch is numbered by its first node: index + 1.)
        on_chain = rank == 0 and table is base and (parent < 0 or tree.branches[parent] == 0)
        if node is None and not on_chain and raw < floor:    # a new row off the chain that would not pay
            continue
        at = len(tree) if node is None else node
        branch = 0 if on_chain else (tree.branches[parent] if rank == 0 and parent >= 0 else at + 1)
        if node is None:
            node = add(token, parent, branch, s, rank, logq, raw)
        else:                                               # the graft took this token first: the table
            grafted.discard(node)                           # adopts its node and goes on under it
            tree.branches[node], out.ranks[node], out.logq[node] = branch, rank, logq
        child_table = under.get(out.paths[node], table)
        if depth < child_table.last():                    # its best child
            lq = child_table.logp[depth + 1 - child_table.first][0]
            if lq > -math.inf:
                nxt = inc(0, depth + 1, lq)
                push(s + nxt, ranks + (0,), node, depth + 1, 0, child_table, raw + lq, nxt)
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


def build_ddtree(proposal: Proposal, budget: int) -> DraftTree:
    """The reference DDTree: best-first over the drafter's per-position top-k, `budget` nodes."""
    return best_first(Table.of(proposal), budget).tree


def substitutions(bf: BestFirst, depth_limit: int, count: int) -> list[int]:
    """Nodes whose subtree is worth re-drafting: substitutions (not the top-1 candidate where they
    stand) that the tree extends below, best joint log-prob first. Rule: a subtree the budget leaves
    empty would gain nothing from better candidates, so it is never re-drafted."""
    has_child = {p for p in bf.tree.parents if p >= 0}
    subs = [i for i in range(len(bf.tree)) if bf.ranks[i] > 0 and i in has_child and bf.tree.depths[i] < depth_limit]
    return sorted(subs, key=lambda i: -bf.scores[i])[:count]


def build_cure_best_first(proposal: Proposal, drafter: Drafter, budget: int, redrafts: RedraftPolicy, *,
                          fused: int = 0, redraft: bool = True, graft: Graft | None = None,
                          score: Score | None = None, floor: float = -math.inf) -> TreePlan:
    """Repair-aware best-first: the best-first tree of the block (`score`: the acceptance model's), then the
    subtrees under its best substitutions (`redrafts`: how many, and the blend weight) re-drafted in ONE
    batched drafter pass conditioned on the substituted token, then best-first again with the re-drafted
    candidates competing for the same budget. With no substitution worth it, this is the first tree at no
    extra cost. `fused`: substitutions a causal chain drafter re-drafted inside its proposal (its
    chain_substitutions; replays re-derive them), so no pass follows. `redraft=False`: the pass is skipped
    (it would not pay: redraft_price.py). `graft`: the prompt-lookup continuation, one more source in the
    heap. `floor`: see best_first."""
    n = len(proposal.tokens)
    base = Table.of(proposal)
    first = None
    if fused and proposal.redrafts:
        # A causal chain drafter chose its substitutions as it drafted (chain_substitutions, best first)
        # and re-drafted them in the chain's steps.
        prefixes = [list(p) for p in proposal.redrafts]
    elif fused:
        # a replay (no re-drafts in the proposal) asks for the same prefixes
        prefixes = [list(p) for p in chain_substitutions(proposal.top_ids, proposal.top_logprobs, fused, n)]
    else:
        first = best_first(base, budget, graft=graft, score=score, floor=floor)
        prefixes = [list(first.paths[i]) for i in substitutions(first, n, redrafts.count)] if redraft else []
        if not prefixes:
            return TreePlan(first.tree, lookup_nodes=graft_nodes(first.tree, graft),
                            ranks=tuple(first.ranks), logq=tuple(first.logq))
    t0 = time.perf_counter()
    if fused and proposal.redrafts:
        redrafted = [proposal.redrafts[tuple(p)] for p in prefixes]
    else:
        redrafted = drafter.redraft_topk(prefixes, [n - len(p) for p in prefixes], len(base.ids[0])) if prefixes else []
    redraft_ms = (time.perf_counter() - t0) * 1e3
    live = [(tuple(p), r) for p, r in zip(prefixes, redrafted) if len(r.tokens)]
    if redrafts.weight >= 1.0 or not live:
        under = {p: Table.lazy(r, len(p) + 1) for p, r in live}
    else:
        tables = blend(proposal.top_ids, proposal.top_logprobs, 1,
                       [(len(p) + 1, r.top_ids, r.top_logprobs) for p, r in live], redrafts.weight)
        under = {p: t for (p, _), t in zip(live, tables)}
    final = best_first(base, budget, under, graft, score, floor)
    # the re-drafted substitutions that made it into the tree, as UFPs
    by_pos: dict[int, list[int]] = {}
    for p in prefixes:
        if len(path_nodes(final.tree, p)) == len(p):
            by_pos.setdefault(len(p) - 1, []).append(p[-1])
    margins = proposal.margins if by_pos else []
    ufps = tuple(UFP(position=pos, margin=margins[pos], budget=len(alts), alternatives=tuple(alts))
                 for pos, alts in sorted(by_pos.items()))
    return TreePlan(final.tree, ufps, redraft_ms=redraft_ms, lookup_nodes=graft_nodes(final.tree, graft),
                    unrepaired=first.tree if first is not None else None,
                    ranks=tuple(final.ranks), logq=tuple(final.logq))


# ---------------------------------------------------------------------------------------------
# The paper's tree: branch 0 + repair branches at UFPs
# ---------------------------------------------------------------------------------------------

def select_ufps(cfg: DecodeConfig, margins: Sequence[float]) -> list[tuple[int, float, int]]:
    """(position, margin, budget) for up to max_ufps positions with m_i < tau_margin, most fragile
    first. Budget: u_i = clamp(1 - m_i/tau_margin, 0, 1); b_i = b_min + round(u_i (b_max - b_min))."""
    fragile = sorted((m, i) for i, m in enumerate(margins) if m < cfg.paper.tau_margin)[: cfg.paper.max_ufps]
    picked = []
    for m, i in fragile:
        u = min(max(1.0 - m / max(cfg.paper.tau_margin, 1e-9), 0.0), 1.0)
        b = cfg.paper.b_min + int(math.floor(u * (cfg.paper.b_max - cfg.paper.b_min) + 0.5))   # round half up
        picked.append((i, m, b))
    return picked


def build_paper_tree(proposal: Proposal, drafter: Drafter, cfg: DecodeConfig, budget: int,
                     beam: int = PAPER_BEAM) -> TreePlan:
    """The paper's tree: branch 0 whole, then repair branches at the UFPs (cfg's tau_margin, b_min, b_max,
    max_ufps; keep_branch0 for the ablation), each suffix re-drafted under its substitute, merged into the
    trie under `budget` nodes and `beam` repair nodes per depth (the paper's 5)."""
    block = proposal.tokens                                  # y_0..y_{n-1}
    n = len(block)
    picked = select_ufps(cfg, proposal.margins)
    # Repair branches. Branch (k, c) = y_0..y_{k-1}, c, then a suffix re-drafted under c.
    prefixes, lengths, owners = [], [], []
    ufps = []
    for pos, margin, branches in picked:
        # the next-best draft tokens at the UFP (never an impossible one)
        alts = [t for t, lp in zip(proposal.top_ids[pos, 1:].tolist(), proposal.top_logprobs[pos, 1:].tolist())
                if lp > float("-inf")][:branches]
        for c in alts:
            prefixes.append(block[:pos] + [c])
            lengths.append(n - pos - 1)                       # re-draft down to the block's depth
            owners.append(pos)
        ufps.append((pos, margin, branches, tuple(alts)))
    if cfg.ablations.keep_branch0:
        # Rule: only repairs that will get a node under V_max are re-drafted. Small budgets (the tuner's
        # shorter blocks, K = V + 1) leave no room past branch 0, and re-drafting there was pure cost.
        fit = repairs_that_fit(n, owners, lengths, budget, beam)
        prefixes, lengths, owners = ([x for x, f in zip(xs, fit) if f] for xs in (prefixes, lengths, owners))
    t0 = time.perf_counter()
    suffixes = drafter.redraft(prefixes, lengths) if prefixes else []
    redraft_ms = (time.perf_counter() - t0) * 1e3
    # Trie merge under the budget. Branch 0 goes in first and whole (the budget never cuts it); repair
    # branches follow in UFP order, most probable substitute first.
    tree = DraftTree()
    has_repairs = bool(prefixes)
    if cfg.ablations.keep_branch0 or not has_repairs:
        tree.add_path(block, branch=0)
    else:
        # Ablation (no branch 0): keep only the drafted prefix the repairs share, up to the first UFP.
        tree.add_path(block[: min(owners)], branch=0)
    grafted: dict[int, list[int]] = {}
    for r, (prefix, suffix, pos) in enumerate(zip(prefixes, suffixes, owners), start=1):
        path = tree.add_path(prefix + suffix, branch=r, v_max=budget, beam=beam)
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
