"""benchmarks/attention.py: one tree forward's time, grouped attention against transformers' sdpa."""
import json

import pytest

from conftest import benchmark_script
from cure_core.tiny import save_tiny_pair


def test_attention_script_times_both_variants_per_cell_and_refuses_bad_lists(tmp_path, capsys):
    target, _ = save_tiny_pair(tmp_path / "pair")
    out = tmp_path / "a.json"
    with benchmark_script("attention") as mod:
        rows = mod.main(["--target", str(target), "--contexts", "20,40", "--nodes", "1,5", "--reps", "2",
                         "--threads", "1", "--json", str(out)])
        for bad_args in (["--target", str(target), "--nodes", "4,x"], ["--target", str(tmp_path / "nope")]):
            with pytest.raises(SystemExit) as bad:
                mod.main(bad_args)
            assert bad.value.code == 2
    assert [(r["context"], r["nodes"]) for r in rows] == [(20, 1), (20, 5), (40, 1), (40, 5)]
    for r in rows:
        assert len(r["grouped_all_ms"]) == len(r["sdpa_all_ms"]) == 2
        assert r["grouped_ms"] > 0 and r["sdpa_ms"] > 0
        assert r["sdpa_over_grouped"] == pytest.approx(r["sdpa_ms"] / r["grouped_ms"])
    assert json.loads(out.read_text())["rows"] == rows
    assert "4 query heads over 2 K/V heads" in capsys.readouterr().out
