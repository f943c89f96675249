"""Smoke run of benchmarks/gpu_costs.py at the tiny shape on the CPU (the real run wants a GPU)."""
from conftest import benchmark_script


def run_script(argv):
    with benchmark_script("gpu_costs") as mod:
        return mod.main(argv)


def test_tiny_shape_smoke(tmp_path):
    rep = run_script(["--shape", "tiny", "--device", "cpu", "--sizes", "1,4,16", "--reps", "2", "--blocks", "4",
                      "--lossless", "2", "--out", str(tmp_path / "costs.json")])
    assert not rep["errors"] and not rep["skipped"]
    assert set(rep["cost_ms"]) == {"dynamic", "static"}
    assert all(list(v) == [1, 4, 16] and min(v.values()) > 0 for v in rep["cost_ms"].values())
    assert rep["tuner_curve"]["sizes"][0] == 0
    assert [(r["drafter"], r["strategy"]) for r in rep["overhead"]] == [
        ("pard", "parallel"), ("pard", "cure"), ("pard", "cure"), ("pard", "ddtree"), ("pard", "ddtree"),
        ("dflash", "parallel"), ("dflash", "cure"), ("dflash", "ddtree"), ("dflash", "cure")]
    for r in rep["overhead"]:
        assert r["blocks"] == 4 and r["block_ms_median"] > 0 and len(r["tree_sizes"]) == 4
        assert r["v_max"] == "auto" or r["mean_V"] <= r["v_max"]
    # The lossless stage ran every configuration with both drafters, and every run equalled ar.
    loss = rep["lossless"]
    assert {r["drafter"] for r in loss["runs"]} == {"pard", "dflash"}
    assert loss["equal"] == loss["total"] > 40 and not any(r["mismatched"] or r["error"] for r in loss["runs"])
    assert (tmp_path / "costs.json").exists()


def test_stages_past_the_deadline_are_skipped_and_recorded(tmp_path):
    rep = run_script(["--shape", "tiny", "--device", "cpu", "--sizes", "1,4", "--reps", "1", "--blocks", "2",
                      "--deadline", "0", "--out", str(tmp_path / "costs.json")])
    assert rep["cost_ms"] == {} and rep["overhead"] == []
    assert rep["skipped"][:3] == ["cost_dynamic", "cost_static", "tuner_curve"]
