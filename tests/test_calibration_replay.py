"""benchmarks/calibration_replay.py: ddtree, the online calibration and a fitted weight replayed on recorded blocks."""
import json

import pytest

from conftest import benchmark_script, tiny_records


def test_calibration_replay_compares_ddtree_with_the_calibrated_trees(tmp_path):
    records = tiny_records(tmp_path / "records.pt", "4")
    with benchmark_script("calibration_replay") as mod:
        out = mod.main(["--records", str(records), "--fit", str(records), "--budgets", "1,4",
                        "--json", str(tmp_path / "c.json")])
        bf = mod.block_tree(mod.load_records(str(records))[0], 4, 1.0)
    one, four = out["rows"]
    # one node: the top-1 at depth 1 whatever the weight; the replayed ddtree is the engine's rule at weight 1
    assert one["ddtree"] == one["online"] == one["fitted"]
    assert len(bf.tree) <= 4 and all(r >= 0 for r in bf.ranks)
    assert 0.25 <= four["online_weight"] <= 4 and 0.25 <= four["fitted_weight"] <= 4
    assert four["per_set"]["tiny"]["blocks"] == out["blocks"] > 5
    assert json.loads((tmp_path / "c.json").read_text())["rows"][1]["ddtree"] == pytest.approx(four["ddtree"])


def test_calibration_replay_rejects_bad_budgets(tmp_path, capsys):
    with benchmark_script("calibration_replay") as mod:
        with pytest.raises(SystemExit) as e:
            mod.main(["--records", str(tmp_path / "none.pt"), "--budgets", "4,x"])
    assert e.value.code == 2 and "--budgets" in capsys.readouterr().err
