"""benchmarks/admission_replay.py: fixed budgets and the admission rule replayed on recorded blocks (tiny models)."""
import pytest

from conftest import benchmark_script, tiny_records


def test_admission_replay_brackets_the_rule_between_its_budget_and_its_cap(tmp_path):
    records = tiny_records(tmp_path / "records.pt", "2,8")
    with benchmark_script("admission_replay") as mod:
        def run(gamma):
            out = mod.main([str(records), "--tiny", "--budget", "2", "--cap", "8", "--draft-ms", "10",
                            "--gamma", str(gamma), "--depths", "7", "--json", str(tmp_path / "a.json")])
            (rep,) = out["runs"]
            return rep
        strict, loose, fitted = run(1e6), run(1e-6), mod.main([str(records), "--tiny", "--budget", "2",
                                                                  "--cap", "8", "--depths", "7"])["runs"][0]
    # a bar no node reaches keeps the budget's tree; a bar every node passes fills the tree to its cap
    assert strict["admission"]["tok_s"] == pytest.approx(strict["fixed"][2]["tok_s"])
    assert strict["admission"]["tree"] <= 2
    assert loose["admission"]["tok_s"] == pytest.approx(loose["fixed"][8]["tok_s"])
    assert 1 / 16 <= fitted["gamma"] <= 2 and fitted["blocks"] > 10
    assert strict["fixed"][2]["accepted"] <= fitted["admission"]["accepted"] <= loose["fixed"][8]["accepted"]
    assert (tmp_path / "a.json").exists()
