"""benchmarks/tuner_lab.py: the modelled clock, the earlier rules it compares against, and a tiny run."""
import pytest

from conftest import benchmark_script
from test_lossless import tuner_block


@pytest.fixture(scope="module")
def lab():
    with benchmark_script("tuner_lab") as mod:
        yield mod


def test_the_clock_models_draft_and_verify_and_is_seeded(lab):
    from cure_core.budget import CostCurve
    curve = CostCurve((0, 8), (100.0, 140.0))
    exact = lab.Clock(10.0, 50.0, seed=None)
    first = exact.time(tuner_block([0], 4, draft_ms=999.0, index=0, drafted=3), curve)
    assert first.timings.draft_ms == pytest.approx(10.0 + 150.0 + exact.catch_up)    # the prompt's catch-up
    assert first.timings.verify_ms == pytest.approx(120.0)
    again = exact.time(tuner_block([0], 4, draft_ms=999.0, index=1, drafted=3), curve)
    assert again.timings.draft_ms == pytest.approx(160.0)
    none = exact.time(tuner_block([], 0, draft_ms=5.0, index=2), curve)             # budget 0: no draft
    assert none.timings.draft_ms == 0.0 and none.timings.verify_ms == pytest.approx(100.0)
    assert exact.ms == pytest.approx(first.timings.draft_ms + 120.0 + 160.0 + 120.0 + 100.0)

    def times(seed):
        c = lab.Clock(10.0, 50.0, seed=seed)
        return [c.time(tuner_block([0], 4, draft_ms=0.0, index=i, drafted=1 + i % 3), curve).timings
                for i in range(20)]
    assert times(3) == times(3) and times(3) != times(4)


def test_the_earlier_rules_are_what_they_say(lab):
    from cure_core.budget import CostCurve, DraftCost
    curve = CostCurve((0, 4), (100.0, 110.0))
    history = [([], 4)] * 3 + [([0, 1], 2)] * 20 + [([0, 1, 2, 3], 4)]
    main, direct = (cls(curve, [0, 1, 2, 4]) for cls in (lab.LabTuner, lab.DirectAccept))
    for t in (main, direct):
        t.clock = lab.Clock(50.0, 0.0, seed=None)
        for accepted, v in history:
            t.observe(tuner_block(accepted, v, draft_ms=0.0), v)
    assert direct.expected_accept(4) == pytest.approx(4 / 4)                 # its own four blocks
    assert main.expected_accept(4) == pytest.approx(42 / 24 + 2 / 4)          # chained
    # a run's first full chain at 1987 ms, the rest on the line 10 + 70 a position
    costs = [DraftCost(15, 15, 1987.0)] + [DraftCost(v, v, 10.0 + 70.0 * v) for v in (1, 1, 2, 2, 4, 4)]
    lsq, ts = (cls(curve, [0, 1, 2, 4, 15], steps=lambda v: min(v, 15)) for cls in (lab.LeastSquaresLine, lab.LabTuner))
    lsq.costs = ts.costs = costs
    assert lsq.cost_line() == pytest.approx((0.0, 3027 / 29))                # negative c0: through 0, by the sums
    assert ts.cost_line() == pytest.approx((10.0, 70.0))


def test_tiny_run_is_deterministic_per_seed(lab, tmp_path):
    out = tmp_path / "lab.json"
    report = lab.main(["--tiny", "--limit", "1", "--max-new-tokens", "8", "--k", "4", "--threads", "1",
                       "--warmup-tokens", "2", "--strategies", "cure", "--rules", "main,both", "--seeds", "5",
                       "--repeat", "2", "--fixed", "2", "--json", str(out)])
    assert "MODELLED" in report["clock"] and out.exists()
    runs = report["runs"]
    assert [(r["rule"], r["seed"]) for r in runs] == [("main", 5), ("main", 5), ("both", 5), ("both", 5)]
    assert all(r["tokens"] == 8 for r in runs)                               # greedy: every rule, the same text
    for a, b in (runs[:2], runs[2:]):                                        # the same seed, the same clock
        assert a["tok_s"] == b["tok_s"] and a["blocks_by_budget"] == b["blocks_by_budget"]
    assert report["fixed"][0]["budget"] == 2 and report["fixed"][0]["tok_s"] > 0
