"""Crafted files and flags, round 2 (issue #60): a trace block of 200,000 nodes in `cure inspect`, JSON
nested too deeply in a task's data file, hostile saved chats, an out-of-range --seed. Each ends in bounded
work or one clear line (exit code 2), never a hang or a traceback."""
from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cure_cli.chat_sessions import ChatSession, TurnRecord, find_session, list_sessions
from cure_cli.main import app as cli
from cure_cli.tui.app_inspect import InspectApp
from cure_cli.tui.widgets import RepairTree
from cure_core.trace import read_trace
from cure_tasks import DatasetError, load

SAMPLE = Path(__file__).parent / "data" / "sample_trace.jsonl"
LINES = SAMPLE.read_text().splitlines()
FIRST_BLOCK = next(i for i, line in enumerate(LINES) if json.loads(line)["type"] == "block")
N = 200_000


# --------------------------------------------------------------------------------------------
# 3. `cure inspect` on a block of 200,000 nodes: drawn bounded, keys live.
# --------------------------------------------------------------------------------------------
def huge_block(shape: str) -> list[str]:
    record = json.loads(LINES[FIRST_BLOCK])
    if shape == "a branch per depth":
        nodes = [{"token": 63, "parent": i - 1, "depth": i + 1, "branch": i, "accepted": False} for i in range(N)]
        accepted, emitted = [], [record["bonus"]]
    elif shape == "an accepted chain":
        nodes = [{"token": 63, "parent": i - 1, "depth": i + 1, "branch": 0, "accepted": True} for i in range(N)]
        accepted, emitted = list(range(N)), [63] * N + [record["bonus"]]
    else:
        nodes = [{"token": 63, "parent": -1, "depth": 1, "branch": i, "accepted": False} for i in range(N)]
        accepted, emitted = [], [record["bonus"]]
    record.update(nodes=nodes, accepted=accepted, emitted=emitted, branch0_accepted=len(accepted))
    return LINES[:FIRST_BLOCK] + [json.dumps(record)] + LINES[FIRST_BLOCK + 1:]


@pytest.mark.parametrize("shape", ["a branch per depth", "an accepted chain", "one depth"])
def test_inspect_stays_live_on_a_block_of_200000_nodes(tmp_path, shape):
    path = tmp_path / "huge.jsonl"
    path.write_text("\n".join(huge_block(shape)) + "\n")
    started = time.monotonic()
    trace = read_trace(path)

    async def drive():
        app = InspectApp(trace, None)
        async with app.run_test(size=(100, 30)) as pilot:
            tree = app.query_one(RepairTree)
            drawn = tree.query_one("#tree-body").render().plain
            assert "not drawn" in drawn and "200000 nodes in all" in drawn
            assert len(drawn) < 100_000 and drawn.count("\n") < 300
            await pilot.press("n")
            assert app.current == 1
            await pilot.press("p")
            assert app.current == 0
            await pilot.press("q")
        assert app.return_code == 0 or app.return_code is None

    asyncio.run(asyncio.wait_for(drive(), timeout=60))
    assert time.monotonic() - started < 30


# --------------------------------------------------------------------------------------------
# 4. JSON nested too deeply in a data file: one DatasetError line through the one reader.
# --------------------------------------------------------------------------------------------
DEEP = "[" * 100_000


def mbpp_record(**fields) -> dict:
    return {"text": "add", "code": "def add(a, b):\n    return a + b", "task_id": 1,
            "test_list": ["assert add(1, 2) == 3"], **fields}


CRAFTED_DATA = {
    "mbpp: a line of nested [": ("mbpp", "data.jsonl", DEEP + "\n"),
    "mbpp: an array nested inside": ("mbpp", "data.json", "[" + DEEP + "]"),
    "mbpp: a field nested": ("mbpp", "data.jsonl", '{"text": ' + DEEP + "}\n"),
    "mbpp: gzip": ("mbpp", "data.jsonl.gz", DEEP + "\n"),
    "humaneval: a line": ("humaneval", "data.jsonl", DEEP + "\n"),
    "gsm8k: a line": ("gsm8k", "data.jsonl", DEEP + "\n"),
    "prompts: a line": ("prompts", "data.jsonl", "{" + '"a":' * 50_000 + "1" + "}" * 50_000 + "\n"),
    "lcb-lite: a line": ("lcb-lite", "data.jsonl", DEEP + "\n"),
}


def write(path: Path, text: str) -> None:
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


@pytest.mark.parametrize("name", CRAFTED_DATA)
def test_deeply_nested_data_is_one_dataset_error(tmp_path, name):
    task, file_name, text = CRAFTED_DATA[name]
    path = tmp_path / file_name
    write(path, text)
    with pytest.raises(DatasetError) as info:
        load(task, data_path=path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_lcb_json_field_nested_too_deeply(tmp_path):
    record = {"question_id": "q1", "question_content": "x", "public_test_cases": DEEP,
              "private_test_cases": "[]", "starter_code": "", "metadata": "{}"}
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(DatasetError, match="nested too deeply"):
        load("lcb-lite", data_path=path)


def test_bench_mbpp_on_nested_data_is_one_line(tmp_path):
    path = tmp_path / "mbpp.jsonl"
    path.write_text(DEEP + "\n")
    r = CliRunner().invoke(cli, ["bench", "mbpp", "--data", str(path)])
    assert r.exit_code == 2 and "Traceback" not in r.output and "RecursionError" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "nested too deeply" in r.output


def test_sanitized_mbpp_array_still_loads(tmp_path):
    path = tmp_path / "sanitized.json"
    path.write_text(json.dumps([mbpp_record(prompt="add two numbers", test_imports=[])]))
    (problem,) = load("mbpp", data_path=path)
    assert problem.entry_point == "add" and "assert add(1, 2) == 3" in problem.tests


# --------------------------------------------------------------------------------------------
# 5. Hostile saved chats: each skipped with one warning line, the rest listed; --resume one line.
# --------------------------------------------------------------------------------------------
def good_chat(store: Path, cid: str, title: str) -> None:
    s = ChatSession(id=cid, dir=store, models={"target": "tiny"})
    s.turns = [TurnRecord(prompt=title, answer="ok", strategy="cure", config={}, status="done")]
    s.save()


def saved(**changes) -> str:
    base = {"schema": 1, "id": "20260102-120000-bad0", "created": "", "updated": "2026-01-02T12:00:00",
            "models": {}, "engine": {}, "settings": {}, "thinking": None, "turns": [], "messages": []}
    return json.dumps({**base, **changes})


CRAFTED_CHATS = {
    "schema 1e999": saved().replace('"schema": 1', '"schema": 1e999'),
    "updated a number": saved(updated=5),
    "updated a list": saved(updated=[1]),
    "created a dict": saved(created={}),
    "id a path": saved(id="../../escape"),
    "id a number": saved(id=7),
    "turns a string": saved(turns="abc"),
    "a turn with a number prompt": saved(turns=[{"prompt": 1, "answer": "", "strategy": "cure", "config": {},
                                                 "status": "done"}]),
    "a turn with text stats": saved(turns=[{"prompt": "p", "answer": "", "strategy": "cure", "config": {},
                                            "status": "done", "stats": {"tau": "fast"}}]),
    "engine holding a dict": saved(engine={"target": {"x": 1}}),
    "thinking a string": saved(thinking="yes"),
    "nested too deeply": "[" * 100_000,
    "not UTF-8": b"\xff\xfe{}",
}


def test_one_bad_chat_is_skipped_with_one_warning_and_the_rest_listed(tmp_path):
    store = tmp_path / "chats"
    good_chat(store, "20260101-120000-aaa0", "older chat")
    good_chat(store, "20260103-120000-ccc0", "newer chat")
    for i, (name, text) in enumerate(CRAFTED_CHATS.items()):
        path = store / f"crafted{i:02d}.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    warnings: list[tuple[str, str]] = []
    chats = list_sessions(store, warn=lambda path, why: warnings.append((path.name, why)))
    assert [c.id for c in chats] == ["20260103-120000-ccc0", "20260101-120000-aaa0"]
    assert len(warnings) == len(CRAFTED_CHATS), warnings
    assert all("\n" not in why and "Traceback" not in why for _, why in warnings)
    assert find_session(None, store).id == "20260103-120000-ccc0"


def test_chat_list_and_resume_on_the_command_line_with_bad_chats(tmp_path, monkeypatch):
    monkeypatch.setenv("CURE_DATA", str(tmp_path))
    store = tmp_path / "chats"
    good_chat(store, "20260101-120000-aaa0", "good")
    (store / "20260102-120000-bad0.json").write_text(CRAFTED_CHATS["schema 1e999"])
    (store / "20260102-130000-bad1.json").write_text(saved(id="20260102-130000-bad1", updated=5))
    r = CliRunner().invoke(cli, ["chat", "--list"])
    assert r.exit_code == 0 and "good" in r.output and "Traceback" not in r.output, r.output
    assert r.output.count("warning: skipped a saved chat") == 2
    r = CliRunner().invoke(cli, ["chat", "--resume", "20260102-120000-bad0"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "schema" in r.output


# --------------------------------------------------------------------------------------------
# --seed out of range: a usage error naming the flag, exit 2, no raw overflow message.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [str(10 ** 23), "-1", str(2 ** 64), "9" * 200])
def test_seed_out_of_range_names_the_flag(seed):
    r = CliRunner().invoke(cli, ["generate", "--seed", seed, "hi"])
    assert r.exit_code == 2, r.output
    assert "--seed" in r.output and "Overflow" not in r.output and "Traceback" not in r.output


def test_seed_at_its_bounds_is_taken():
    from cure_core.options import EngineArgs
    assert EngineArgs.__dataclass_fields__["seed"].metadata["bounds"] == (0, 2 ** 64 - 1)
