"""benchmarks/agreement.py: drafters side by side on shared greedy references, per prompt set."""
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import benchmark_script

from cure_core.tiny import save_tiny_pair

ROOT = Path(__file__).resolve().parent.parent


def _prompts(path: Path) -> Path:
    rows = [{"prompt": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"},
            {"prompt": "class Stack:\n    def __init__(self):\n        self.items = []\n"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_two_drafters_are_measured_on_the_same_references(tmp_path):
    tdir, ddir = save_tiny_pair(tmp_path / "pair")
    _, worse = save_tiny_pair(tmp_path / "noisy", noise=3.0)        # same target, a much noisier drafter
    sets = _prompts(tmp_path / "tiny2.jsonl")
    with benchmark_script("agreement") as mod:
        out = mod.main(["--target", str(tdir), "--drafts", f"{ddir},{worse}", "--drafter", "pard",
                        "--sets", str(sets), "--limit", "2", "--max-new-tokens", "12", "--k", "4",
                        "--threads", "1", "--json", str(tmp_path / "a.json")])
    s = out["sets"][str(sets)]
    assert s["prompts"] == 2 and list(s["drafters"]) == [str(ddir), str(worse)]
    good, bad = s["drafters"][str(ddir)], s["drafters"][str(worse)]
    for ev in (good, bad):
        assert ev["lossless"] and ev["positions"] == good["positions"] > 0      # the same positions for both
        assert all(0.0 <= v <= 1.0 for v in ev["per_position_top1"].values())
        assert ev["per_position_chain"]["2"] <= ev["per_position_top1"]["1"]
        assert ev["tau"]["parallel"] >= 1.0 and ev["tau"]["cure"] >= 1.0
        assert all("reference" not in row for row in ev["per_prompt"])
    # the close copy agrees with its target far more often than the noisy one
    assert good["per_position_top1"]["1"] > bad["per_position_top1"]["1"]
    assert json.loads((tmp_path / "a.json").read_text())["sets"][str(sets)]["prompts"] == 2


def test_a_missing_drafter_is_one_line_and_exit_2(tmp_path):
    tdir, _ = save_tiny_pair(tmp_path / "pair")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "agreement.py"), "--target", str(tdir),
                        "--drafts", str(tmp_path / "nowhere"), "--drafter", "pard", "--limit", "1"],
                       capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]                       # (transformers' load bars come before it)
    assert last.startswith("error: model folder not found") and r.stderr.count("error:") == 1
