"""Smoke test of benchmarks/peers.py on in-process tiny models: JSON schema and lossless outputs."""
import json

import pytest

from conftest import benchmark_script


@pytest.fixture(scope="module")
def peers():
    with benchmark_script("peers") as mod:
        yield mod


@pytest.fixture(scope="module")
def report(peers, tmp_path_factory):
    out = tmp_path_factory.mktemp("peers") / "peers.json"
    ret = peers.main(["--tiny", "--limit", "2", "--max-new-tokens", "6", "--k", "4", "--threads", "1",
                      "--warmup-tokens", "2", "--quiet", "--trace-tuner", "--json", str(out)])
    on_disk = json.loads(out.read_text())
    assert on_disk == json.loads(json.dumps(ret))          # what main returns is what it wrote
    return on_disk


HF = ["hf_generate", "hf_assisted", "hf_prompt_lookup"]
CURE = ["cure_ar", "cure_sd", "cure_parallel", "cure_cure", "cure_ddtree"]


def test_schema(report):
    assert report["schema"] == "cure.peers/1"
    for key in ("environment", "config", "models", "timing", "methods", "skipped", "notes", "summary", "results"):
        assert key in report, key
    env = report["environment"]
    for key in ("python", "torch", "transformers", "cpu_count", "torch_threads", "threads_reason", "device", "dtype",
                "cpu_model", "bf16_kernels", "int8_kernels"):
        assert key in env, key
    assert env["torch_threads"] == 1 and env["device"] == "cpu"
    assert report["config"]["tiny"] is True and report["config"]["max_new_tokens"] == 6
    assert [m["name"] for m in report["methods"]] == HF + CURE and report["skipped"] == []
    assert list(report["summary"]) == HF + CURE
    for name, s in report["summary"].items():
        for key in ("tokens_per_s", "tpot_ms", "prefill_ms_mean", "tau", "decode_tokens", "speedup_vs_cure_ar",
                    "speedup_vs_hf_generate", "matches_hf_greedy", "all_match_hf_greedy"):
            assert key in s, (name, key)
        assert s["prompts"] == 2 and s["tokens_per_s"] > 0 and s["tpot_ms"] > 0
        assert s["tpot_ms"] == pytest.approx(1e3 / s["tokens_per_s"])
    assert report["summary"]["cure_ar"]["speedup_vs_cure_ar"] == pytest.approx(1.0)
    assert report["summary"]["hf_generate"]["speedup_vs_hf_generate"] == pytest.approx(1.0)
    assert report["summary"]["hf_generate"]["tau"] == pytest.approx(1.0)
    assert report["summary"]["cure_ar"]["tau"] == pytest.approx(1.0)
    assert len(report["results"]) == 2 * len(HF + CURE)
    for r in report["results"]:
        for key in ("prompt_index", "task_id", "method", "prompt_tokens", "tokens", "new_tokens", "prefill_ms",
                    "decode_ms", "decode_tokens", "tokens_per_s", "tpot_ms", "matches_hf_greedy", "first_mismatch"):
            assert key in r, key
        assert r["prefill_ms"] > 0 and r["decode_ms"] > 0
        # prefill excluded: HF decodes the n - 1 tokens after the prefill's, cure all n
        assert r["decode_tokens"] == r["new_tokens"] - (1 if r["method"].startswith("hf_") else 0)


def test_every_lossless_method_matches_hf_greedy(report):
    for m in report["methods"]:
        assert m["lossless"]
        s = report["summary"][m["name"]]
        assert s["all_match_hf_greedy"] and s["matches_hf_greedy"] == 2, m["name"]
    for r in report["results"]:
        assert r["first_mismatch"] is None and r["new_tokens"] > 1, (r["method"], r["task_id"])


def test_thread_choice(peers, monkeypatch):
    assert peers.choose_threads(3) == (3, "set with --threads")
    monkeypatch.setattr(peers.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(peers.os, "getloadavg", lambda: (5.0, 4.0, 3.0))
    assert peers.choose_threads(None)[0] == 1
    monkeypatch.setattr(peers.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert peers.choose_threads(None)[0] == 2


def test_first_mismatch(peers):
    assert peers.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert peers.first_mismatch([1, 9, 3], [1, 2, 3]) == 1
    assert peers.first_mismatch([1, 2], [1, 2, 3]) == 2


def test_ceiling_definition(peers):
    """ceiling = tau x (ar ms/token / verify ms per block); share = achieved speedup / ceiling."""
    out = {"cure_ar": {"decode_ms": 1000.0, "decode_tokens": 10, "tokens_per_s": 10.0, "tau": 1.0},
           "cure_cure": {"decode_ms": 1000.0, "decode_tokens": 15, "tokens_per_s": 15.0, "tau": 3.0},
           "hf_generate": {"decode_ms": 900.0, "decode_tokens": 9, "tokens_per_s": 10.0, "tau": 1.0}}
    results = [{"method": "cure_ar", "target_forwards": 10, "verify_ms": 1000.0, "mean_tree_size": 0.0},
               # 5 blocks verified at 200 ms each (tree of 20): the ceiling is 3 x 100/200 = 1.5
               {"method": "cure_cure", "target_forwards": 5, "verify_ms": 1000.0, "mean_tree_size": 20.0},
               {"method": "hf_generate", "target_forwards": 9}]
    peers.ceilings(out, results)
    assert out["cure_cure"]["ceiling_speedup"] == pytest.approx(1.5)
    assert out["cure_cure"]["share_of_ceiling"] == pytest.approx(1.5 / 1.5)
    assert out["cure_cure"]["mean_tree_size"] == pytest.approx(20.0)
    assert out["cure_ar"]["ceiling_speedup"] == pytest.approx(1.0)
    assert out["hf_generate"]["ceiling_speedup"] is None


def test_tiny_run_reports_ceilings(report):
    for name in CURE:
        s = report["summary"][name]
        assert s["ceiling_speedup"] > 0 and 0 < s["share_of_ceiling"], name
    assert report["summary"]["hf_generate"]["ceiling_speedup"] is None


def test_strategy_variants_run_one_strategy_with_changed_fields(peers, tmp_path):
    assert peers.strategy_variant("cure") == ("cure", {})
    assert peers.strategy_variant("cure:lookup=10:redraft_weight=0.7") == ("cure", {"lookup": 10, "redraft_weight": 0.7})
    out = tmp_path / "v.json"
    ret = peers.main(["--tiny", "--limit", "1", "--max-new-tokens", "6", "--k", "4", "--threads", "1", "--hf", "",
                      "--strategies", "ar,cure:lookup=3,cure:nope=1,ddtree:attention=sdpa,ddtree:attention=x,"
                                      "cure:draft_dtype=bfloat16,cure:draft_dtype=int4",
                      "--warmup-tokens", "2", "--quiet", "--json", str(out)])
    names = [m["name"] for m in ret["methods"]]
    assert "cure_cure:lookup=3" in names and "cure_cure:nope=1" not in names
    assert any(s["method"] == "cure_cure:nope=1" for s in ret["skipped"])
    attention = {m["name"]: m["settings"].get("attention") for m in ret["methods"]}
    assert attention["cure_ddtree:attention=sdpa"] == "sdpa" and attention["cure_cure:lookup=3"] == "grouped"
    assert any(s["method"] == "cure_ddtree:attention=x" for s in ret["skipped"])
    # draft_dtype=: the pair opened again with bfloat16 drafters (or, on a CPU without oneDNN bfloat16 kernels,
    # skipped with that reason); an unknown dtype is skipped with why
    dtypes = {m["name"]: m["settings"].get("draft_dtype") for m in ret["methods"]}
    bf16_skip = [s["reason"] for s in ret["skipped"] if s["method"] == "cure_cure:draft_dtype=bfloat16"]
    assert dtypes.get("cure_cure:draft_dtype=bfloat16") == "bfloat16" or (bf16_skip and "bfloat16" in bf16_skip[0])
    assert any(s["method"] == "cure_cure:draft_dtype=int4" and "int4" in s["reason"] for s in ret["skipped"])
    assert ret["config"]["engine"]["draft_dtype"] == "auto"
    assert all(r["matches_hf_greedy"] for r in ret["results"])


def test_draft_variant_runs_a_strategy_over_another_draft_checkpoint(peers, tmp_path):
    """`cure:draft=PATH`: the pair opened again over another draft folder (a second tiny drafter, an exact
    copy of the target, so it accepts more than the default perturbed one), the same target; a folder that
    does not exist is skipped with why. Every output still equals HF greedy."""
    from cure_core.tiny import save_tiny_pair
    _, other = save_tiny_pair(tmp_path / "other", noise=0.0)
    missing = tmp_path / "missing"
    ret = peers.main(["--tiny", "--limit", "2", "--max-new-tokens", "8", "--k", "4", "--threads", "1", "--hf", "",
                      "--strategies", f"parallel,parallel:draft={other},parallel:draft={missing}",
                      "--warmup-tokens", "2", "--quiet", "--json", str(tmp_path / "d.json")])
    settings = {m["name"]: m["settings"] for m in ret["methods"]}
    assert settings[f"cure_parallel:draft={other}"]["draft"] == str(other) and "draft" not in settings["cure_parallel"]
    assert any(s["method"] == f"cure_parallel:draft={missing}" for s in ret["skipped"])
    tau = {n: ret["summary"][n]["tau"] for n in ("cure_parallel", f"cure_parallel:draft={other}")}
    assert tau[f"cure_parallel:draft={other}"] > tau["cure_parallel"]
    assert all(r["matches_hf_greedy"] for r in ret["results"])


def test_cure_blocks_record_the_tuners_view_and_the_draft_stops(report):
    """--trace-tuner: every block of a tuned method carries the tuner's view before its choice, and the
    per-method budget table counts every block once."""
    for r in report["results"]:
        if not r["method"].startswith("cure_"):
            continue
        assert len(r["blocks"]) == r["target_forwards"]
        for b in r["blocks"]:
            assert b["chain_accepted"] <= b["drafted"] and isinstance(b["stopped"], bool)
            assert not b["stopped"] or r["method"] == "cure_cure"          # only best-first cure stops drafting
            if r["method"] != "cure_ar":
                assert str(b["budget"]) in b["tuner"]["candidates"]
    for name in CURE:
        s = report["summary"][name]
        assert sum(x["blocks"] for x in s["budgets"]["by_budget"].values()) == s["target_forwards"]


def test_budget_table_counts_stopped_chains_and_those_accepted_whole(peers):
    def blk(budget, drafted, chain, stopped, accepted=None):
        return {"budget": budget, "drafted": drafted, "chain_accepted": chain, "stopped": stopped,
                "accepted": chain if accepted is None else accepted, "draft_ms": 60.0, "verify_ms": 40.0}
    rows = [{"blocks": [blk(4, 2, 2, True), blk(4, 3, 1, True), blk(8, 8, 5, False, accepted=6)]}]
    t = peers.budget_table(rows)
    assert t["stopped_chains"] == 2 and t["stopped_chains_accepted_whole"] == 1
    assert t["by_budget"]["4"]["blocks"] == 2 and t["by_budget"]["4"]["drafted"] == pytest.approx(2.5)
    assert t["by_budget"]["8"]["tok_s"] == pytest.approx(1e3 * 7 / 100)


def test_methods_run_in_cure_benchs_balanced_order(peers):
    from cure_core.metrics import balanced_order
    methods = [f"m{i}" for i in range(8)]
    for i in range(10):
        assert peers.run_order(methods, i, "balanced") == [methods[j] for j in balanced_order(8, i)]
    assert peers.run_order(methods, 5, "fixed") == methods


def test_results_record_where_each_method_ran(report):
    assert "balanced" in report["timing"]["order"]
    by_prompt = {}
    for r in report["results"]:
        by_prompt.setdefault(r["prompt_index"], []).append(r)
    for rs in by_prompt.values():
        assert [r["method"] for r in rs] == HF + CURE                        # listed order in the JSON
        assert sorted(r["run_position"] for r in rs) == list(range(len(HF + CURE)))
    assert by_prompt[0][0]["run_position"] == 0 and by_prompt[1][0]["run_position"] != 0   # the reference moved


def test_the_report_path_is_checked_before_any_model_loads_and_written_whole(peers, tmp_path, capsys):
    """--json: a folder that does not exist yet is made (the report used to fail only after the whole run);
    a path that cannot be written is one line, exit 2, before loading; the report is never half written;
    each cure method records which drafter it drafted with."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as e:
        peers.main(["--tiny", "--json", str(blocker / "out.json")])
    assert e.value.code == 2 and "--json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        peers.main(["--tiny", "--json", str(tmp_path)])           # a folder, not a file
    assert e.value.code == 2
    out = tmp_path / "new" / "deeper" / "p.json"
    ret = peers.main(["--tiny", "--limit", "1", "--max-new-tokens", "4", "--k", "4", "--threads", "1", "--hf", "",
                      "--strategies", "sd,cure", "--warmup-tokens", "0", "--quiet", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(ret))
    assert [p.name for p in out.parent.iterdir()] == ["p.json"]   # no temporary file left beside it
    drafts = {m["name"]: m["settings"]["drafts"] for m in ret["methods"] if m["kind"] == "cure"}
    assert drafts == {"cure_sd": "chain", "cure_cure": "block"}
    assert ret["models"]["chain_strategies"] == ["sd"]


def test_a_dtype_variant_runs_another_target_checked_against_its_own_ar(peers, tmp_path):
    """`cure:dtype=int8` loads the target again in int8; its rows are checked against `ar:dtype=int8`, which
    must be listed (one line otherwise)."""
    from cure_core.cpu_kernels import int8_kernels
    if not int8_kernels():
        pytest.skip("no fbgemm int8 matmuls")
    out = tmp_path / "p.json"
    rep = peers.main(["--tiny", "--limit", "2", "--max-new-tokens", "8", "--k", "4", "--threads", "1", "--hf", "",
                      "--warmup-tokens", "2", "--quiet", "--strategies", "ar,ar:dtype=int8,cure:dtype=int8",
                      "--json", str(out)])
    s = rep["summary"]
    assert s["cure_cure:dtype=int8"]["all_match_hf_greedy"] and s["cure_ar:dtype=int8"]["all_match_hf_greedy"]
    settings = {m["name"]: m["settings"] for m in rep["methods"]}
    assert settings["cure_cure:dtype=int8"]["reference"] == "cure_ar:dtype=int8"
    assert any("equal to cure_ar:dtype=int8" in n for n in rep["notes"])
    with pytest.raises(SystemExit, match="add ar:dtype=int8 to --strategies"):
        peers.main(["--tiny", "--limit", "1", "--max-new-tokens", "4", "--threads", "1", "--quiet",
                    "--strategies", "cure:dtype=int8", "--json", str(tmp_path / "q.json")])
