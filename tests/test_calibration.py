"""Best-first cure's node calibration (calibration.py): the fit, the weighted heap, the engine's use of both."""
import math
import random

import pytest

from cure_core.calibration import NodeCalibration
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


def test_the_fit_is_withheld_at_a_budget_where_it_loses():
    """Like the lookup graft: used until 8 blocks at a budget measured it, then while their mean gain is >= 0;
    a gain is measured against the tree with the weight flipped, in either direction."""
    cal = NodeCalibration()
    for _ in range(7):
        cal.observe_gain(4, used=True, accepted=1, alt_held=2)          # the tree at weight 1 did one better
    assert cal.uses(4)
    cal.observe_gain(4, used=True, accepted=1, alt_held=2)
    assert not cal.uses(4) and cal.uses(8)                              # per budget
    for _ in range(9):
        cal.observe_gain(4, used=False, accepted=1, alt_held=2)         # withheld, the fit would have won one
    assert cal.uses(4) and list(cal.gains[4])[-1] == 1


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
    assert sum(len(g) for g in cal.gains.values()) > 0                  # the tree with the other weight measured it
    hot = cfg.with_(temperature=0.8, seed=3)                 # T>0: uses the weight, learns nothing
    seen = cal.blocks
    list(engine.generate(prompts[0], hot))
    assert cal.blocks == seen
    for off in (cfg.with_(calibrate=False), DecodeConfig(strategy="ddtree", **conf)):
        list(engine.generate(prompts[0], off))
    assert list(engine._calibrations) == [engine.tuner_key(cfg)]          # ddtree and calibrate=False: none
