"""An honest empty tree: when the budget tuner picks budget 0, the tree panel and `cure generate`'s stats
line say so and why (derived from the tuner's own prediction), not "no room left to draft"."""
import pytest
from typer.testing import CliRunner

from cure_core import engine as engine_module
from cure_core.budget import CostCurve
from cure_core.config import DecodeConfig
from cure_core.engine import Engine
from cure_cli.main import app
from cure_cli.options import with_flags
from cure_cli.tui.tokens import TokenText
from cure_cli.tui.widgets import render_margins, render_tree

from conftest import make_pair

# A machine where verifying even one drafted token costs ten plain steps: no tree can pay.
STEEP = CostCurve(sizes=(0, 1, 2, 4, 8, 16, 24), verify_ms=(1.0, 10.0, 20.0, 40.0, 80.0, 160.0, 240.0))


@pytest.fixture
def steep(monkeypatch):
    monkeypatch.setattr(engine_module, "measure_cost_curve", lambda *a, **k: STEEP)


def test_budget_zero_blocks_say_why_in_words(steep, target, drafts):
    pair = make_pair(target, drafts["mild"])
    cfg = DecodeConfig.of(strategy="cure", k=6, max_new_tokens=24, v_max=24, auto_budget=True)
    blocks = list(Engine(pair).generate(list(b"def f(x):"), cfg))
    zero = [b for b in blocks if b.meta["v_max"] == 0]
    assert zero and not zero[-1].nodes
    best = zero[-1].meta["best_tree"]
    v, speedup = best["v_max"], best["predicted_speedup"]
    assert v in STEEP.sizes and 0 < speedup < 1.0                 # the best tree loses to no tree
    reason = zero[-1].no_draft_reason
    assert reason.startswith("budget 0: on this machine a tree costs more than the drafts win back")
    assert f"V={v}" in reason and f"{speedup:.2f}x" in reason
    # the settings it names are valid ones that force that tree: a budget under K-1 is a shorter block
    force = f"--v-max {v}" if v >= cfg.k - 1 else f"--k {v + 1} --v-max {v}"
    assert with_flags(reason).endswith(f"{force} forces one")
    forced = DecodeConfig.from_user(k=v + 1 if v < cfg.k - 1 else cfg.k, v_max=v)
    assert forced.v_max == v and not forced.auto_budget
    tree = " ".join(render_tree(zero[-1], TokenText(None)).plain.split())
    assert "no room left" not in tree and f"{force} forces one" in tree
    # a budget from K-1 up needs --v-max alone
    wide = zero[-1].__class__(**{**zero[-1].__dict__, "meta": {"v_max": 0, "best_tree": {
        "v_max": 16, "k": None, "predicted_speedup": 0.8}}})
    assert with_flags(wide.no_draft_reason).endswith("(the best, V=16, is predicted at 0.80x of no tree); "
                                                     "--v-max 16 forces one")
    assert "budget 0" in render_margins(zero[-1], 1.0, 60, 5).plain
    # the last block of a length-limited answer has no room: that reason stays, and ar's own
    last = blocks[-1].__class__(**{**blocks[-1].__dict__, "nodes": (), "meta": {"v_max": 6}})
    assert last.no_draft_reason.startswith("no room left to draft")
    ar = list(Engine(pair).generate(list(b"x"), cfg.with_(strategy="ar", max_new_tokens=2)))
    assert ar[0].no_draft_reason == "ar drafts nothing"
    assert all(b.no_draft_reason is None for b in blocks if b.nodes)


def test_generate_stats_line_says_budget_zero(steep, tmp_path):
    from cure_core.tiny import save_tiny_pair
    t, d = save_tiny_pair(tmp_path)
    r = CliRunner().invoke(app, ["generate", "def f(x):", "--target", str(t), "--draft", str(d), "--raw", "-n", "24"])
    assert r.exit_code == 0, r.output
    line = [x for x in r.stderr.splitlines() if "drafted nothing" in x]
    assert len(line) == 1 and "budget 0: on this machine a tree costs more than the drafts win back" in line[0]
    assert "forces one" in line[0] and "--v-max" in line[0] and "`v_max`" not in line[0]
    assert "no room left" not in r.stderr
