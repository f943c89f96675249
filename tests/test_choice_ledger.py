"""benchmarks/choice_ledger.py on in-process tiny models: the tallies are the engine's own measurements."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_the_ledger_tallies_every_measured_choice(tmp_path):
    import choice_ledger
    from cure_core import calibration

    out = tmp_path / "ledger.json"
    report = choice_ledger.main(["--tiny", "--limit", "3", "--max-new-tokens", "24", "--k", "6", "--v-max", "8",
                                 "--threads", "1", "--quiet", "--strategy", "cure:lookup=6", "--json", str(out)])
    assert json.loads(out.read_text()) == report and report["_strategy"] == "cure:lookup=6"
    tiny = report["tiny"]
    assert tiny["blocks"] > 0 and tiny["tokens"] == 3 * 24
    assert tiny.get("lookup_measured", 0) > 0                       # the tiny prompts repeat: lookup continuations
    for who in ("lookup", "weight"):
        assert tiny.get(f"{who}_taken", 0) <= tiny.get(f"{who}_measured", 0)
    assert calibration.FlipGains.every == 4 and calibration.FlipGains.observe.__name__ == "observe"   # restored


@pytest.mark.parametrize("bad", [["--strategy", "ddtree"], ["--strategies", "cure"]])
def test_bad_arguments_exit_2_with_one_line(bad):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "choice_ledger.py"), "--tiny", *bad],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
