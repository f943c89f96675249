"""benchmarks/drafter_sweep.py: tau per tree rule across drafter quality, every output checked equal to ar's."""
import json

import pytest

from conftest import benchmark_script

METHODS = ("chain", "ddtree", "paper", "cure")


def test_fixed_budgets_report_tau_its_error_and_cure_over_the_best(tmp_path, capsys):
    with benchmark_script("drafter_sweep") as mod:
        report = mod.main(["--kinds", "synthetic", "--budgets", "4,8", "--tokens", "12", "--prompts", "2",
                           "--json", str(tmp_path / "s.json")])
    rows = report["rows"]
    assert len(rows) == 6 * 2                                  # 3 taus x 2 confidences, x 2 budgets
    assert [(r["budget"], r["k"]) for r in rows[:2]] == [(4, 5), (8, 9)]
    for r in rows:
        for m in METHODS:
            # 2 prompts x 12 tokens, all equal to ar's; tau at least 1 (the bonus) and at most K
            assert r[m]["tokens"] == 24 and 1.0 <= r[m]["tau"] <= r["k"] and r[m]["tau_se"] >= 0
        assert r["cure_over_best"] == pytest.approx(r["cure"]["tau"] / max(r[m]["tau"] for m in METHODS[:3]))
        assert "ar_tok_s" not in r
    assert json.loads((tmp_path / "s.json").read_text())["rows"][0]["drafter"] == rows[0]["drafter"]
    assert "cure/best" in capsys.readouterr().out


def test_auto_runs_k16_with_ar_as_the_reference():
    with benchmark_script("drafter_sweep") as mod:
        report = mod.main(["--kinds", "synthetic", "--auto", "--tokens", "8", "--prompts", "1", "--only", "chain,cure"])
    for r in report["rows"]:
        assert r["budget"] == "auto" and r["k"] == 16 and r["ar_tok_s"] > 0
        assert set(r) >= {"chain", "cure", "cure_tok_s_over_best"} and "ddtree" not in r


@pytest.mark.parametrize("argv, message", [
    (["--real", "qwen-coder-0.5b", "--auto"], "--real runs its own pairs"),
    (["--target", "qwen-coder-0.5b"], "--target runs the SYNTHETIC drafters only"),
    (["--prompts", "0"], "--prompts must lie in"),
])
def test_bad_flags_are_one_line(argv, message, capsys):
    with benchmark_script("drafter_sweep") as mod, pytest.raises(SystemExit) as e:
        mod.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
