"""benchmarks/prefill.py: a prefill with the head over one row against over every row, interleaved."""
import json

from conftest import benchmark_script


def test_prefill_script_times_both_ways_at_each_length(tmp_path, capsys):
    out = tmp_path / "p.json"
    with benchmark_script("prefill") as mod:
        res = mod.main(["--tiny", "--lengths", "16,48", "--reps", "2", "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == res and res["target"] == "tiny" and res["reps"] == 2
    assert list(res["lengths"]) == ["16", "48"]
    for row in res["lengths"].values():
        assert row["every_row_ms"] > 0 and row["one_row_ms"] > 0
        assert abs(row["saved"] - (1 - row["one_row_ms"] / row["every_row_ms"])) < 0.01
    assert "head over every row" in capsys.readouterr().out
