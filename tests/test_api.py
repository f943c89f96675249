"""The public API and the one-owner rules of the layer between core and users (#15).

- `load()` decodes with the CLI's defaults: same tokens as `cure generate --json` (tiny checkpoints
  here; the README's example itself on the real embedded pair when it is cached);
- the engine keeps one budget tuner per config across generations (a chat of three turns);
- each engine flag is declared once, drafters are built only by the factory, and the core and the
  benchmark scripts never import the CLI (checked on the source tree).
"""
import json
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cure_cli.main import app
from cure_core import Block, DecodeConfig, Engine, EngineArgs, load
from cure_core.tiny import save_tiny_pair

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("api"))


def test_load_decodes_like_cure_generate(tiny_dirs):
    t, d = tiny_dirs
    model = load(target=str(t), draft=str(d))
    out = model.generate("def f(x):", max_new_tokens=24)
    r = runner.invoke(app, ["generate", "def f(x):", "--target", str(t), "--draft", str(d), "-n", "24", "--json"])
    assert r.exit_code == 0, r.output
    cli = json.loads(r.stdout)
    assert out.token_ids == cli["token_ids"] and out.text == cli["text"]
    assert model.config.auto_budget and model.draft_vocab == cli["draft_vocab"] == 16384   # the CLI's defaults
    blocks = list(model.stream("def f(x):", max_new_tokens=24))
    assert all(isinstance(b, Block) for b in blocks)
    assert [t for b in blocks for t in b.emitted] == out.token_ids
    mine = out.to_dict()                                    # --json's object is Generation.to_dict()
    assert set(mine) == set(cli) and set(mine["stats"]) == set(cli["stats"])
    assert {k: v for k, v in mine.items() if k != "stats"} == {k: v for k, v in cli.items() if k != "stats"}
    assert mine["stats"]["new_tokens"] == cli["stats"]["new_tokens"] == 24    # tau: the tuner's timing-led budgets


def test_stream_writes_the_trace_and_keeps_what_finished_when_stopped(tiny_dirs, tmp_path):
    """`LoadedPair.stream(prompt, trace=FILE)`: the whole generation as a complete trace; closed after two
    blocks, an interrupted trace of those two; closed before its first block, no file and no .part."""
    from cure_core.trace import read_trace
    t, d = tiny_dirs
    model = load(target=str(t), draft=str(d), strategy="cure")
    whole = model.generate("def f(x):", max_new_tokens=24, trace=tmp_path / "whole.jsonl")
    got = read_trace(tmp_path / "whole.jsonl")
    assert got.footer["status"] == "complete" and got.generations[0].token_ids == whole.token_ids
    assert got.generations[0].prompt == "def f(x):" and got.generations[0].strategy == "cure"
    assert got.header["models"] == model.pair.names and "thinking" in got.header
    stream = model.stream("def f(x):", max_new_tokens=24, trace=tmp_path / "cut.jsonl")
    first = [next(stream), next(stream)]
    stream.close()
    cut = read_trace(tmp_path / "cut.jsonl")
    assert cut.footer["status"] == "interrupted" and cut.generations[0].blocks == first
    model.stream("def f(x):", trace=tmp_path / "never.jsonl").close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.jsonl", "whole.jsonl"]


def test_load_refuses_unknown_options_with_the_field_names():
    from cure_core.config import ConfigError
    with pytest.raises(ConfigError, match="unknown option 'vmax'"):
        load(vmax=3)


def test_a_strategy_without_its_drafter_falls_back_to_ar_with_a_note(tiny_dirs):
    t, _ = tiny_dirs
    model = load(target=str(t), strategy="cure")          # no drafter ships for a tiny folder
    assert model.config.strategy == "ar" and "running 'ar'" in model.notes[0]
    assert model.pair.drafter is None                     # nothing loaded that will not run


def test_cure_repairs_the_chain_draft_where_the_defaults_say_so(tiny_dirs, monkeypatch):
    """catalog.CURE_OVER_CHAIN (the 1.5B pair's rule) on a tiny folder: cure alone loads the chain draft only,
    at the rule's K, says so in a note, drafts with the chain and decodes exactly as ar; with every strategy,
    parallel and ddtree draft blocks while cure and sd draft chains."""
    from cure_core import catalog
    t, d = tiny_dirs
    monkeypatch.setitem(catalog.AR_DRAFT_FOR, str(t), str(d))
    monkeypatch.setitem(catalog.CURE_OVER_CHAIN, str(t), 4)
    ar = load(target=str(t), strategy="ar").generate("def f(x):", max_new_tokens=20)
    model = load(target=str(t), strategy="cure")
    assert model.pair.drafter is None and model.pair.ar_drafter is not None and model.config.k == 4
    assert model.engine.pair.drafter_for("cure") is model.pair.ar_drafter
    assert any("cure repairs the chain draft" in n for n in model.notes)
    from cure_cli.tui.engine_protocol import ModelEngine
    assert ModelEngine(model).label == f"{t} ← {d} (cure repairs its chains)"      # what chat's header shows
    out = model.generate("def f(x):", max_new_tokens=20)
    assert out.token_ids == ar.token_ids and out.stats.tau > 1.0
    from cure_core.api import open_pair
    every = open_pair(EngineArgs(target=str(t), strategy="cure"), strategies=["ar", "sd", "parallel", "cure", "ddtree"])
    pair = every.engine.pair
    assert pair.drafter is not None and pair.ar_drafter is not None and pair.drafter is not pair.ar_drafter
    assert [pair.drafter_for(s) is pair.ar_drafter for s in ("sd", "cure", "parallel", "ddtree")] == [True, True, False, False]
    for s in ("cure", "ddtree", "parallel"):
        assert every.generate("def f(x):", max_new_tokens=20, strategy=s).token_ids == ar.token_ids, s
    # a named draft: every block strategy drafts with it, cure too
    named = load(target=str(t), draft=str(d), strategy="cure")
    assert named.engine.pair.drafter_for("cure") is named.pair.drafter


def test_a_chat_of_three_turns_keeps_one_tuner(tiny_dirs):
    from cure_cli.tui.engine_protocol import ModelEngine
    t, d = tiny_dirs
    loaded = load(target=str(t), draft=str(d), chat=False, max_new_tokens=12)
    chat = ModelEngine(loaded)
    messages = []
    seen = []
    for turn in ("def add(a, b):", "def sub(a, b):", "def mul(a, b):"):
        messages.append({"role": "user", "content": turn})
        blocks = list(chat.stream(messages, loaded.config))
        messages.append({"role": "assistant", "content": chat.decode([t for b in blocks for t in b.emitted])})
        seen.append((loaded.engine.tuner, len(loaded.engine.tuner.history)))
    tuners = {id(tuner) for tuner, _ in seen}
    assert len(tuners) == 1 and len(loaded.engine._policies) == 1
    assert seen[0][1] < seen[1][1] < seen[2][1]           # it kept learning from every turn


def test_the_tuner_is_shared_across_lengths_not_across_policies(tiny_dirs):
    t, d = tiny_dirs
    model = load(target=str(t), draft=str(d))
    model.generate("x = 1", max_new_tokens=4)
    model.generate("y = 2", max_new_tokens=9, seed=3)
    model.generate("z = 3", max_new_tokens=4, strategy="ddtree")
    assert len(model.engine._policies) == 2


def test_a_budget_given_per_call_is_fixed_and_auto_hands_it_to_the_tuner(tiny_dirs):
    """generate(v_max=N) decodes at budget N, as --v-max N does: no tuner (before, the defaults' tuner kept
    choosing under a ceiling of N, so a 'fixed budget' run depended on the clock)."""
    t, d = tiny_dirs
    model = load(target=str(t), draft=str(d), strategy="cure")           # v_max auto, the default
    fixed = model.config_for(v_max=20)
    assert (fixed.v_max, fixed.auto_budget) == (20, False)
    assert model.config_for(v_max="auto").auto_budget and model.config_for(max_new_tokens=5).auto_budget
    assert model.config_for(k=5).k == 5 and model.config_for(k=5).auto_budget
    model.generate("x = 1", max_new_tokens=6, v_max=20)
    assert model.engine.tuner_for(fixed) is None
    pinned = load(target=str(t), draft=str(d), strategy="cure", v_max=20)
    assert pinned.config_for(max_new_tokens=5).auto_budget is False
    assert pinned.config_for(v_max="auto").auto_budget is True


def test_engine_flags_are_declared_once():
    """No decoding command declares an engine flag itself: generate, chat and bench (and train-drafter's
    --target and --device) take them from EngineArgs. (train-drafter's and analyze's --seed seed training
    and a scorer, not sampling.)"""
    flags = [f.metadata["flags"][0].split("/")[0] for f in EngineArgs.__dataclass_fields__.values()]
    cli = ROOT / "cure_cli"
    decoding = [cli / "generate.py", cli / "chat_cmd.py", cli / "bench_cmd.py", cli / "common.py",
                *(cli / "tui").glob("*.py"), *(cli / "bench").glob("*.py")]
    for path, checked in [(p, flags) for p in decoding] + [(cli / "train_cmd.py", ["--target", "--device"])]:
        text = path.read_text()
        for flag in checked:
            assert not re.search(rf'typer\.Option\(\s*"{re.escape(flag)}"', text), f"{path.name} declares {flag}"
    for path in (ROOT / "benchmarks").glob("*.py"):
        text = path.read_text()
        for flag in ("--target", "--draft", "--v-max", "--draft-vocab", "--kernels"):
            assert f'add_argument("{flag}"' not in text, f"{path.name} declares {flag}"
    commands = {c.name or c.callback.__name__: {p.name for p in c.params} for c in _typer_commands()}
    engine = set(EngineArgs.__dataclass_fields__)
    assert engine <= commands["generate"] and engine <= commands["chat"]
    assert engine - {"strategy"} <= commands["bench"]


def _typer_commands():
    import typer.main
    return typer.main.get_command(app).commands.values()


def _git_grep(pattern: str, *paths: str) -> list[str]:
    r = subprocess.run(["git", "grep", "-n", "-E", pattern, "--", *paths], cwd=ROOT, capture_output=True, text=True)
    if r.returncode not in (0, 1) or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    return [line for line in r.stdout.splitlines() if line]


def test_drafters_are_built_only_by_the_factory():
    hits = _git_grep(r"(PardDrafter|ArDrafter|DFlashDrafter)\(", "cure_core", "cure_cli", "cure_tasks", "benchmarks")
    outside = [h for h in hits if not h.startswith(("cure_core/models.py", "cure_core/drafters/"))]
    assert outside == []


def test_the_core_and_the_benchmarks_never_import_the_cli():
    assert _git_grep(r"(from|import) cure_cli", "cure_core", "cure_tasks", "benchmarks") == []


def test_core_errors_name_fields_and_the_cli_shows_flags():
    from cure_cli.options import with_flags
    with pytest.raises(Exception) as e:
        DecodeConfig.from_user(k=16, v_max=3)
    assert "`v_max`" in str(e.value) and "--v-max" not in str(e.value)
    assert "raise --v-max or lower --k" in with_flags(str(e.value))
    assert with_flags("send raw text (`chat`=False)") == "send raw text (--raw)"
    assert with_flags("see `cure models` or `nothing`") == "see `cure models` or `nothing`"


@pytest.mark.real_models
def test_the_readme_example_equals_cure_generate():
    """The README's Python example, run as written, returns `cure generate --json`'s tokens (no flags)."""
    from cure_core.catalog import DEFAULT_TARGET
    from cure_core.embedded import model_status
    if not model_status(DEFAULT_TARGET).cached:
        pytest.skip(f"{DEFAULT_TARGET} is not cached")
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert len(code.strip().splitlines()) <= 5
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    prompt = re.search(r'generate\("([^"]+)"\)', code).group(1)
    r = runner.invoke(app, ["generate", prompt, "--json"])
    assert r.exit_code == 0, r.output
    assert scope["out"].token_ids == json.loads(r.stdout)["token_ids"]
