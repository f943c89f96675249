"""Best-first cure's node calibration (calibration.py): the fit, the weighted heap, the engine's use of both."""
import math
import random

import pytest

from cure_core.calibration import FlipGains, NodeCalibration
from cure_core.config import DecodeConfig
from cure_core.engine import Engine
from cure_core.strategies import Table, best_first

from conftest import make_pair


def feed(cal: NodeCalibration, blocks: int, g_top1: float, g_lower: float, seed: int = 0) -> int:
    """Blocks of two root children (a top-1 and a lower candidate) and a lower candidate under the second,
    each accepted with probability q^gamma of its kind once its parent is; a node under a rejected parent
    is accepted here all the same, and a grafted node always: neither may teach anything. Returns the nodes
    a fit should have seen."""
    rng = random.Random(seed)
    tried = 0
    for _ in range(blocks):
        q1, q2, q3 = rng.uniform(0.05, 0.95), rng.uniform(0.02, 0.6), rng.uniform(0.02, 0.6)
        hit1, hit2 = rng.random() < q1 ** g_top1, rng.random() < q2 ** g_lower
        hit3 = rng.random() < q3 ** g_lower if hit2 else True           # untried: must not count
        accepted = {i for i, h in ((0, hit1), (1, hit2), (2, hit3), (3, True)) if h}
        cal.observe([0, 1, 1, -1], [math.log(q1), math.log(q2), math.log(q3), math.log(0.5)], [-1, -1, 1, -1],
                    accepted)
        tried += 2 + hit2
    return tried


def test_the_weight_stays_1_until_both_kinds_have_their_samples():
    cal = NodeCalibration(min_samples=64, refit_every=1)
    feed(cal, 63, 2.0, 1.0)
    assert cal.weight() == 1.0 and cal.gammas is None
    feed(cal, 1, 2.0, 1.0)
    assert cal.gammas is not None and cal.weight() != 1.0


@pytest.mark.parametrize("g_top1,g_lower", [(2.0, 1.0), (1.0, 1.0), (0.8, 1.6)])
def test_the_fit_recovers_each_kinds_calibration(g_top1, g_lower):
    """Acceptance q^2 for top-1 candidates and q^1 for lower ones: a lower candidate's log-prob weighs about
    half a top-1's. Nodes whose parent was rejected, and grafted nodes, are not samples."""
    cal = NodeCalibration(window=20000, min_samples=64, refit_every=1000)
    tried = feed(cal, 4000, g_top1, g_lower)
    top1, lower = cal.gammas
    assert top1 == pytest.approx(g_top1, rel=0.12) and lower == pytest.approx(g_lower, rel=0.12)
    assert cal.weight() == pytest.approx(g_lower / g_top1, rel=0.2)
    assert len(cal.seen[0]) + len(cal.seen[1]) == tried


def test_the_weight_is_clamped():
    cal = NodeCalibration(min_samples=8, refit_every=400, lo=0.5, hi=2.0)
    feed(cal, 400, 4.0, 0.25)
    assert cal.weight() == 0.5


def test_a_choice_is_withheld_where_it_loses_and_back_where_it_wins():
    """FlipGains, the gate of the lookup graft and the node weight: a choice is taken until 8 blocks at a budget
    measured it, then while their mean gain is >= 0; a gain is measured against the tree with it flipped, in
    either direction, and censored at +-1 where the flipped tree holds the whole greedy path."""
    f = FlipGains()
    assert f.allows(4)                                   # nothing measured: taken
    for _ in range(7):
        f.observe(16, used=True, accepted=1, alt_held=2)
    assert f.allows(4)                                   # 7 gains in the pool: not yet a decision
    f.gains.clear()
    for _ in range(7):
        f.observe(4, used=True, accepted=1, alt_held=2)  # the tree without it held one more
    assert f.gains[4][-1] == -1 and f.allows(4)          # 7 < min_samples: still taken
    f.observe(4, used=True, accepted=1, alt_held=2)
    assert not f.allows(4) and not f.allows(8)           # withheld at 4, and at 8, which has no gains: the pool's
    for _ in range(8):
        f.observe(8, used=False, accepted=1, alt_held=1)
    assert f.allows(8) and not f.allows(4)               # 8 measured its own (gain 0): each budget is its own
    for _ in range(8):                                   # withheld blocks keep measuring: the flipped tree
        f.observe(4, used=False, accepted=0, alt_held=1)  # (with it) would have accepted more
    assert list(f.gains[4])[-8:] == [1] * 8 and f.allows(4)        # mean 0 over the 16: taken again
    f.observe(9, used=True, accepted=3, alt_held=1)      # exact where the flipped tree holds fewer
    f.observe(9, used=False, accepted=3, alt_held=1)
    assert list(f.gains[9]) == [2, -2]
    for _ in range(40):
        f.observe(2, used=True, accepted=0, alt_held=0)
    assert len(f.gains[2]) == f.window and f.allows(2)   # a window; a choice that changes nothing stays


def test_a_full_window_is_measured_on_every_few_blocks():
    f = FlipGains(window=4, every=3)
    asked = []
    for _ in range(13):
        m = f.measures(5)
        asked.append(m)
        if m:
            f.observe(5, used=True, accepted=1, alt_held=1)
    assert asked[:4] == [True] * 4                       # until the window is full: every block
    assert asked[4:] == [(n % 3 == 0) for n in range(5, 14)]   # then every 3rd block asked at that budget
    assert f.measures(6)                                 # per budget


def test_node_calibration_gates_its_fitted_weight_with_a_flip_gains():
    """NodeCalibration owns a FlipGains: the fit is withheld where it lost."""
    cal = NodeCalibration()
    for _ in range(8):
        cal.flips.observe(4, used=True, accepted=1, alt_held=2)
    assert not cal.flips.allows(4)


def test_a_lower_weight_spends_the_budget_on_substitutions():
    """Top-1 chain 0.6 x 0.6 and a sibling at depth 1 of 0.3: on draft log-probs the chain's second node wins
    (0.36 > 0.3); with lower candidates weighted 0.5 (0.3^0.5 = 0.55) the sibling does. Weight 1 is the
    reference tree, and every node carries its rank and own log-prob."""
    lp = [[math.log(0.6), math.log(0.3)], [math.log(0.6), math.log(0.2)]]
    base = Table([[1, 2], [3, 4]], lp)
    ref = best_first(base, 2)
    assert ref.tree.tokens == [1, 3] and ref.ranks == [0, 0]
    got = best_first(base, 2, weight=0.5)
    assert got.tree.tokens == [1, 2] and got.ranks == [0, 1] and got.tree.depths == [1, 1]
    assert got.logq == pytest.approx([math.log(0.6), math.log(0.3)])
    assert got.scores[1] == pytest.approx(0.5 * math.log(0.3))


def test_engine_learns_the_weight_at_t0_and_stays_lossless(target, drafts):
    """Best-first cure with calibration on (the default) learns from its T=0 blocks and decodes with the
    weight it fitted, and every output equals ar's; T>0 teaches nothing; ddtree and `calibrate=False` have no
    calibration."""
    pair = make_pair(target, drafts["strong"])
    prompts = [list(f"def f{i}(x):\n    return x * {i} + ".encode()) for i in range(4)]
    conf = dict(k=6, max_new_tokens=40, v_max=8)
    engine = Engine(pair)
    cal = NodeCalibration(min_samples=16, refit_every=1)
    cfg = DecodeConfig(strategy="cure", **conf)
    engine._calibrations[engine.tuner_key(cfg)] = cal
    for p in prompts:
        ref = [t for b in Engine(pair).generate(p, DecodeConfig(strategy="ar", **conf)) for t in b.emitted]
        out = [t for b in engine.generate(p, cfg) for t in b.emitted]
        assert out == ref
    assert cal.blocks > 0 and cal.gammas is not None and cal.weight() != 1.0
    assert sum(len(g) for g in cal.flips.gains.values()) > 0                  # the tree with the other weight measured it
    hot = cfg.with_(temperature=0.8, seed=3)                 # T>0: uses the weight, learns nothing
    seen = cal.blocks
    list(engine.generate(prompts[0], hot))
    assert cal.blocks == seen
    for off in (cfg.with_(calibrate=False), DecodeConfig(strategy="ddtree", **conf)):
        list(engine.generate(prompts[0], off))
    assert list(engine._calibrations) == [engine.tuner_key(cfg)]          # ddtree and calibrate=False: none


def test_what_cure_learns_from_a_block_is_timed_in_its_commit_phase(target, drafts, monkeypatch):
    """The node calibration's learning is cure's own host work: a block's commit phase covers it (so decode
    time, the rates bench and peers report, does too). Control: with calibrate=False nothing sleeps there."""
    import time

    slept = []
    observe = NodeCalibration.observe

    def slow(self, *args):
        slept.append(1)
        time.sleep(0.03)
        return observe(self, *args)
    monkeypatch.setattr(NodeCalibration, "observe", slow)
    pair = make_pair(target, drafts["mild"])
    cfg = DecodeConfig(strategy="cure", k=6, v_max=5, max_new_tokens=12)
    blocks = list(Engine(pair).generate(list(b"def f(x):\n    "), cfg))
    trees = [b for b in blocks if b.nodes]                  # a block with no tree (no room left) learns nothing
    assert len(trees) >= 3 and len(slept) == len(trees) and all(b.timings.commit_ms >= 30.0 for b in trees)
    off = list(Engine(pair).generate(list(b"def f(x):\n    "), cfg.with_(calibrate=False)))
    assert len(slept) == len(trees) and all(b.timings.commit_ms < 30.0 for b in off)


def test_the_fit_over_misses_only_is_the_written_out_likelihood_maximum():
    """budget.fit_power computes the hits' term without a transcendental and the misses' alone; the grid point
    it returns is the argmax of the full likelihood written out: sum of hit x log P + miss x log(1 - P)."""
    import numpy as np
    from cure_core.budget import fit_calibration, fit_power
    rng = np.random.default_rng(3)
    for hi in (2.0, 4.0):
        grid = np.exp(np.linspace(math.log(1 / 16), math.log(hi), 49))
        for _ in range(50):
            n = int(rng.integers(1, 400))
            logp = -rng.exponential(1.0, n) * (rng.random(n) < 0.9)          # some exact zeros (p = 1)
            hit = rng.random(n) < np.exp(0.7 * logp)
            ll = [sum(math.log(min(math.exp(g * lp), 1 - 1e-12)) if h else math.log(max(1 - math.exp(min(g * lp, -1e-9)),
                                                                                        1e-300))
                      for lp, h in zip(logp, hit)) for g in grid]
            assert fit_power(logp, hit, hi) == pytest.approx(float(grid[int(np.argmax(ll))]))
    # fit_calibration flattens chains into the same points: depth d of a chain accepted to depth a is a hit iff d < a
    chains = [([-0.1, -0.5, -2.0], 2), ([-0.2, -0.3], 0), ([-0.05], 1)]
    logp = np.array([-0.1, -0.5, -2.0, -0.2, -0.3, -0.05])
    hit = np.array([True, True, False, False, False, True])
    assert fit_calibration(chains) == fit_power(logp, hit)
