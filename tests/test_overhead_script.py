"""benchmarks/overhead.py: host overhead per block, over a block-parallel or an autoregressive drafter."""
import json

from conftest import benchmark_script


def test_overhead_runs_each_strategy_at_each_budget_for_both_drafter_kinds(tmp_path, capsys):
    with benchmark_script("overhead") as mod:
        pard = mod.main(["--blocks", "3", "--budgets", "16", "--threads", "1"])
        ar = mod.main(["--blocks", "3", "--budgets", "16", "--drafter", "ar", "--json", str(tmp_path / "ar.json")])
    name = lambda r: (r["strategy"], r["v_max"], r.get("cure_tree"), r.get("acceptance", True))   # noqa: E731
    # over PARD, best-first also without the acceptance model: its host cost is the difference
    assert [name(r) for r in pard] == [("parallel", 15, None, True), ("ddtree", 16, None, True),
                                       ("cure", 16, "best-first", True), ("cure", 16, "best-first", False),
                                       ("cure", 16, "paper", True)]
    assert [name(r) for r in ar] == [("sd", 15, None, True), ("ddtree", 16, None, True),
                                     ("cure", 16, "best-first", True)]
    for r in pard + ar:
        # whole generations until 3 blocks; host time = the block minus its model forwards: > 0, < the block
        assert r["blocks"] >= 3 and 0 < r["overhead_ms_median"] < r["block_ms_median"]
        assert 1 <= r["mean_V"] <= r["max_V"] <= r["v_max"]
        # the parts it names are host time too: each >= 0 and together below the block's mean
        assert 0 <= r["draft_host_ms_mean"] and 0 < r["tree_ms_mean"]
        assert r["draft_host_ms_mean"] + r["tree_ms_mean"] < r["overhead_ms_mean"]
    saved = json.loads((tmp_path / "ar.json").read_text())
    assert saved["drafter"] == "ar" and saved["auto_budget"] is False and saved["rows"] == ar
    # the goal's figure, paired within rounds: one per cure config, against ddtree at its budget
    (d,) = saved["paired_cure_minus_ddtree"]
    assert d["v_max"] == 16 and d["cure_tree"] == "best-first" and d["rounds"] >= 1
    assert d["ci95_ms"][0] <= d["mean_ms"] <= d["ci95_ms"][1] or d["rounds"] == 1
    assert "drafter: ar; budgets: fixed" in capsys.readouterr().out


def test_paired_differences_cancel_a_drift_shared_by_a_round():
    with benchmark_script("overhead") as mod:
        # the box slows down round by round; config 1 always costs 0.5 ms more than config 0
        rounds = [[10.0 * k, 10.0 * k + 0.5] for k in range(1, 6)] + [[float("nan"), 3.0]]
        d = mod.paired(rounds, 1, 0)
    assert d["rounds"] == 5                                   # a round where one config made no block is left out
    assert d["median_ms"] == d["mean_ms"] == 0.5 and d["ci95_ms"] == [0.5, 0.5]


def test_overhead_over_the_synthetic_drafter_accepts_deep_trees(tmp_path):
    """--drafter synthetic: the tiny random PARD drafter runs for its cost, the synthetic rows are what the
    trees hold, so blocks accept many tokens (the tiny random drafts alone accept ~1 a block)."""
    with benchmark_script("overhead") as mod:
        rows = mod.main(["--blocks", "8", "--budgets", "32", "--drafter", "synthetic", "--json", str(tmp_path / "s.json")])
    assert [(r["strategy"], r.get("cure_tree")) for r in rows] == [
        ("parallel", None), ("ddtree", None), ("cure", "best-first"), ("cure", "best-first"), ("cure", "paper")]
    for r in rows:
        assert r["tau"] > 3 and 0 < r["overhead_ms_median"] < r["block_ms_median"]
    assert "SYNTHETIC" in json.loads((tmp_path / "s.json").read_text())["drafter"]
