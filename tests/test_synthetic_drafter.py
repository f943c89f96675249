"""The SYNTHETIC benchmark drafter (benchmarks/synthetic_drafter.py): lossless under every strategy, its chains
accept what its profile says, its probabilities are calibrated (so a best-first tree beats the chain in
expectation), and its proposals depend on the position alone."""
import math
import statistics

import pytest
import torch

from conftest import benchmark_script
from cure_core.config import DecodeConfig
from cure_core.engine import Engine, ModelPair, generate_ids
from cure_core.models import build_pair
from cure_core.tiny import BYTE_VOCAB, MASK_ID, perturbed_copy, tiny_target

PROMPTS = [list(b"def f(x):\n    return"), list(b"hello world"), list(b"SELECT * FROM t WHERE"), list(b"x = [1, 2,")]


@pytest.fixture(scope="module")
def syn():
    with benchmark_script("synthetic_drafter") as mod:
        yield mod


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return tiny_target(seed=0)


def make(syn, target, tau=6.5, k=16, inner=None, **profile):
    drafter = syn.SyntheticDrafter(syn.Profile(syn.profile_for_tau(tau, k), **profile), BYTE_VOCAB, k,
                                   inner=inner, mask_token_id=MASK_ID)
    return drafter, ModelPair(target=target, drafter=drafter)


def emitted(pair, prompt, cfg):
    return [len(b.emitted) for b in Engine(pair).generate(prompt, cfg)]


def test_profile_for_tau_inverts_expected_tau(syn):
    for tau, k in [(6.5, 16), (3.0, 8), (1.0, 4), (8.0, 8)]:
        rates = syn.profile_for_tau(tau, k)
        assert math.isclose(syn.expected_tau(rates, k), tau, abs_tol=1e-6)
    assert math.isclose(syn.expected_tau((0.5,), 3), 1 + 0.5 + 0.25)
    assert math.isclose(syn.expected_tau((1.0, 0.5), 4), 1 + 1 + 0.5 + 0.25)      # the last rate repeats
    with pytest.raises(ValueError):
        syn.profile_for_tau(17, 16)


@pytest.mark.parametrize("strategy,extra", [("parallel", {}), ("ddtree", dict(v_max=32)), ("cure", dict(v_max=32)),
                                            ("cure", dict(v_max=24, cure_tree="paper", tau_margin=3.0)),
                                            ("cure", dict(v_max=32, auto_budget=True))])
def test_every_strategy_emits_the_targets_output(syn, target, strategy, extra):
    drafter, pair = make(syn, target, below_miss=0.5)
    base = dict(max_new_tokens=48, stop_at_eos=False, k=16)
    for prompt in PROMPTS[:3]:
        ref = generate_ids(pair, DecodeConfig.of(strategy="ar", **base), prompt)
        drafter.expect(prompt + ref)
        assert generate_ids(pair, DecodeConfig.of(strategy=strategy, **base, **extra), prompt) == ref


def test_lossless_beside_a_real_drafter_run_for_its_cost(syn, target):
    """inner: the PARD drafter runs every call (its forwards and cache), its proposals discarded."""
    inner = build_pair(target, perturbed_copy(target, 0.3, seed=1), drafter="pard", mask_token_id=MASK_ID,
                       vocab_size=BYTE_VOCAB)[0].drafter
    calls = []
    propose = inner.propose
    inner.propose = lambda *a, **kw: calls.append(a) or propose(*a, **kw)
    drafter, pair = make(syn, target, inner=inner)
    assert drafter.name == "synthetic(pard)"
    base = dict(max_new_tokens=40, stop_at_eos=False, k=16)
    prompt = PROMPTS[0]
    ref = generate_ids(pair, DecodeConfig.of(strategy="ar", **base), prompt)
    drafter.expect(prompt + ref)
    sizes = emitted(pair, prompt, DecodeConfig.of(strategy="cure", v_max=32, **base))
    assert len(calls) == len(sizes) and sum(sizes) == len(ref)
    assert statistics.mean(sizes) > 2                  # the synthetic rows, not the random PARD drafter's
    assert drafter.seconds > 0


def test_chains_accept_what_the_profile_says_and_trees_more(syn, target):
    """Over ~300 blocks a chain's tau is the profile's expected tau (sd of a block's length ~3, so the
    mean's is ~0.2), and a calibrated best-first tree of 32 nodes accepts more than the 15-node chain it
    could have been (the best tree by expected acceptance holds at least the chain's)."""
    k, tau = 8, 3.0
    drafter, pair = make(syn, target, tau=tau, k=k)
    base = dict(max_new_tokens=240, stop_at_eos=False, k=k)
    chain, tree = [], []
    for prompt in PROMPTS:
        ref = generate_ids(pair, DecodeConfig.of(strategy="ar", **base), prompt)
        drafter.expect(prompt + ref)
        chain += emitted(pair, prompt, DecodeConfig.of(strategy="parallel", **base))[:-1]   # the last is clipped
        tree += emitted(pair, prompt, DecodeConfig.of(strategy="ddtree", v_max=32, **base))[:-1]
    assert len(chain) > 250
    assert abs(statistics.mean(chain) - tau) < 0.35
    assert statistics.mean(tree) > statistics.mean(chain) + 0.3


def test_proposals_depend_on_the_position_and_off_the_output_hold_no_truth(syn):
    """Same position, same proposal; under a prefix that left the target's output (or a history that did),
    the target's tokens are unknown and appear nowhere (a 50k vocabulary: no chance hits)."""
    drafter = syn.SyntheticDrafter(syn.Profile((0.99,), concentration=50.0), 50_000, 8, mask_token_id=7)
    ref = list(range(1000, 1060))
    drafter.expect(ref)
    drafter.reset(ref[:20], None)
    a = drafter.propose(ref[20], 7, 8)
    drafter.reset(ref[:20], None)
    b = drafter.propose(ref[20], 7, 8)
    assert torch.equal(a.top_ids, b.top_ids) and torch.equal(a.top_logprobs, b.top_logprobs)
    assert a.top_ids.shape == (7, 8) and a.tokens == a.top_ids[:, 0].tolist()
    assert (a.top_logprobs[:, :-1] >= a.top_logprobs[:, 1:]).all()                  # best first
    assert all(len(set(row)) == 8 for row in a.top_ids.tolist()) and 7 not in a.top_ids
    assert sum(t == row[0] for t, row in zip(ref[21:28], a.top_ids.tolist())) >= 6   # rate 0.99
    on, off = drafter.redraft_topk([ref[21:23], [ref[21], 5]], [4, 4], 8)
    assert sum(t == row[0] for t, row in zip(ref[23:27], on.top_ids.tolist())) >= 3
    assert not set(ref[23:27]) & set(off.top_ids.flatten().tolist())
    drafter.reset(ref[:19] + [5], None)                                              # the history left it
    lost = drafter.propose(ref[20], 7, 8)
    assert not set(ref[21:28]) & set(lost.top_ids.flatten().tolist())


def test_rates_and_widths_are_checked(syn):
    with pytest.raises(ValueError):
        syn.SyntheticDrafter(syn.Profile((1.5,)), BYTE_VOCAB, 8)
    d = syn.SyntheticDrafter(syn.Profile((0.5,)), 40, 8)
    d.expect(list(range(30)))
    d.reset(list(range(10)), None)
    with pytest.raises(ValueError, match="vocabulary"):
        d.propose(10, 4, 64)
