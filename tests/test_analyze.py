"""`cure analyze`: features known before verification, ranking metrics with known answers, a
planted signal the scorer must find, and clear errors on traces that cannot support the analysis."""
import dataclasses
import json
import random

import numpy as np
import pytest
from typer.testing import CliRunner

from cure_cli.main import app
from cure_core.analysis import (FEATURES, analyze, auc, block_features, budget_metrics, group_folds,
                                rank_order)
from cure_core.block import UFP, Block, Resync, Timings, TreeNode
from cure_core.config import DecodeConfig
from cure_core.trace import TraceWriter

runner = CliRunner()
N = 7                                                   # drafted tokens per block (K = 8)


def cure_block(index, ufp_pos, gain, rng, a0=None, strategy="cure"):
    """A consistent CURE block: branch 0 (N tokens) plus 2 repair branches grafted at ufp_pos.
    gain > 0: branch 0 is accepted up to the UFP and repair branch 1 gets `gain` more tokens."""
    margins = [rng.uniform(1.5, 5.0) for _ in range(N)]
    margins[ufp_pos] = rng.uniform(0.0, 0.9)
    draft = tuple(10 + d for d in range(N))
    nodes = [[draft[d], d - 1, d + 1, 0] for d in range(N)]
    alts = (200, 201)
    starts = {}
    for r, alt in enumerate(alts, start=1):
        parent = ufp_pos - 1
        for d in range(ufp_pos, N):
            nodes.append([alt if d == ufp_pos else 100 + 10 * r + d, parent, d + 1, r])
            if d == ufp_pos:
                starts[r] = len(nodes) - 1
            parent = len(nodes) - 1
    if gain > 0:
        a0 = ufp_pos
        first = starts[1]
        path = list(range(ufp_pos)) + list(range(first, first + gain))
    else:
        a0 = rng.randint(0, ufp_pos) if a0 is None else a0
        path = list(range(a0))
    acc = set(path)
    tree = tuple(TreeNode(token=t, parent=p, depth=dep, branch=b, accepted=i in acc)
                 for i, (t, p, dep, b) in enumerate(nodes))
    emitted = tuple(nodes[i][0] for i in path) + (5,)
    return Block(index=index, strategy=strategy, context_len=20 + 4 * index, root=1, draft=draft,
                 margins=tuple(margins), ufps=(UFP(position=ufp_pos, margin=margins[ufp_pos], budget=2,
                                                   alternatives=alts),),
                 nodes=tree, accepted=tuple(path), winner=1 if gain > 0 else 0, branch0_accepted=a0, bonus=5,
                 emitted=emitted, resync=Resync("winner", emitted[:-1]), timings=Timings(1, 1, 1, 1, 1))


def planted(seed=0, gens=30, per_gen=10, signal=True):
    """Useful repairs (delta_a > 0) concentrate on blocks whose UFP comes early: a signal in the
    UFP position, invisible to the margin-only baseline (the UFP margin is drawn the same way)."""
    rng = random.Random(seed)
    out = []
    for g in range(gens):
        blocks = []
        for i in range(per_gen):
            pos = rng.randrange(N)
            useful = signal and rng.random() < (0.85 if pos <= 1 else 0.04)
            blocks.append(cure_block(i, pos, rng.randint(1, N - pos - 1) if useful and pos < N - 1 else 0, rng))
        out.append(blocks)
    return out


def write_trace(path, generations, strategy="cure", **cfg_changes):
    cfg = DecodeConfig.of(strategy=strategy, k=N + 1, **cfg_changes).to_dict()
    w = TraceWriter(path, models={"target": "synthetic"}, config=cfg)
    for blocks in generations:
        w.begin([1, 2, 3], "synthetic", strategy, cfg)
        for b in blocks:
            w.block(b)
        w.end()
    return w.close()


def test_synthetic_blocks_are_consistent():
    rng = random.Random(1)
    b = cure_block(0, 2, 3, rng)
    assert b.delta_a == 3 and b.repair_won and b.accept_length == 5 and b.branch0_accepted == 2
    assert all(b.nodes[i].accepted for i in b.accepted)
    assert cure_block(0, 3, 0, rng, a0=1).delta_a == 0


def test_features_use_nothing_from_verification():
    rng = random.Random(2)
    b = cure_block(3, 2, 2, rng)
    prev = cure_block(2, 4, 0, rng)
    f = block_features(b, prev)
    assert list(f) == list(FEATURES)
    # change everything verification decides: the features do not move
    flipped = dataclasses.replace(
        b, accepted=(), winner=0, branch0_accepted=0, bonus=99, emitted=(99,), stop="eos",
        nodes=tuple(dataclasses.replace(n, accepted=not n.accepted) for n in b.nodes),
        timings=Timings(0, 0, 0, 999.0, 0), resync=Resync("branch0", ()))
    assert block_features(flipped, prev) == f
    assert f["ufp_pos"] == 2 and f["ufp_rel"] == pytest.approx(2 / N) and f["n_alternatives"] == 2
    assert f["tree_size"] == N + 2 * (N - 2) and f["repair_nodes"] == 2 * (N - 2)
    assert f["prefix_min_margin"] == pytest.approx(min(b.margins[:2]))
    assert f["prev_accept"] == prev.accept_length and block_features(b, None)["prev_accept"] == -1


def test_budget_metrics_known_answers():
    delta = [3, 0, 1, 0, 0, 2, 0, 0, 0, 0]                     # 3 useful blocks, 6 extra tokens
    order = list(range(10))
    m = budget_metrics(order, delta, 0.2)                     # admits blocks 0, 1
    assert m == {"admitted": 2, "precision": 0.5, "recall": pytest.approx(1 / 3), "extra_token_recall": 0.5}
    m = budget_metrics(order, delta, 0.3)                     # 0, 1, 2
    assert m["precision"] == pytest.approx(2 / 3) and m["extra_token_recall"] == pytest.approx(4 / 6)
    m = budget_metrics([5, 0, 2] + [1, 3, 4, 6, 7, 8, 9], delta, 0.3)
    assert m["precision"] == 1.0 and m["recall"] == 1.0 and m["extra_token_recall"] == 1.0
    assert budget_metrics(order, delta, 0.01)["admitted"] == 1  # at least one block


def test_ranking_helpers():
    assert list(rank_order([0.1, 0.9, 0.5])) == [1, 2, 0]
    ties = {tuple(rank_order([1.0, 1.0, 1.0, 1.0], seed=s)) for s in range(20)}
    assert len(ties) > 1                                       # ties are broken at random, not by input order
    assert auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auc([0.5, 0.5], [True, False]) == 0.5
    assert auc([1, 2], [True, True]) is None
    groups = [f"g{i % 7}" for i in range(70)]
    folds = group_folds(groups, 3, seed=0)
    seen = [{groups[i] for i in f} for f in folds]
    assert sum(len(f) for f in folds) == 70
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1:])   # no generation spans two folds


def test_scorer_finds_a_planted_signal(tmp_path):
    path = write_trace(tmp_path / "planted.jsonl", planted())
    r = runner.invoke(app, ["analyze", str(path), "--json", "--seed", "1"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["blocks"] == 300 and res["generations"] == 30
    base = res["base_rate"]
    assert 0.1 < base < 0.4
    assert res["auc"]["scorer"] > 0.8
    rows = {row["r"]: row for row in res["budgets"]}
    assert set(rows) == {0.1, 0.2, 0.3}
    assert rows[0.1]["scorer"]["precision"] > 2 * base          # far better than chance
    assert rows[0.3]["scorer"]["extra_token_recall"] > 0.6 > rows[0.3]["chance"]["extra_token_recall"]
    assert rows[0.3]["scorer"]["extra_token_recall"] > rows[0.3]["margin"]["extra_token_recall"]
    assert rows[0.1]["chance"]["precision"] == pytest.approx(base)
    # the same analysis through the API, with the gradient-boosting scorer
    gens = [(str(i), DecodeConfig.of(k=N + 1).to_dict(), b) for i, b in enumerate(planted(seed=3))]
    res = analyze(gens, seed=0, model="hgb")
    assert res["auc"]["scorer"] > 0.75


def test_tables_are_printed(tmp_path):
    path = write_trace(tmp_path / "planted.jsonl", planted(seed=5, gens=12))
    r = runner.invoke(app, ["analyze", str(path)])
    assert r.exit_code == 0, r.output
    assert "precision" in r.stdout and "margin-only" in r.stdout and "extra-token recall" in r.stdout


def test_no_useful_repairs_is_a_clear_error(tmp_path):
    path = write_trace(tmp_path / "flat.jsonl", planted(signal=False, gens=5))
    r = runner.invoke(app, ["analyze", str(path)])
    assert r.exit_code != 0
    assert "none of the 50 cure blocks" in r.stderr and "useful repair" in r.stderr
    assert "Traceback" not in r.output


def test_too_few_or_no_cure_blocks_are_clear_errors(tmp_path):
    rng = random.Random(0)
    few = write_trace(tmp_path / "few.jsonl", [[cure_block(i, 1, 2, rng) for i in range(5)]])
    r = runner.invoke(app, ["analyze", str(few)])
    assert r.exit_code != 0 and "need at least" in r.stderr
    one_gen = write_trace(tmp_path / "one.jsonl", [planted(gens=1, per_gen=40)[0] + [cure_block(40, 0, 3, rng)]])
    r = runner.invoke(app, ["analyze", str(one_gen)])
    assert r.exit_code != 0 and "one generation" in r.stderr
    par = [[dataclasses.replace(b, strategy="parallel") for b in g] for g in planted(gens=3)]
    r = runner.invoke(app, ["analyze", str(write_trace(tmp_path / "par.jsonl", par, strategy="parallel"))])
    assert r.exit_code != 0 and "no full-CURE blocks" in r.stderr and "parallel" in r.stderr
    # ablation generations are not mistaken for full CURE
    r = runner.invoke(app, ["analyze", str(write_trace(tmp_path / "abl.jsonl", planted(gens=3), resync=False))])
    assert r.exit_code != 0 and "ablation" in r.stderr
    r = runner.invoke(app, ["analyze", str(tmp_path / "missing.jsonl")])
    assert r.exit_code != 0 and "not found" in r.stderr


def test_multiple_traces_are_pooled_by_generation(tmp_path):
    gens = planted(seed=7, gens=20)
    a = write_trace(tmp_path / "a.jsonl", gens[:10])
    b = write_trace(tmp_path / "b.jsonl", gens[10:])
    r = runner.invoke(app, ["analyze", str(a), str(b), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["generations"] == 20 and res["blocks"] == 200 and res["traces"] == [str(a), str(b)]
    assert np.isfinite(res["auc"]["scorer"])
