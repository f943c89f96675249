"""Smoke run of benchmarks/gpu_costs.py at the tiny shape on the CPU (the real run wants a GPU)."""
import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_costs.py"


def test_tiny_shape_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("cure_bench_gpu_costs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        rep = mod.main(["--shape", "tiny", "--device", "cpu", "--sizes", "1,4,16", "--reps", "2", "--blocks", "4",
                        "--out", str(tmp_path / "costs.json")])
    finally:
        sys.modules.pop(spec.name, None)
    assert set(rep["cost_ms"]) == {"dynamic", "static"}
    assert all(len(v) == 3 and min(v) > 0 for v in rep["cost_ms"].values())
    assert [r["strategy"] for r in rep["overhead"]] == ["parallel", "cure", "cure", "ddtree", "ddtree"]
    for r in rep["overhead"]:
        assert r["blocks"] == 4 and r["block_ms_median"] > 0 and r["mean_V"] <= r["v_max"]
    assert (tmp_path / "costs.json").exists()
