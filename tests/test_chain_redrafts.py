"""A causal chain drafter re-drafts the best substitutions inside its own chain steps (#13 item 1 for AR
chains): the same re-drafts as redraft_topk, chosen by one rule (drafters.base.chain_substitutions),
and lossless under best-first cure (T > 0: tests/test_sampling.py)."""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cure_core.config import DecodeConfig
from cure_core.drafters.base import ChainSubstitutions, chain_substitutions
from cure_core.drafters.causal import ArDrafter
from cure_core.engine import ModelPair, generate_ids
from cure_core.policies import BestFirstCure
from cure_core.strategies import build_cure_best_first, redraft_policy
from cure_core.tiny import BYTE_VOCAB


def ar_pair(target, draft_model):
    return ModelPair(target=target, drafter=ArDrafter(draft_model, vocab_size=BYTE_VOCAB),
                     ar_drafter=ArDrafter(draft_model, vocab_size=BYTE_VOCAB))


def test_the_rule_picks_the_best_chain_alternatives_by_joint_log_prob():
    ids = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]])
    logp = torch.log(torch.tensor([[0.5, 0.4, 0.1], [0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.5, 0.5, 0.0]]))
    # joint: (2,) 0.4; (1, 5) 0.025; (1, 4, 8) 0.135; row 3 is the last of a depth-4 block: never
    assert chain_substitutions(ids, logp, 2, depth=4) == [(2,), (1, 4, 8)]
    assert chain_substitutions(ids, logp, 1, depth=4) == [(2,)]
    assert chain_substitutions(ids, logp, 0, depth=4) == []
    assert chain_substitutions(ids, logp, 2, depth=2) == [(2,), (3,)]       # rows 0 .. depth-2 only
    # impossible candidates (masked ids, -inf) are never picked
    logp[0, 1] = float("-inf")
    assert (2,) not in chain_substitutions(ids, logp, 3, depth=4)


def written_out_rule(ids, logp, count, depth):
    """The rule in full: every chain alternative of rows 0 .. depth-2 scored, sorted, the best `count`."""
    ids, logp = ids.tolist(), logp.tolist()
    cands, above = [], 0.0
    for r in range(min(len(ids), depth - 1)):
        for j in range(1, min(count + 1, len(ids[r]))):
            if logp[r][j] > -math.inf:
                cands.append((-(above + logp[r][j]), r, j, tuple(ids[i][0] for i in range(r)) + (ids[r][j],)))
        above += logp[r][0]
    return [c[-1] for c in sorted(cands)[:count]]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9), st.integers(2, 6), st.integers(0, 5), st.integers(0, 10**6), st.booleans())
def test_the_row_by_row_rule_equals_the_written_out_one(n, width, count, seed, ties):
    """ChainSubstitutions reads each row's best count + 1 and stops at the first candidate that cannot
    enter: the same set, in the same order, as scoring every candidate (ties and -inf included)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(n, 12, generator=g) * 2
    if ties:
        raw = raw.round()                                   # equal log-probs: ties broken by row, then rank
    logp, ids = torch.log_softmax(raw, -1).topk(width, dim=-1)
    logp[torch.rand(n, width, generator=g) < 0.1] = float("-inf")
    logp = logp.sort(dim=-1, descending=True).values        # a masked candidate sorts last, as from topk
    for depth in (n, n + 1, max(1, n - 2)):
        assert chain_substitutions(ids, logp, count, depth) == written_out_rule(ids, logp, count, depth)
        # add() says when the set changed (the drafter rebuilds its re-draft rows only then)
        subs, before = ChainSubstitutions(count, depth), []
        for r_ids, r_logp in zip(ids[:, : count + 1].tolist(), logp[:, : count + 1].tolist()):
            changed = subs.add(r_ids, r_logp)
            assert changed == (subs.best() != before)
            before = subs.best()


def test_the_rule_on_a_prefix_of_the_rows_never_brings_a_candidate_back():
    """What makes the drafter's online choice exact: a candidate kept after the last row was kept after
    every row since its own."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        n, w, count = 7, 4, 2
        logp, ids = torch.log_softmax(torch.randn(n, 20, generator=g) * 2, -1).topk(w, dim=-1)
        final = chain_substitutions(ids, logp, count, n)
        for p in final:
            for r in range(len(p), n + 1):
                assert p in chain_substitutions(ids[:r], logp[:r], count, n)


def test_re_drafts_in_the_chain_steps_equal_redraft_topk(target, drafts):
    d = ArDrafter(drafts["strong"], vocab_size=BYTE_VOCAB)
    context = list(b"def add(a, b):\n    return")
    d.reset(context[:-1])
    fused = d.propose_with_redrafts(context[-1], 7, 6, 3)
    d.reset(context[:-1])
    plain = d.propose(context[-1], 7, 6)
    assert fused.tokens == plain.tokens and torch.equal(fused.top_ids, plain.top_ids)
    torch.testing.assert_close(fused.top_logprobs, plain.top_logprobs)
    picked = chain_substitutions(plain.top_ids, plain.top_logprobs, 3, 7)
    assert list(fused.redrafts) == picked and len(picked) == 3
    d.reset(context[:-1])
    d.propose(context[-1], 7, 6)              # leaves the root committed, as before a tree's re-drafts
    offline = d.redraft_topk([list(p) for p in picked], [7 - len(p) for p in picked], 6)
    for p, r in zip(picked, offline):
        got = fused.redrafts[p]
        assert got.tokens == r.tokens and len(got.tokens) == 7 - len(p)
        assert torch.equal(got.top_ids, r.top_ids)
        torch.testing.assert_close(got.top_logprobs, r.top_logprobs, atol=1e-4, rtol=1e-4)


def test_the_engine_builds_the_tree_a_replay_of_the_proposal_builds(target, drafts):
    """The tree from the drafter's in-step re-drafts equals the one built from its proposal alone (the
    re-drafts then asked of redraft_topk): a replay of recorded proposals builds what the engine verifies."""
    d = ArDrafter(drafts["mild"], vocab_size=BYTE_VOCAB)
    cfg = DecodeConfig.of(strategy="cure", k=8, v_max=24, redrafts=2, redraft_weight=1.0)
    policy = BestFirstCure(cfg, d)
    assert policy.fused(7, 24) == 2 and policy.fused(7, 7) == 0      # a budget with no room past the chain: none
    policy = redraft_policy(cfg, d)
    for prompt in (b"for i in range(", b"import os\n", b"class A:\n    def"):
        ctx = list(prompt)
        d.reset(ctx[:-1])
        fused = d.propose_with_redrafts(ctx[-1], 7, 24, 2)
        a = build_cure_best_first(fused, d, cfg.v_max, policy, fused=2)
        d.reset(ctx[:-1])
        plain = d.propose(ctx[-1], 7, 24)
        b = build_cure_best_first(plain, d, cfg.v_max, policy, fused=2)
        assert (a.tree.tokens, a.tree.parents) == (b.tree.tokens, b.tree.parents)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(prompt=st.lists(st.integers(0, 255), min_size=1, max_size=20), k=st.integers(2, 12),
       extra=st.integers(0, 40), redrafts=st.integers(0, 4), weight=st.sampled_from([0.0, 0.5, 1.0]),
       noise=st.sampled_from(["mild", "strong"]), auto=st.booleans())
def test_cure_over_an_ar_chain_equals_ar(target, drafts, prompt, k, extra, redrafts, weight, noise, auto):
    pair = ar_pair(target, drafts[noise])
    cfg = DecodeConfig.of(strategy="cure", k=k, v_max=k - 1 + extra, redrafts=redrafts, redraft_weight=weight,
                       max_new_tokens=30, auto_budget=auto)
    ref = generate_ids(pair, cfg.with_(strategy="ar", auto_budget=False), prompt)
    assert generate_ids(pair, cfg, prompt) == ref


@pytest.mark.parametrize("strategy", ["cure", "ddtree"])
def test_cure_over_an_ar_chain_stops_drafting_where_the_chain_gets_unlikely(target, drafts, strategy, monkeypatch):
    """Under the budget tuner, best-first cure over a sequential drafter drafts position by position only
    while the chain's joint draft probability stays above the tuner's threshold, and fills the budget it
    did not spend on depth with width and re-drafted repairs; ddtree drafts min(V, K-1) positions. Every
    budget and threshold stays lossless."""
    from cure_core.engine import Engine
    from cure_core.strategies import drafted_steps

    budgets = [0, 1, 2, 4, 8, 12, 16, 24]
    thresholds = [0.0, 0.3, 0.6, 0.9]

    class Cycle:                                       # each candidate budget in turn, thresholds in turn
        def __init__(self):
            self.n, self.last_prediction, self.last_phase, self.candidates = 0, None, "settled", budgets
            self.last_choice = budgets[0]

        def choose(self):
            self.n += 1
            return budgets[self.n % len(budgets)]

        def draft_stop(self, v):
            p = thresholds[self.n % len(thresholds)]
            return math.log(p) if p > 0 else None

        def observe(self, block, budget, clipped=False, chain_logp=None):
            handed[block.index] = chain_logp

        def best_tree(self):
            return None

        def alt_floor(self, v):                         # every alternative the budget holds
            return -math.inf

    handed = {}
    monkeypatch.setattr(Engine, "_make_tuner", lambda self, cfg: Cycle())
    pair = ar_pair(target, drafts["mild"])
    cfg = DecodeConfig.of(strategy=strategy, k=8, v_max=24, max_new_tokens=80, auto_budget=True, lookup=0)
    prompt = list(b"def add(a, b):\n    return")
    blocks = list(Engine(pair, cfg).generate(prompt))
    assert [t for b in blocks for t in b.emitted] == generate_ids(pair, cfg.with_(strategy="ar", auto_budget=False), prompt)
    before = [sum(len(x.emitted) for x in blocks[:i]) for i in range(len(blocks))]
    full = [b for b, n in zip(blocks, before)                  # blocks the generation's end left whole
            if cfg.max_new_tokens - n - 1 >= drafted_steps(cfg, b.meta["v_max"])]
    assert len(full) > len(budgets)
    stopped = 0
    for b in full:
        assert b.tree_size <= b.meta["v_max"]
        steps = drafted_steps(cfg, b.meta["v_max"])
        if strategy == "ddtree" or "draft_stop" not in b.meta:
            assert len(b.draft) == steps and "draft_stop" not in b.meta
            # ddtree: no stop, no floor, nothing to calibrate; cure's alternatives' floor (alt_floor) calibrates
            assert handed[b.index] is None if strategy == "ddtree" or not b.draft else handed[b.index]
            continue
        assert 1 <= len(b.draft) <= steps                 # the rule itself: test_the_chain_stops_...
        stopped += len(b.draft) < steps
        # the tuner's calibration data: the draft log-prob of each branch-0 token the tree holds, by depth
        chain = sorted((n for n in b.nodes if n.branch == 0), key=lambda n: n.depth)
        lp = handed[b.index]
        assert [n.depth for n in chain] == list(range(1, len(lp) + 1))
        assert [n.token for n in chain] == list(b.draft[: len(lp)]) and all(x <= 0 for x in lp)
    if strategy == "cure":
        assert stopped and any(b.tree_size > len(b.draft) > 0 for b in full)      # width where it stopped
        # `draft_stop` off (the A/B knob): the tuner's stop is not asked for; the output is the same
        off = list(Engine(pair, cfg.with_(draft_stop=False)).generate(prompt))
        assert not any("draft_stop" in b.meta for b in off)
        assert [t for b in off for t in b.emitted] == [t for b in blocks for t in b.emitted]


def test_a_block_with_no_room_to_draft_under_a_draft_stop(target, drafts, monkeypatch):
    """The generation's last token leaves no room to draft (no proposal) while the tuner still sets a stop:
    the block verifies the root alone and the tuner gets no chain to calibrate on."""
    from cure_core.engine import Engine

    class Fixed:                                       # budget 4, stop at p = 0.5, every block
        last_prediction, last_phase, candidates, last_choice = None, "settled", [0, 4], 4

        def choose(self):
            return 4

        def draft_stop(self, v):
            return math.log(0.5)

        def observe(self, block, budget, clipped=False, chain_logp=None):
            assert (chain_logp is None) == (not block.draft)

        def best_tree(self):
            return None

        def alt_floor(self, v):                         # every alternative the budget holds
            return -math.inf

    monkeypatch.setattr(Engine, "_make_tuner", lambda self, cfg: Fixed())
    pair = ar_pair(target, drafts["mild"])
    prompt = list(b"x = [1, 2,")
    for n in (1, 2, 3, 5):
        cfg = DecodeConfig.of(strategy="cure", k=6, v_max=12, max_new_tokens=n, auto_budget=True, lookup=0)
        ref = generate_ids(pair, cfg.with_(strategy="ar", auto_budget=False), prompt)
        assert [t for b in Engine(pair, cfg).generate(prompt) for t in b.emitted] == ref


@pytest.mark.parametrize("floor", [0.0, -math.inf])
def test_cure_over_a_chain_verifies_alternatives_only_above_the_tuners_floor(target, drafts, floor, monkeypatch):
    """BudgetTuner.alt_floor reaches the tree: at a floor of log 1 no node off the drafted chain is verified,
    whatever room the budget leaves (budget 8 over 5 drafted positions); at -inf the budget fills with
    alternatives. Both equal ar."""
    from cure_core.engine import Engine

    class Fixed:                                       # budget 8, no draft stop, the floor given
        last_prediction, last_phase, candidates, last_choice = None, "settled", [0, 8], 8

        def choose(self):
            return 8

        def draft_stop(self, v):
            return None

        def observe(self, block, budget, clipped=False, chain_logp=None):
            pass

        def best_tree(self):
            return None

        def alt_floor(self, v):
            return floor

    monkeypatch.setattr(Engine, "_make_tuner", lambda self, cfg: Fixed())
    pair = ar_pair(target, drafts["mild"])
    prompt = list(b"def add(a, b):\n    return")
    cfg = DecodeConfig.of(strategy="cure", k=6, v_max=8, max_new_tokens=40, auto_budget=True, lookup=0)
    blocks = list(Engine(pair, cfg).generate(prompt))
    assert [t for b in blocks for t in b.emitted] == generate_ids(pair, cfg.with_(strategy="ar", auto_budget=False), prompt)
    off_chain = [sum(n.branch != 0 for n in b.nodes) for b in blocks]
    if floor == 0.0:
        assert not any(off_chain) and all(b.tree_size == len(b.draft) for b in blocks)
        assert all(b.meta["alt_floor"] == 1.0 for b in blocks if b.draft)      # what the trace shows
    else:
        assert not any("alt_floor" in b.meta for b in blocks)
        assert sum(off_chain) >= len(blocks) and all(b.tree_size <= 8 for b in blocks)
    # off (alt_floor False) the tuner's floor is not asked for
    cfg_off = cfg.with_(alt_floor=False)
    assert any(sum(n.branch != 0 for n in b.nodes) for b in Engine(pair, cfg_off).generate(prompt))


def test_the_chain_stops_at_the_first_position_below_the_threshold(target, drafts):
    """propose_with_redrafts(stop_logp): positions are drafted while the joint draft log-prob of the chain
    so far is >= stop_logp; the chain and its re-drafts are exactly those of an unstopped draft cut there."""
    d = ArDrafter(drafts["strong"], vocab_size=BYTE_VOCAB)
    context = list(b"def add(a, b):\n    return a")
    d.reset(context[:-1])
    full = d.propose_with_redrafts(context[-1], 7, 6, 3)
    joint = full.top_logprobs[:, 0].cumsum(0).tolist()
    for p in (0.0, 0.2, 0.5, 0.8, 0.99, 1.0):
        d.reset(context[:-1])
        log_p = math.log(p) if p > 0 else -math.inf
        cut = d.propose_with_redrafts(context[-1], 7, 6, 3, stop_logp=log_p)
        m = next((i + 1 for i, j in enumerate(joint[:-1]) if j < log_p), 7)
        assert cut.tokens == full.tokens[:m]
        assert torch.equal(cut.top_ids, full.top_ids[:m])
        assert set(cut.redrafts) == {tuple(p) for p in chain_substitutions(full.top_ids[:m], full.top_logprobs[:m], 3, m)}
        for prefix, r in cut.redrafts.items():
            assert len(prefix) + len(r.tokens) == m
