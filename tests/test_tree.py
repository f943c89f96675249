"""Tree construction, masks and budgets against brute force."""
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cure_core.config import ConfigError, DecodeConfig
from cure_core.drafters.base import Drafter, Proposal
from cure_core.strategies import build_ddtree, build_paper_tree, redraft_policy, select_ufps
from cure_core.tree import DraftTree, fill_ancestors, greedy_accept

paths_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=8)


def brute_ancestors(tree):
    n = len(tree)
    anc = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = tree.parents[j]
    return anc


@settings(max_examples=200, deadline=None, derandomize=True)
@given(paths=paths_st)
def test_trie_merge_and_mask_match_brute_force(paths):
    tree = DraftTree()
    for r, p in enumerate(paths):
        nodes = tree.add_path(p, branch=r)
        assert [tree.tokens[i] for i in nodes] == p          # each path is spelled out in the tree
        assert [tree.depths[i] for i in nodes] == list(range(1, len(p) + 1))
    # trie: the node count is the number of distinct prefixes
    prefixes = {tuple(p[:j]) for p in paths for j in range(1, len(p) + 1)}
    assert len(tree) == len(prefixes)
    assert (tree.ancestor_matrix() == brute_ancestors(tree)).all()
    # filled in two steps into one buffer, as the KV cache does across forwards, gives the same rows
    half = len(tree) // 2
    anc = np.zeros((len(tree), len(tree)), dtype=bool)
    fill_ancestors(anc, tree.parents[:half], 0)
    fill_ancestors(anc, tree.parents[half:], half)
    assert (anc == brute_ancestors(tree)).all()
    # one depth level a time (every new node's parent is an old one: the one-step path a chain drafter's
    # batched rows take), with the nodes renumbered depth-first-come
    order = sorted(range(len(tree)), key=lambda i: (tree.depths[i], i))
    new_index = {old: new for new, old in enumerate(order)}
    parents = [new_index[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in order]
    depths = [tree.depths[i] for i in order]
    anc = np.zeros((len(order), len(order)), dtype=bool)
    for d in range(1, max(depths) + 1):
        level = [j for j in range(len(order)) if depths[j] == d]      # consecutive: order is by depth
        fill_ancestors(anc, [parents[j] for j in level], level[0])
    relabelled = brute_ancestors(tree)[np.ix_(order, order)]
    assert (anc == relabelled).all()
    # parents before children; siblings hold distinct tokens
    assert all(p < i for i, p in enumerate(tree.parents))
    sib = {(p, t) for p, t in zip(tree.parents, tree.tokens)}
    assert len(sib) == len(tree)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(paths=paths_st, data=st.data())
def test_greedy_accept_is_longest_matching_path(paths, data):
    tree = DraftTree()
    for r, p in enumerate(paths):
        tree.add_path(p, branch=r)
    pred = data.draw(st.lists(st.integers(0, 3), min_size=len(tree) + 1, max_size=len(tree) + 1))
    path = greedy_accept(tree, torch.tensor(pred))
    # brute force: every root-to-node path whose tokens equal the argmax at each parent
    best = []
    for i in range(len(tree)):
        chain = tree.path_to(i)
        ok = all(tree.tokens[c] == pred[(tree.parents[c] + 1)] for c in chain)
        if ok and len(chain) > len(best):
            best = chain
    assert path == best


def proposal(tokens, margins, k=6):
    n = len(tokens)
    ids = torch.tensor([[t] + [100 + 10 * i + j for j in range(k - 1)] for i, t in enumerate(tokens)])
    logp = torch.tensor([[0.0, -m] + [-m - 1 - j for j in range(k - 2)] for m in margins])
    return Proposal(tokens=list(tokens), top_ids=ids, top_logprobs=logp)


class Redrafter(Drafter):
    """Redraft stub for tree-shape tests: suffix tokens 7, 7, ...; records its calls."""
    def __init__(self):
        self.calls = []

    def redraft(self, prefixes, lengths):
        self.calls.append((list(map(list, prefixes)), list(lengths)))
        return [[7] * n for n in lengths]


def test_ufp_selection_and_dynamic_budget():
    cfg = DecodeConfig.of(tau_margin=1.0, b_min=1, b_max=5, max_ufps=2)
    picked = select_ufps(cfg, [2.0, 0.9, 0.05, 1.0, 0.5])
    assert [p for p, _, _ in picked] == [2, 4]            # ascending margin, below tau only
    # u = 1 - m/s ; b = 1 + round(4u)
    assert [b for _, _, b in picked] == [1 + round(4 * 0.95), 1 + round(4 * 0.5)]
    assert select_ufps(cfg.with_(max_ufps=0), [0.0, 0.0]) == []


@pytest.mark.parametrize("v_max,beam", [(15, 5), (20, 5), (64, 5), (64, 2), (30, 1)])
def test_cure_tree_budget_depth_beam(v_max, beam):
    cfg = DecodeConfig.of(v_max=v_max, max_ufps=2)
    block = list(range(1, 16))                              # K-1 = 15 tokens
    margins = [5.0] * 15
    margins[3], margins[9] = 0.1, 0.4
    stub = Redrafter()
    plan = build_paper_tree(proposal(block, margins), stub, cfg, cfg.v_max, beam)
    tree = plan.tree
    assert len(tree) <= v_max
    assert max(tree.depths) <= 15
    # branch 0 is whole and first
    b0 = [i for i, b in enumerate(tree.branches) if b == 0]
    assert [tree.tokens[i] for i in b0] == block
    # repair frontier: at most `beam` repair nodes at any depth
    for d in set(tree.depths):
        assert sum(1 for i in range(len(tree)) if tree.depths[i] == d and tree.branches[i] != 0) <= beam
    if v_max <= len(block):                                  # no room past branch 0: nothing re-drafted
        assert stub.calls == [] and tree.tokens == block
        return
    # the repair prefixes were re-drafted in ONE batched call, suffix down to depth K-1
    assert len(stub.calls) == 1
    prefixes, lengths = stub.calls[0]
    for p, n in zip(prefixes, lengths):
        assert p[:-1] == block[: len(p) - 1] and len(p) + n == 15
    assert [u.position for u in plan.ufps] == [3, 9]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), v_extra=st.integers(-3, 30), beam=st.integers(1, 4), max_ufps=st.integers(0, 4),
       margins=st.lists(st.floats(0.0, 2.0), min_size=12, max_size=12))
def test_only_repairs_that_fit_are_redrafted_and_the_tree_is_unchanged(n, v_extra, beam, max_ufps, margins):
    """Skipping the repairs the budget would cut leaves the same tree (tokens, parents, branch 0) as
    re-drafting every repair and letting the trie merge cut them; every re-drafted repair adds a node."""
    import cure_core.strategies as S
    cfg = DecodeConfig.of(k=n + 1, v_max=n + max(v_extra, 0), max_ufps=max_ufps, tau_margin=1.0)
    block = list(range(1, n + 1))
    prop = proposal(block, margins[:n])
    lean, full = Redrafter(), Redrafter()
    a = build_paper_tree(prop, lean, cfg, cfg.v_max, beam).tree
    saved = S.repairs_that_fit
    S.repairs_that_fit = lambda n_, owners, *_: [True] * len(owners)
    try:
        b = build_paper_tree(prop, full, cfg, cfg.v_max, beam).tree
    finally:
        S.repairs_that_fit = saved
    assert (a.tokens, a.parents, a.depths) == (b.tokens, b.parents, b.depths)
    assert [x == 0 for x in a.branches] == [x == 0 for x in b.branches]
    asked = len(lean.calls[0][0]) if lean.calls else 0
    assert asked == len(set(a.branches) - {0})              # each re-drafted repair is in the tree
    assert asked <= (len(full.calls[0][0]) if full.calls else 0)


def test_cure_without_branch0_keeps_only_shared_prefix():
    cfg = DecodeConfig.of(keep_branch0=False)
    block = list(range(1, 16))
    margins = [5.0] * 15
    margins[6] = 0.2
    tree = build_paper_tree(proposal(block, margins), Redrafter(), cfg, cfg.v_max).tree
    assert [tree.tokens[i] for i, b in enumerate(tree.branches) if b == 0] == block[:6]
    # with no UFP, branch 0 stays (no repair to replace it)
    tree = build_paper_tree(proposal(block, [5.0] * 15), Redrafter(), cfg, cfg.v_max).tree
    assert tree.tokens == block


@pytest.mark.parametrize("v_max", [15, 32, 64])
def test_ddtree_best_first_within_budget(v_max):
    cfg = DecodeConfig.of(strategy="ddtree", v_max=v_max)
    margins = [0.3 * (i % 4) for i in range(15)]
    p = proposal(list(range(1, 16)), margins, k=8)
    tree = build_ddtree(p, cfg.v_max)
    assert len(tree) == min(v_max, len(tree))
    assert len(tree) <= v_max
    # best-first: every kept node scores at least as high as... its parent scores higher than it
    logp = {(d, t): lp for d in range(15) for t, lp in zip(p.top_ids[d].tolist(), p.top_logprobs[d].tolist())}
    score = {}
    for i in range(len(tree)):
        s = logp[(tree.depths[i] - 1, tree.tokens[i])]
        score[i] = s + (score[tree.parents[i]] if tree.parents[i] >= 0 else 0.0)
        if tree.parents[i] >= 0:
            assert score[tree.parents[i]] >= score[i]


def test_ddtree_never_grafts_an_impossible_candidate():
    """Candidates with log-prob -inf (outside a draft vocabulary, or masked out) never enter the tree,
    even when the budget has room left for them."""
    p = proposal([1, 2, 3], [0.5, 0.5, 0.5], k=4)
    p.top_logprobs[:, 2:] = float("-inf")
    tree = build_ddtree(p, 40)
    allowed = {t for row in p.top_ids[:, :2].tolist() for t in row}
    assert set(tree.tokens) <= allowed and len(tree) == 2 + 4 + 8       # 2 per node, no width cap: all 14


@pytest.mark.parametrize("bad", [dict(k=1), dict(v_max=3), dict(b_min=4, b_max=2), dict(strategy="nope"),
                                 dict(temperature=-1), dict(top_k=3), dict(seed=-1), dict(seed=2 ** 64)])
def test_invalid_config_is_refused(bad):
    with pytest.raises(ConfigError):
        DecodeConfig.of(**bad)


# ---------------------------------------------------------------------------------------------
# ddtree is the reference rule; cure best-first re-drafts below substitutions
# ---------------------------------------------------------------------------------------------

def reference_ddtree(ids, logp, budget):
    """DDTree's Algorithm 1 written out independently: repeatedly take the best frontier candidate,
    where the frontier is every child (any rank) of the root or of a taken node that is not taken yet.
    Scores are sums of log-probs along the path; ties go to the smaller rank path. Returns the taken
    nodes as token paths."""
    import math
    taken: dict[tuple, float] = {}                       # rank path -> score
    frontier = {(r,): logp[0][r] for r in range(len(ids[0])) if logp[0][r] > -math.inf}
    while frontier and len(taken) < budget:
        best = min(frontier, key=lambda rp: (-frontier[rp], rp))
        taken[best] = frontier.pop(best)
        d = len(best)
        if d < len(ids):
            for r in range(len(ids[d])):
                if logp[d][r] > -math.inf:
                    frontier[best + (r,)] = taken[best] + logp[d][r]
    return {tuple(ids[i][r] for i, r in enumerate(rp)) for rp in taken}


def tree_paths(tree):
    return {tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(len(tree))}


@pytest.mark.parametrize("budget", [4, 8, 16, 32, 64])
@pytest.mark.parametrize("seed", range(6))
def test_ddtree_is_the_reference_rule_on_random_tables(budget, seed):
    g = torch.Generator().manual_seed(seed)
    n, k = 7, 64
    logits = torch.randn(n, 100, generator=g) * (1 + seed)
    logp, ids = torch.log_softmax(logits, -1).topk(k, -1)
    p = Proposal(tokens=ids[:, 0].tolist(), top_ids=ids, top_logprobs=logp)
    tree = build_ddtree(p, budget)
    assert tree_paths(tree) == reference_ddtree(ids.tolist(), logp.tolist(), budget)
    assert len(tree) == budget


def test_ddtree_replays_recorded_blocks_like_the_reference(tmp_path):
    """Blocks recorded from a real generation (tiny models, a PARD drafter, proposals as wide as the
    budget): the engine's builder and the written-out rule keep the same node sets at every budget."""
    from cure_core.engine import Engine
    from cure_core.models import build_pair
    from cure_core.tiny import MASK_ID, perturbed_copy, tiny_target
    target = tiny_target(seed=0, logit_scale=4.0)
    pair, _ = build_pair(target, perturbed_copy(target, noise=0.3, seed=1), drafter="pard", mask_token_id=MASK_ID)
    seen = []

    class Keep:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def propose(self, root, n, top_k):
            seen.append(self.inner.propose(root, n, top_k))
            return seen[-1]
    pair.drafter = Keep(pair.drafter)
    for prompt in (b"def add(a, b):\n", b"import os\n", b"class A:\n"):
        list(Engine(pair).generate(list(prompt), DecodeConfig.of(strategy="ddtree", k=8, v_max=64, max_new_tokens=24)))
    assert len(seen) >= 10
    for p in seen:
        for budget in (4, 8, 16, 32, 64):
            tree = build_ddtree(p, budget)
            assert tree_paths(tree) == reference_ddtree(p.top_ids.tolist(), p.top_logprobs.tolist(), budget)


class TableRedrafter(Drafter):
    """A drafter whose re-drafts come from a table: prefix -> per-position (ids, logp)."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def redraft_topk(self, prefixes, lengths, top_k):
        self.calls.append([tuple(p) for p in prefixes])
        out = []
        for p, n in zip(prefixes, lengths):
            ids, logp = self.table[tuple(p)]
            out.append(Proposal(tokens=[r[0] for r in ids[:n]], top_ids=torch.tensor(ids[:n]),
                                top_logprobs=torch.tensor(logp[:n])))
        return out


def test_cure_best_first_redrafts_the_best_substitution_and_lets_its_log_probs_compete():
    from cure_core.strategies import build_cure_best_first
    # depth 1: token 10 (p .55) vs 20 (p .45); depth 2 marginals favour 11 (after 10); depth 3 likewise
    ids = [[10, 20, 30], [11, 21, 31], [12, 22, 32]]
    logp = [[math.log(.55), math.log(.44), math.log(.01)], [math.log(.6), math.log(.3), math.log(.1)],
            [math.log(.6), math.log(.3), math.log(.1)]]
    p = Proposal(tokens=[10, 11, 12], top_ids=torch.tensor(ids), top_logprobs=torch.tensor(logp))
    # under the substitute 20 the re-drafted next positions are confident: 25 then 26
    d = TableRedrafter({(20,): ([[25, 11, 21], [26, 12, 22]], [[math.log(.95), math.log(.03), math.log(.02)],
                                                              [math.log(.9), math.log(.05), math.log(.05)]])})
    cfg = DecodeConfig.of(strategy="cure", k=4, v_max=5, redrafts=1, redraft_weight=1.0)   # the re-draft alone
    plan = build_cure_best_first(p, d, cfg.v_max, redraft_policy(cfg, d))
    assert d.calls == [[(20,)]]                                  # one batched pass, the best substitution
    paths = tree_paths(plan.tree)
    assert (20, 25) in paths and (20, 25, 26) in paths           # the re-drafted subtree won the budget
    assert (20, 11) not in paths                                 # ddtree's marginal reuse is gone
    assert len(plan.tree) == 5 and plan.ufps[0].position == 0 and plan.ufps[0].alternatives == (20,)
    ddtree = tree_paths(build_ddtree(p, cfg.v_max))
    assert (20, 11) in ddtree and (20, 25) not in ddtree


def test_cure_best_first_without_a_substitution_worth_it_is_ddtrees_tree():
    from cure_core.strategies import build_cure_best_first
    p = proposal(list(range(1, 8)), [5.0] * 7, k=4)                  # confident: the budget goes down the chain
    d = TableRedrafter({})
    cfg = DecodeConfig.of(strategy="cure", k=8, v_max=7)
    plan = build_cure_best_first(p, d, cfg.v_max, redraft_policy(cfg, d))
    assert d.calls == [] and plan.redraft_ms == 0.0
    assert tree_paths(plan.tree) == tree_paths(build_ddtree(p, cfg.v_max))


def test_blending_keeps_the_proposals_candidates_below_a_substitution():
    """redraft_weight w: below a substitution a candidate scores log(w p_redraft + (1 - w) p_proposal), so a
    token only the proposal ranked stays a candidate, and w = 0 is ddtree's tree again."""
    from cure_core.strategies import Table, build_cure_best_first, mix
    base = Table([[10, 20], [11, 21]], [[math.log(.6), math.log(.4)], [math.log(.7), math.log(.3)]])
    red = Table([[25, 11, 40]], [[math.log(.85), math.log(.1), math.log(.05)]], first=2)
    m = mix(base, red, 0.5)                                  # as wide as the re-draft: 3
    assert m.first == 2 and m.ids[0] == [25, 11, 21]
    assert m.logp[0] == pytest.approx([math.log(.425), math.log(.4), math.log(.15)])
    assert mix(base, red, 1.0) is red
    ids = [[10, 20, 30], [11, 21, 31], [12, 22, 32]]
    lp = [[math.log(.55), math.log(.44), math.log(.01)], [math.log(.6), math.log(.3), math.log(.1)],
          [math.log(.6), math.log(.3), math.log(.1)]]
    p = Proposal(tokens=[10, 11, 12], top_ids=torch.tensor(ids), top_logprobs=torch.tensor(lp))
    d = TableRedrafter({(20,): ([[25, 11, 21], [26, 12, 22]], [[math.log(.95), math.log(.03), math.log(.02)],
                                                              [math.log(.9), math.log(.05), math.log(.05)]])})
    cfg = DecodeConfig.of(strategy="cure", k=4, v_max=5, redrafts=1, redraft_weight=0.0)
    assert tree_paths(build_cure_best_first(p, d, cfg.v_max, redraft_policy(cfg, d)).tree) == tree_paths(build_ddtree(p, cfg.v_max))


@pytest.mark.parametrize("floor", [-0.5, -1.5, -3.0, -math.inf])
def test_best_first_floor_keeps_the_chain_and_drops_alternatives_below_it(floor):
    """`floor` (BudgetTuner.alt_floor): a node off the base table's top-1 chain joins only with a score of at
    least the floor; the chain's nodes are bounded by the budget alone. The tree is the unfloored tree's nodes
    that pass, in the same order, where the budget is not reached."""
    from cure_core.strategies import Table, best_first
    gen = torch.Generator().manual_seed(7)
    logp = torch.log_softmax(torch.randn(4, 3, generator=gen) * 2, -1).sort(-1, descending=True)
    ids = torch.arange(12).reshape(4, 3)                              # distinct ids in a row: no repeated node
    base = Table(ids.tolist(), logp.values.tolist())
    budget = 200                                                      # more than the table's 120 paths
    full = best_first(base, budget)
    got = best_first(base, budget, floor=floor)
    keep = [i for i in range(len(full.tree)) if full.tree.branches[i] == 0 or full.scores[i] >= floor]
    assert [full.paths[i] for i in keep] == got.paths
    assert len(full.tree) < budget                                    # the whole table: the floor alone cuts
    chain = [i for i in range(len(got.tree)) if got.tree.branches[i] == 0]
    assert len(chain) == 4                                            # every drafted position, whatever its score
    assert all(got.scores[i] >= floor for i in range(len(got.tree)) if got.tree.branches[i] != 0)
    if floor > -math.inf:
        assert len(got.tree) < len(full.tree)
    # within a budget the chain still competes with the alternatives that pass, best first
    small = best_first(base, 4, floor=floor)
    assert small.paths == got.paths[:4]


def test_add_node_keeps_the_trie_as_add_path_does():
    """DraftTree.add_node (best-first's one new node) leaves the same lists, trie and repair widths as add_path."""
    from cure_core.tree import DraftTree
    a, b = DraftTree(), DraftTree()
    steps = [(5, -1, 0), (6, 0, 0), (7, 0, 3), (8, 2, 3), (9, -1, 5), (6, 4, 5)]
    for token, parent, branch in steps:
        assert a.add_node(token, parent, branch) == b.add_path([token], branch=branch, parent=parent)[0]
    assert (a.tokens, a.parents, a.depths, a.branches) == (b.tokens, b.parents, b.depths, b.branches)
    assert a._child == b._child and a._repair_width == b._repair_width == {2: 2, 3: 1, 1: 1}


def test_top_k_comes_to_the_host_in_one_read_exactly():
    """drafters.base.to_host (what top_k_logprobs runs off the CPU): ids and log-probs packed into one float64
    read come back exactly, the largest Qwen ids and -inf (a masked id) included."""
    from cure_core.drafters.base import to_host
    ids = torch.tensor([[151935, 0, 7], [123456, 151934, 1]])
    logp = torch.tensor([[-0.1234567, -3.5, -math.inf], [-1e-8, -20.25, -7.0]], dtype=torch.float32)
    i2, l2 = to_host(ids, logp)
    assert i2.dtype == torch.long and l2.dtype == torch.float32
    assert torch.equal(i2, ids) and torch.equal(l2, logp)
