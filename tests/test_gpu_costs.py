"""Smoke run of benchmarks/gpu_costs.py at the tiny shape on the CPU (the real run wants a GPU)."""
import pytest

from conftest import benchmark_script

# every e2e run's label (benchmarks/gpu_costs.py E2E_RUNS)
GPU_E2E_LABELS = ["ar", "parallel", "ddtree-v32", "ddtree-v64", "cure-v32", "cure-v64", "cure-auto", "cure-paper-v64"]


def run_script(argv):
    with benchmark_script("gpu_costs") as mod:
        return mod.main(argv)


def test_tiny_shape_smoke(tmp_path):
    rep = run_script(["--shape", "tiny", "--device", "cpu", "--sizes", "1,4,16", "--reps", "2", "--blocks", "4",
                      "--lossless", "2", "--e2e-prompts", "1", "--e2e-tokens", "48", "--e2e-prompt-len", "24",
                      "--out", str(tmp_path / "costs.json")])
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
    # e2e over the SYNTHETIC drafter: every run equal to ar, labelled as synthetic, trees accepting deeply
    e2e = rep["e2e_synthetic"]
    assert "SYNTHETIC" in e2e["label"] and abs(e2e["profile"]["expected_chain_tau"] - 6.5) < 1e-6
    runs = {r["label"]: r for r in e2e["runs"]}
    assert list(runs) == GPU_E2E_LABELS
    for r in runs.values():
        assert r["prompts"] == 1 and r["equal_ar"] == 1 and r["compiled"] is False
        assert r["blocks"] > 0 and r["tok_s"] > 0 and r["overhead_ms_median"] < r["block_ms_mean"]
    assert runs["ar"]["tau"] == 1 and runs["ar"]["speedup_vs_ar"] == 1
    assert all(runs[x]["tau"] > 3 for x in ("parallel", "ddtree-v64", "cure-v64"))
    assert runs["cure-auto"]["v_max"] == "auto" and runs["cure-paper-v64"]["cure_tree"] == "paper"


def test_stages_past_the_deadline_are_skipped_and_recorded(tmp_path):
    rep = run_script(["--shape", "tiny", "--device", "cpu", "--sizes", "1,4", "--reps", "1", "--blocks", "2",
                      "--deadline", "0", "--out", str(tmp_path / "costs.json")])
    assert rep["cost_ms"] == {} and rep["overhead"] == []
    assert rep["skipped"][:3] == ["cost_dynamic", "cost_static", "tuner_curve"]
    assert rep["skipped"][-1] == "e2e_eager" and "e2e_synthetic" not in rep


def test_e2e_runs_a_chosen_subset_and_refuses_unknown_ones(tmp_path, capsys):
    rep = run_script(["--shape", "tiny", "--device", "cpu", "--stages", "e2e", "--e2e-runs", "cure-v32",
                      "--e2e-prompts", "1", "--e2e-tokens", "32", "--e2e-prompt-len", "16", "--synthetic-tau", "3"])
    assert [r["label"] for r in rep["e2e_synthetic"]["runs"]] == ["ar", "cure-v32"]     # ar: the reference
    assert rep["cost_ms"] == {} and rep["overhead"] == []
    for bad in (["--e2e-runs", "nope"], ["--synthetic-tau", "40"], ["--synthetic-rates", "0.5,1.5"]):
        with pytest.raises(SystemExit) as e:
            run_script(["--shape", "tiny", "--device", "cpu", "--stages", "e2e", *bad])
        assert e.value.code == 2
    assert "synthetic drafter" in capsys.readouterr().err


def test_the_compiled_forward_is_profiled_by_op(tmp_path):
    """--profile-sizes: torch.profiler over the compiled verify forward (inductor on this CPU), its top ops by time."""
    rep = run_script(["--shape", "tiny", "--device", "cpu", "--stages", "", "--compile", "--compile-sizes", "1,4",
                      "--profile-sizes", "4", "--reps", "1"])
    assert not rep["errors"] and list(rep["cost_ms"]) == ["compiled"] and list(rep["cost_ms"]["compiled"]) == [1, 4]
    (prof,) = rep["profile_compiled"]
    assert prof["v"] == 4 and prof["clock"] == "cpu" and prof["wall_ms_profiled"] > 0 and prof["layout"]["compile"]
    assert len(prof["top"]) > 3 and all(r["ms_per_forward"] >= 0 and r["calls_per_forward"] > 0 for r in prof["top"])
    assert prof["top"][0]["ms_per_forward"] >= prof["top"][-1]["ms_per_forward"]


def test_sync_sites_are_counted_by_the_line_that_waited():
    """count_syncs keeps the warnings CUDA's sync debug mode raises (here raised by hand: this CPU has no CUDA),
    by file and line, and nothing else."""
    import warnings
    with benchmark_script("gpu_costs") as mod:
        def fn():
            for _ in range(3):
                warnings.warn("called a synchronizing CUDA operation")
            warnings.warn("something else")
            return 7
        out, sites = mod.count_syncs(fn)
    assert out == 7 and list(sites.values()) == [3] and list(sites)[0].startswith("test_gpu_costs.py:")
