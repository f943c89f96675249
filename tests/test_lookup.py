"""Prompt lookup grafted into best-first cure (cure_core/lookup.py): the continuation rule, the graft in
the best-first heap, the acceptance it learns, and losslessness."""
import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cure_core.config import ConfigError, DecodeConfig
from cure_core.drafters.base import Proposal
from cure_core.engine import Engine, generate_ids
from cure_core.lookup import Graft, LookupStats, NgramIndex, continuation
from cure_core.options import EngineArgs
from cure_core.strategies import Table, best_first, build_cure_best_first, graft_nodes

from conftest import make_pair


def test_continuation_takes_the_latest_match_of_the_longest_ngram():
    #        0  1  2  3  4  5  6  7  8  9
    h = [5, 6, 7, 1, 5, 6, 9, 2, 5, 6]
    assert continuation(h, 2, 3) == [9, 2, 5]          # [5, 6] last seen at 4 -> what followed it
    assert continuation(h, 2, 1) == [9]
    assert continuation(h[:-1] + [7], 2, 4) == [1, 5, 6, 9]      # [5, 7]: no match; [7] at 2
    assert continuation([1, 2, 3, 4], 2, 5) == []        # nothing repeats
    assert continuation([3], 2, 5) == [] and continuation([1, 2, 1], 2, 0) == []
    assert continuation([1, 2, 1], 3, 5) == [2, 1]       # the continuation may run into the tail itself


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=40), st.lists(st.integers(1, 5), min_size=1, max_size=12),
       st.integers(1, 3), st.integers(0, 6))
def test_the_ngram_index_answers_like_the_scan_as_the_text_grows(text, chunks, ngram, length):
    """The engine keeps an NgramIndex beside the committed tokens (O(max_ngram) a block); at every size
    it must return what continuation() finds by scanning the whole history."""
    start = len(text) // 3
    index = NgramIndex(ngram, text[:start])
    at = start
    for c in chunks:
        index.extend(text[at: at + c])
        at = min(at + c, len(text))
        assert index.tokens == text[:at]
        assert index.continuation(length) == continuation(text[:at], ngram, length)


def test_lookup_stats_score_depths_by_their_acceptance():
    s = LookupStats()
    assert s.path_logp(1, 0) == pytest.approx([math.log(0.5)])
    s.observe([10, 11, 12], {10, 11}, 0)                # depths 1, 2 accepted, 3 tried and rejected
    s.observe([20, 21], set(), 0)                       # depth 1 rejected: depth 2 was never tried
    assert s.own.tried == [2, 1, 1] and s.own.accepted == [1, 1, 0] and not s.on_chain.tried
    assert s.path_logp(3, 0) == pytest.approx([math.log(2 / 4), math.log(2 / 3), math.log(1 / 3)])


def test_lookup_tokens_on_the_drafters_chain_are_counted_apart_from_the_grafts_own():
    """A drafter that is right makes lookup tokens that repeat its chain right: that must not raise the score of
    the tokens the graft adds where it departs from the chain."""
    s = LookupStats()
    for _ in range(8):
        s.observe([1, 2, 3], {1, 2}, 2)                 # repeats the chain at depths 1-2 (accepted), departs at 3
    assert s.on_chain.tried == [8, 8] and s.on_chain.accepted == [8, 8]
    assert s.own.tried == [0, 0, 8] and s.own.accepted == [0, 0, 0]
    on, on2, own = s.path_logp(3, 2)
    assert on == on2 == pytest.approx(math.log(9 / 10)) and own == pytest.approx(math.log(1 / 10))
    assert s.path_logp(1, 0) == pytest.approx([math.log(1 / 2)])    # depth 1 off the chain: never seen


def table(rows):
    """rows: per depth, [(token, prob), ...] best first."""
    return Table([[t for t, _ in r] for r in rows], [[math.log(p) for _, p in r] for r in rows])


def test_the_graft_competes_in_the_heap_and_shares_nodes_with_the_drafter():
    base = table([[(1, 0.6), (2, 0.3)], [(3, 0.5), (4, 0.4)], [(5, 0.9), (6, 0.1)]])
    # a graft that agrees with the drafter at depth 1 then departs: it reuses node "1" and adds 7, 8
    graft = Graft([1, 7, 8], [math.log(0.9), math.log(0.8), math.log(0.8)])
    bf = best_first(base, 4, graft=graft)
    t = bf.tree
    assert len(t) == 4
    nodes = graft_nodes(t, graft)
    assert [t.tokens[i] for i in nodes] == [1, 7, 8][:len(nodes)] and len(nodes) >= 2
    # the drafter's chain goes on under the shared node (the table adopted it)
    one = t._child[(-1, 1)]
    assert t.branches[one] == 0 and (one, 3) in t._child
    # a worthless graft takes nothing from the drafter's best nodes
    weak = Graft([9, 9, 9], [math.log(1e-6)] * 3)
    assert best_first(base, 4, graft=weak).tree.tokens == best_first(base, 4).tree.tokens
    # a sure graft takes the budget first
    sure = Graft([2, 6, 6], [0.0, 0.0, 0.0])
    bf = best_first(base, 3, graft=sure)
    assert [bf.tree.tokens[i] for i in graft_nodes(bf.tree, sure)] == [2, 6, 6]


def test_grafted_nodes_are_never_substitutions_to_re_draft():
    base = table([[(1, 0.6), (2, 0.3)], [(3, 0.5), (4, 0.4)]])
    bf = best_first(base, 6, graft=Graft([7, 8], [0.0, 0.0]))
    for i, tok in enumerate(bf.tree.tokens):
        if tok in (7, 8):
            assert bf.ranks[i] == -1


def test_config_and_flag():
    with pytest.raises(ConfigError, match="`lookup`"):
        DecodeConfig.of(lookup=-1)
    assert EngineArgs(lookup=7).decode_config().best_first.lookup == 7
    assert EngineArgs().decode_config().best_first.lookup == DecodeConfig().best_first.lookup


def test_the_engine_grafts_repeats_and_learns_their_acceptance(target, drafts):
    """A prompt that repeats itself: the engine grafts lookup paths, some of them win, and the stats count."""
    pair = make_pair(target, drafts["strong"])
    prompt = list(b"abc def abc def abc def abc def abc")
    cfg = DecodeConfig.of(strategy="cure", k=6, v_max=12, max_new_tokens=40, lookup=5)
    engine = Engine(pair, cfg)
    blocks = list(engine.generate(prompt))
    assert [t for b in blocks for t in b.emitted] == generate_ids(pair, cfg.with_(strategy="ar"), prompt)
    stats = engine.policy_for(cfg).lookup
    assert sum(rate.tried[0] for rate in (stats.on_chain, stats.own) if rate.tried) > 0    # depth 1 was tried


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(prompt=st.lists(st.sampled_from(list(b"ab( )=x\n")), min_size=1, max_size=24), k=st.integers(2, 10),
       extra=st.integers(0, 30), lookup=st.integers(1, 12),
       noise=st.sampled_from(["mild", "strong"]), auto=st.booleans(), temperature=st.sampled_from([0.0]))
def test_cure_with_lookup_equals_ar(target, drafts, prompt, k, extra, lookup, noise, auto, temperature):
    """Prompts over a small alphabet so the text repeats and lookups match."""
    pair = make_pair(target, drafts[noise])
    cfg = DecodeConfig.of(strategy="cure", k=k, v_max=k - 1 + extra, lookup=lookup,
                       max_new_tokens=30, auto_budget=auto)
    assert generate_ids(pair, cfg, prompt) == generate_ids(pair, cfg.with_(strategy="ar", auto_budget=False), prompt)


def test_branch_numbers_stay_valid_trace_records():
    """A branch is numbered by its first node (index + 1), also when the drafter adopts a grafted node."""
    base = table([[(1, 0.3), (2, 0.2)], [(3, 0.5), (4, 0.4)], [(5, 0.9), (6, 0.1)]])
    bf = best_first(base, 8, graft=Graft([2, 4, 6], [math.log(0.95)] * 3))     # grafted first, adopted later
    assert all(0 <= b <= i + 1 for i, b in enumerate(bf.tree.branches))


PROMPTS = [list(b"abc def abc def abc def abc"), list(b"x = a(b); y = a(b); z = a("),
           list(b"ab ab ab ab ab ab"), list(b"(x)(y)(x)(y)(x)("), list(b"if a: b\nif a: b\nif a:")]
