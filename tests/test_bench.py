"""`cure bench`: metric definitions on hand-made Blocks, the interleaving order, resume, and the
command end to end on tiny saved checkpoints."""
import importlib.util
import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cure_cli.bench import report
from cure_cli.bench import runner as bench_runner
from cure_cli.bench.runner import (BenchError, BenchPrompt, PairResult, ProgressLog, RunSpec, build_runs, interleave,
                                   parse_list)
from cure_cli.bench.scoring import REFUSAL, Scorer, summarize_scores
from cure_cli.bench.stats import common_prefix, complete_prompts, compute, match_stats, run_metrics
from conftest import AUTO_DTYPE
from cure_core.metrics import balanced_order
from cure_tasks import Problem
from cure_cli.main import app
from cure_core.block import UFP, Block, Resync, Timings, TreeNode
from cure_core.config import Ablations, DecodeConfig
from cure_core.tiny import save_tiny_pair
from cure_core.trace import read_trace

runner = CliRunner()
ALL = ["ar", "sd", "parallel", "cure", "ddtree"]


# ---------------------------------------------------------------- hand-made records

def blk(strategy="cure", draft=4, accepted=0, branch0=None, emitted=None, tree=None, ms=10.0, prefill=0.0, index=0,
        ufp=False):
    """A Block whose winning path has `accepted` drafted tokens (branch 0 reached `branch0`)."""
    branch0 = accepted if branch0 is None else branch0
    nodes = [TreeNode(token=10 + d, parent=d - 1, depth=d + 1, branch=0, accepted=d < branch0) for d in range(draft)]
    extra = (tree or draft) - draft
    for j in range(extra):
        nodes.append(TreeNode(token=50 + j, parent=-1 if j == 0 else draft + j - 1, depth=j + 1, branch=1,
                              accepted=False))
    emit = tuple(range(accepted + 1)) if emitted is None else tuple(emitted)
    return Block(index=index, strategy=strategy, context_len=5, root=1, draft=tuple(range(draft)),
                 margins=tuple(0.5 for _ in range(draft)),
                 ufps=(UFP(position=0, margin=0.1, budget=2, alternatives=(7,)),) if ufp else (),
                 nodes=tuple(nodes), accepted=tuple(range(accepted)), winner=1 if accepted > branch0 else 0,
                 branch0_accepted=branch0, bonus=0, emitted=emit, resync=Resync("winner", ()),
                 timings=Timings(prefill_ms=prefill, draft_ms=ms * 0.2, tree_ms=ms * 0.1, verify_ms=ms * 0.6,
                                 commit_ms=ms * 0.1))


def pair(run, idx, blocks, tokens=None, strategy=None):
    toks = tokens if tokens is not None else [t for b in blocks for t in b.emitted]
    return PairResult(prompt_index=idx, task_id=f"t/{idx}", run=run, strategy=strategy or run.split("-")[0],
                      prompt_ids=[1, 2], token_ids=list(toks), completion="", blocks=blocks)


def test_tau_tpot_and_per_position_acceptance_known_answers():
    # 3 blocks (K-1 = 4 drafted): accepted 2, 0, 3 -> emitted 3, 1, 4 = 8 tokens in 3 forwards
    blocks = [blk(accepted=2, ms=12.0, prefill=100.0), blk(accepted=0, ms=6.0), blk(accepted=3, ms=6.0)]
    m = run_metrics([pair("parallel", 0, blocks)], depth=4)
    assert m["new_tokens"] == 8 and m["blocks"] == 3
    assert m["tau"] == pytest.approx(8 / 3)                    # bonus included
    assert m["tpot_ms"] == pytest.approx(24.0 / 8)            # prefill (100 ms) excluded
    assert m["tokens_per_s"] == pytest.approx(1000 / 3.0)
    # depth d reached by the winning path: d1 2/3, d2 2/3, d3 1/3, d4 0/3
    assert m["per_position_acceptance"] == pytest.approx([2 / 3, 2 / 3, 1 / 3, 0.0])
    assert m["time_split"]["verify"] == pytest.approx(0.6)
    assert m["time_ms"]["prefill"] == pytest.approx(100.0)
    assert m["ms_per_block"] == pytest.approx(8.0)


def test_repair_win_rate_and_tree_size():
    blocks = [blk(accepted=3, branch0=1, tree=9, ufp=True), blk(accepted=1, branch0=1, tree=6, ufp=True),
              blk(accepted=0, tree=4)]
    m = run_metrics([pair("cure", 0, blocks)], depth=4)
    assert m["repair_win_rate"] == pytest.approx(1 / 3) and m["repair_wins"] == 1
    assert m["extra_tokens"] == 2
    assert m["mean_tree_size"] == pytest.approx(19 / 3) and m["max_tree_size"] == 9
    assert m["blocks_with_ufp"] == 2


def test_ar_has_no_per_position_acceptance():
    m = run_metrics([pair("ar", 0, [blk("ar", draft=0, accepted=0)] * 4)], depth=4)
    assert m["tau"] == 1.0 and m["per_position_acceptance"] is None


def test_match_rate_is_common_prefix_over_longer_length():
    ref = {0: [1, 2, 3, 4], 1: [5, 6], 2: [1, 2, 3]}
    pairs = [pair("cure", 0, [], tokens=[1, 2, 9, 4]),   # diverges at 2: 2 of 4 (later equal tokens don't count)
             pair("cure", 1, [], tokens=[5, 6]),         # identical: 2 of 2
             pair("cure", 2, [], tokens=[1, 2])]         # shorter: 2 of 3
    s = match_stats(pairs, ref)
    assert s["match_rate"] == pytest.approx(6 / 9)
    assert s["identical"] == 1 and s["prompts"] == 3
    assert [(m["task_id"], m["first_diff"]) for m in s["mismatches"]] == [("t/0", 2), ("t/2", 2)]
    assert common_prefix([1, 2], [1, 2]) == 2


def test_speedup_match_and_ablation_deltas_in_compute():
    base = DecodeConfig.of(k=5)
    runs = build_runs(base, ["ar", "sd", "cure"], ["resync"])
    ar = [blk("ar", draft=0, accepted=0, ms=10.0) for _ in range(4)]          # 4 tokens, 40 ms -> TPOT 10
    sd = [blk("sd", accepted=1, ms=10.0) for _ in range(2)]                   # 4 tokens, 20 ms -> TPOT 5
    cure = [blk(accepted=3, ms=16.0)]                                         # 4 tokens, 16 ms -> TPOT 4
    nores = [blk(accepted=0, ms=8.0) for _ in range(4)]                       # 4 tokens, 32 ms -> TPOT 8
    toks = [0, 1, 2, 3]
    pairs = [pair("ar", 0, ar, toks), pair("sd", 0, sd, toks), pair("cure", 0, cure, toks),
             pair("cure-no-resync", 0, nores, [0, 1, 7, 7], strategy="cure"),
             pair("ar", 1, ar, toks)]                                         # prompt 1 unfinished: left out
    c = compute(pairs, runs, depth=4)
    assert c["compared_prompts"] == 1
    m = c["metrics"]
    assert m["ar"]["prompts"] == 1
    assert m["cure"]["speedup_vs_ar"] == pytest.approx(2.5)
    assert m["cure"]["speedup_vs_sd"] == pytest.approx(1.25)
    assert m["ar"]["speedup_vs_ar"] == pytest.approx(1.0)
    # ceiling: tau 4 x (ar TPOT 10 ms / cure's verify 9.6 ms per block); achieved 2.5x of it
    assert m["cure"]["ceiling_speedup_vs_ar"] == pytest.approx(4 * 10 / 9.6)
    assert m["cure"]["share_of_ceiling"] == pytest.approx(2.5 / (4 * 10 / 9.6))
    assert m["cure"]["match_vs_ar"] == 1.0 and m["ar"]["match_vs_ar"] is None
    assert m["cure-no-resync"]["match_vs_ar"] == pytest.approx(0.5)
    a = c["ablation"]["cure-no-resync"]
    assert a["resync"] is False and a["keep_branch0"] is True
    assert a["delta_tau_pct"] == pytest.approx(-75.0)                       # tau 1 vs 4
    assert a["tpot_ratio_vs_cure"] == pytest.approx(2.0)
    assert a["delta_speedup_pct"] == pytest.approx(-50.0)


def test_complete_prompts_needs_every_run():
    pairs = [pair("ar", 0, []), pair("cure", 0, []), pair("ar", 1, [])]
    assert complete_prompts(pairs, ["ar", "cure"]) == [0]


# ---------------------------------------------------------------- runs and order

def test_build_runs_with_ablations():
    runs = build_runs(DecodeConfig(), ["ar", "cure"], ["branch0", "resync"])
    assert [r.name for r in runs] == ["ar", "cure", "cure-no-branch0", "cure-no-resync", "cure-no-branch0-no-resync"]
    cfg = {r.name: r.config for r in runs}
    assert cfg["cure-no-branch0"].ablations == Ablations(keep_branch0=False, resync=True)
    assert cfg["cure-no-resync"].ablations == Ablations(keep_branch0=True, resync=False)
    assert cfg["cure-no-branch0-no-resync"].ablations == Ablations(keep_branch0=False, resync=False)
    assert all(r.strategy == "cure" for r in runs[1:])
    with pytest.raises(BenchError, match="unknown strategy"):
        build_runs(DecodeConfig(), ["fast"])
    with pytest.raises(BenchError, match="unknown ablation"):
        build_runs(DecodeConfig(), ["cure"], ["bonus"])
    assert parse_list(" ar, cure,,ar ") == ["ar", "cure"]


def test_interleaving_is_prompt_major_and_skips_done_pairs():
    prompts = [BenchPrompt(i, Problem(task_id=f"t{i}", prompt="x", kind="code"), (1,)) for i in range(3)]
    runs = [RunSpec(s, DecodeConfig.of(strategy=s)) for s in ("ar", "parallel", "cure")]
    order = [(p.index, r.name) for p, r in interleave(prompts, runs, order="fixed")]
    assert order == [(0, "ar"), (0, "parallel"), (0, "cure"), (1, "ar"), (1, "parallel"), (1, "cure"),
                     (2, "ar"), (2, "parallel"), (2, "cure")]
    done = {(0, "ar"), (0, "parallel"), (1, "cure")}
    order = [(p.index, r.name) for p, r in interleave(prompts, runs, done=done, order="fixed")]
    assert order == [(0, "cure"), (1, "ar"), (1, "parallel"), (2, "ar"), (2, "parallel"), (2, "cure")]
    # the default: balanced_order's rows by prompt index (3 runs: 0 1 2 | 1 2 0 | 2 0 1 | mirrored after)
    order = [(p.index, r.name) for p, r in interleave(prompts, runs)]
    assert order == [(0, "ar"), (0, "parallel"), (0, "cure"), (1, "parallel"), (1, "cure"), (1, "ar"),
                     (2, "cure"), (2, "ar"), (2, "parallel")]
    order = [(p.index, r.name) for p, r in interleave(prompts, runs, done=done)]     # a resume keeps it
    assert order == [(0, "cure"), (1, "parallel"), (1, "ar"), (2, "cure"), (2, "ar"), (2, "parallel")]


def test_balanced_order_puts_every_run_in_every_position_and_after_every_other():
    from collections import Counter
    for n in range(1, 10):
        cycle = n if n % 2 == 0 else 2 * n
        rows = [balanced_order(n, i) for i in range(cycle)]
        assert all(sorted(r) == list(range(n)) for r in rows)
        positions = Counter((x, j) for r in rows for j, x in enumerate(r))
        follows = Counter(pair for r in rows for pair in zip(r, r[1:]))
        assert len(positions) == n * n and len(set(positions.values())) == 1, n
        assert len(follows) == n * (n - 1) and len(set(follows.values())) <= 1, n     # each ordered pair alike
        assert balanced_order(n, cycle + 1) == rows[1 % cycle]


def test_progress_log_resume_rules(tmp_path):
    fp = {"dataset": "prompts", "models": {"target": "t"}, "runs": {"ar": {"k": 4}}}
    log = ProgressLog(tmp_path, fp, resume=False)
    log.append(pair("ar", 0, [blk("ar", draft=0)]))
    log.close()
    with (tmp_path / "progress.jsonl").open("a") as f:
        f.write('{"type": "pair", "prompt_ind')                  # a torn last line (hard kill)
    with pytest.raises(BenchError, match="already holds"):
        ProgressLog(tmp_path, fp, resume=False)
    with pytest.raises(BenchError, match="different settings"):
        ProgressLog(tmp_path, {**fp, "models": {"target": "other"}}, resume=True)
    with pytest.raises(BenchError, match="different decoding config"):
        ProgressLog(tmp_path, {**fp, "runs": {"ar": {"k": 8}}}, resume=True)
    log = ProgressLog(tmp_path, {**fp, "runs": {"ar": {"k": 4}, "cure": {"k": 4}}}, resume=True)  # new run: ok
    assert [p.key for p in log.pairs] == [(0, "ar")]
    assert log.pairs[0].blocks[0] == blk("ar", draft=0)        # blocks round-trip exactly
    log.append(pair("cure", 0, [blk()]))
    log.close()
    assert len(ProgressLog(tmp_path, fp, resume=True).pairs) == 2
    with pytest.raises(BenchError, match="nothing to resume"):
        ProgressLog(tmp_path / "empty", fp, resume=True)


# ---------------------------------------------------------------- scoring

def test_scorer_refuses_code_without_permission_and_grades_math():
    code = Problem(task_id="c", prompt="", kind="code", tests="assert add(1, 2) == 3\n", entry_point="add")
    good = "def add(a, b):\n    return a + b\n"
    assert Scorer(allow_code_exec=False)(code, good) is None
    assert "--allow-code-exec" in REFUSAL
    math = Problem(task_id="m", prompt="", kind="math", answer="18")
    assert Scorer(False)(math, "so she started with 18 cleaners.")["passed"] is True
    assert Scorer(False)(math, "The answer is 17")["passed"] is False
    assert Scorer(False)(Problem(task_id="x", prompt="", kind="code"), good) is None   # no tests: ungraded


def test_scorer_runs_code_in_the_sandbox_when_allowed():
    code = Problem(task_id="c", prompt="", kind="code", tests="assert add(1, 2) == 3\n", entry_point="add")
    s = Scorer(allow_code_exec=True)
    assert s(code, "def add(a, b):\n    return a + b\n")["passed"] is True
    assert s(code, "def add(a, b):\n    return a - b\n")["passed"] is False
    pairs = [pair("ar", 0, []), pair("ar", 1, [])]
    pairs[0].score, pairs[1].score = {"metric": "pass@1", "passed": True}, {"metric": "pass@1", "passed": False}
    assert summarize_scores(pairs, ["ar"], [0, 1])["ar"] == {"metric": "pass@1", "passed": 1, "scored": 2, "rate": 0.5}


# ---------------------------------------------------------------- the command, end to end

@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [{"task_id": "p/add", "prompt": "def add(a, b):", "kind": "code",
             "tests": "assert add(1, 2) == 3", "entry_point": "add"},
            {"task_id": "p/sum", "prompt": "Tom has 3 apples and buys 4 more. How many?", "kind": "math",
             "answer": "7"},
            {"task_id": "p/fox", "prompt": "The quick brown fox"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bench(tiny_dirs, prompts_file, out, *extra):
    t, d = tiny_dirs
    args = ["bench", "--prompts", str(prompts_file), "--target", str(t), "--draft", str(d), "-n", "10", "--k", "4",
            "--output-dir", str(out), "--warmup", "1", *map(str, extra)]
    return runner.invoke(app, args)


def test_end_to_end_all_strategies_with_ablation(tiny_dirs, prompts_file, tmp_path):
    out = tmp_path / "run"
    r = bench(tiny_dirs, prompts_file, out, "--ar-draft", tiny_dirs[1], "--ablate", "branch0,resync", "--limit", 2,
              "--json", "--plot")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)                              # --json: stdout is exactly one object
    names = ALL + ["cure-no-branch0", "cure-no-resync", "cure-no-branch0-no-resync"]
    assert list(summary["metrics"]) == names
    # results.json schema
    res = json.loads((out / "results.json").read_text())
    for key in ("schema", "status", "dataset", "models", "versions", "device", "config", "runs", "order", "warmup",
                "skipped", "compared_prompts", "metrics", "lossless", "ablation", "scoring", "per_prompt"):
        assert key in res, key
    assert res["status"] == "complete" and res["compared_prompts"] == 2 and res["prompts"] == 2
    assert res["config"]["temperature"] == 0.0 and res["config"]["seed"] == 0
    assert res["runs"]["cure-no-resync"]["resync"] is False
    assert set(res["versions"]) >= {"torch", "transformers", "cure"}
    assert {"cpu_model", "bf16_kernels", "int8_kernels"} <= set(res["device"])     # what the timing ran on
    for name in names:
        m = res["metrics"][name]
        for key in ("tau", "tpot_ms", "tokens_per_s", "speedup_vs_ar", "speedup_vs_sd", "repair_win_rate",
                    "mean_tree_size", "max_tree_size", "per_position_acceptance", "time_split", "match_vs_ar"):
            assert key in m, (name, key)
        assert m["new_tokens"] == 20                               # 2 prompts x 10 tokens
    assert res["metrics"]["ar"]["tau"] == 1.0
    # fp32 greedy: every run reproduces ar token for token (measured, not assumed)
    assert all(v["match_rate"] == 1.0 and v["identical"] == 2 for v in res["lossless"].values())
    assert res["lossless_ok"] is True
    assert set(res["ablation"]) == {"cure-no-branch0", "cure-no-resync", "cure-no-branch0-no-resync"}
    # p/add is code with tests and no --allow-code-exec: refused in one line; p/sum is graded
    assert res["scoring"]["note"] == REFUSAL
    assert REFUSAL.split(":")[0] in r.stderr
    assert res["scoring"]["runs"]["cure"]["scored"] == 1 and res["scoring"]["metric"] == "accuracy"
    # samples.jsonl: evalplus-style, one line per (prompt, run)
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * len(names)
    assert set(samples[0]) == {"task_id", "completion", "strategy"}
    # trace: one generation per (prompt, run), in the interleaved order
    trace = read_trace(out / "trace.jsonl")
    assert trace.footer["status"] == "complete"
    assert trace.header["dtype"] == AUTO_DTYPE         # what inspect's and a replay's "vs AR" name
    assert len(trace.generations) == 2 * len(names)
    run_cfg = {n: res["runs"][n] for n in names}
    order = [next(n for n in names if run_cfg[n] == g.config) for g in trace.generations]
    assert order == [names[j] for i in range(2) for j in balanced_order(len(names), i)]
    assert [g.prompt for g in trace.generations][:: len(names)] == ["def add(a, b):",
                                                                   "Tom has 3 apples and buys 4 more. How many?"]
    assert all(sum(len(b.emitted) for b in g.blocks) == 10 for g in trace.generations)
    if importlib.util.find_spec("matplotlib"):
        for png in ("speedup_tau.png", "acceptance.png", "tau_hist.png", "margin_repair.png"):
            assert (out / png).stat().st_size > 0


def test_tables_pard_chain_sd_and_code_exec(tiny_dirs, prompts_file, tmp_path):
    out = tmp_path / "run"
    # no --ar-draft and a PARD --draft: the PARD model doubles as sd's chain drafter; code is run when allowed
    r = bench(tiny_dirs, prompts_file, out, "--strategies", "ar,sd,cure", "--allow-code-exec", "--limit", 1)
    assert r.exit_code == 0, r.output
    assert "tau" in r.stdout and "TPOT" in r.stdout and "lossless" in r.stdout
    res = json.loads((out / "results.json").read_text())
    # a speedup names the ar it divides by, and results.json records that ar's dtype
    assert res["device"]["ar_dtype"] == AUTO_DTYPE
    wide = Console(width=300, record=True, file=io.StringIO())
    report.print_tables(wide, res)
    heads = [line for line in wide.export_text().splitlines() if "x ar" in line and "tau x ar TPOT" not in line]
    assert heads and all(line.count("x ar") == line.count(f"x ar ({AUTO_DTYPE})") for line in heads)
    assert list(res["metrics"]) == ["ar", "sd", "cure"] and res["skipped"] == []
    assert res["lossless"]["sd"]["identical"] == 1
    assert res["scoring"]["note"] is None and res["scoring"]["metric"] == "pass@1"
    assert res["scoring"]["runs"]["ar"]["scored"] == 1


def test_allow_code_exec_refuses_in_one_line_without_isolation(tiny_dirs, prompts_file, tmp_path, monkeypatch):
    from cure_tasks import isolation
    missing = "cannot isolate generated code: bwrap not found (apt-get install bubblewrap util-linux)"
    monkeypatch.setattr(isolation, "isolation_problem", lambda: missing)
    r = bench(tiny_dirs, prompts_file, tmp_path / "run", "--strategies", "ar", "--allow-code-exec", "--limit", 1)
    assert r.exit_code == 2 and missing in r.stderr and "Traceback" not in r.output


def test_interrupt_keeps_finished_work_and_resume_skips_it(tiny_dirs, prompts_file, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real = bench_runner.generate_pair
    calls = []

    def flaky(engine, prompt, run, decode):
        calls.append((prompt.index, run.name))
        if len(calls) == 4:                                     # Ctrl+C during prompt 1's first run
            raise KeyboardInterrupt
        return real(engine, prompt, run, decode)

    monkeypatch.setattr(bench_runner, "generate_pair", flaky)
    r = bench(tiny_dirs, prompts_file, out, "--strategies", "ar,parallel,cure", "--warmup", 0)
    assert r.exit_code == 130, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "interrupted" and res["finished_pairs"] == 3 and res["compared_prompts"] == 1
    assert read_trace(out).footer["status"] == "interrupted"
    assert calls == [(0, "ar"), (0, "parallel"), (0, "cure"), (1, "parallel")]     # balanced: prompt 1 starts later

    # without --resume the directory is protected; with it, only the missing pairs run
    r = bench(tiny_dirs, prompts_file, out, "--strategies", "ar,parallel,cure")
    assert r.exit_code != 0 and "--resume" in r.stderr
    calls.clear()
    monkeypatch.setattr(bench_runner, "generate_pair", lambda *a: calls.append((a[1].index, a[2].name)) or real(*a))
    r = bench(tiny_dirs, prompts_file, out, "--strategies", "ar,parallel,cure", "--resume")
    assert r.exit_code == 0, r.output
    assert calls == [(1, "parallel"), (1, "cure"), (1, "ar"), (2, "cure"), (2, "ar"), (2, "parallel")]
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "complete" and res["compared_prompts"] == 3 and res["finished_pairs"] == 9
    trace = read_trace(out / "trace.jsonl")
    assert trace.footer["status"] == "complete" and len(trace.generations) == 9
    assert [g.strategy for g in trace.generations] == ["ar", "parallel", "cure", "parallel", "cure", "ar",
                                                       "cure", "ar", "parallel"]
    # a resume with different engine flags is refused
    r = bench(tiny_dirs, prompts_file, out, "--strategies", "ar,parallel,cure", "--resume", "--tau-margin", 2.0)
    assert r.exit_code != 0 and "different" in r.stderr


def test_a_mismatch_against_ar_is_reported_loudly(tiny_dirs, prompts_file, tmp_path, monkeypatch):
    real = bench_runner.generate_pair

    def corrupt(engine, prompt, run, decode):
        p = real(engine, prompt, run, decode)
        if run.name == "cure":
            p.token_ids[3] = (p.token_ids[3] + 1) % 256            # what a lossy verifier would do
        return p

    monkeypatch.setattr(bench_runner, "generate_pair", corrupt)
    out = tmp_path / "run"
    r = bench(tiny_dirs, prompts_file, out, "--strategies", "ar,parallel,cure", "--limit", 1, "--warmup", 0)
    assert r.exit_code == 0, r.output
    assert "MISMATCH: cure differs from ar on 1/1 prompt(s)" in " ".join(r.stdout.split())
    res = json.loads((out / "results.json").read_text())
    assert res["lossless_ok"] is False
    assert res["lossless"]["cure"]["mismatches"][0]["first_diff"] == 3
    assert res["metrics"]["cure"]["match_vs_ar"] == pytest.approx(0.3)
    assert res["metrics"]["parallel"]["match_vs_ar"] == 1.0


def test_bad_input_is_one_clear_line(tiny_dirs, prompts_file, tmp_path):
    t, d = tiny_dirs
    r = runner.invoke(app, ["bench", "--target", str(t), "--draft", str(d)])
    assert r.exit_code != 0 and "name a data set" in r.stderr
    r = bench(tiny_dirs, prompts_file, tmp_path / "a", "--strategies", "ar,fast")
    assert r.exit_code != 0 and "unknown strategy 'fast'" in r.stderr
    r = bench(tiny_dirs, prompts_file, tmp_path / "b", "--ablate", "bonus")
    assert r.exit_code != 0 and "unknown ablation" in r.stderr
    r = runner.invoke(app, ["bench", "mbpp", "--target", str(t)])
    assert r.exit_code != 0 and "--data" in r.stderr
    assert "Traceback" not in r.output


def test_a_fixed_order_runs_the_listed_order_and_a_bad_order_is_one_line(tiny_dirs, prompts_file, tmp_path):
    out = tmp_path / "run"
    r = bench(tiny_dirs, prompts_file, out, "--strategies", "ar,parallel", "--limit", 2, "--order", "fixed",
              "--warmup", 0)
    assert r.exit_code == 0, r.output
    assert [g.strategy for g in read_trace(out / "trace.jsonl").generations] == ["ar", "parallel"] * 2
    assert "in that order every prompt" in json.loads((out / "results.json").read_text())["order"]
    r = bench(tiny_dirs, prompts_file, tmp_path / "bad", "--strategies", "ar", "--order", "shuffled")
    assert r.exit_code == 2 and "--order must be one of balanced, fixed" in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "bad").exists()                                   # refused before anything is written
