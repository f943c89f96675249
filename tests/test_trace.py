"""Trace files: round trip, and clear errors for bad files."""
import json

import pytest

from cure_core.config import DecodeConfig
from cure_core.engine import Engine
from cure_core.errors import TraceError
from cure_core.trace import SCHEMA_VERSION, TraceWriter, read_trace


@pytest.fixture(scope="module")
def blocks(pair):
    return list(Engine(pair, DecodeConfig.of(strategy="cure", max_new_tokens=40, tau_margin=3.0)).generate(
        list(b"print('hi')")))


def write(path, blocks):
    with TraceWriter(path, models={"target": "tiny"}, config={}) as w:
        w.begin([1, 2], "p", "cure", {})
        for b in blocks:
            w.block(b)
        w.end()
    return path


def test_round_trip(tmp_path, blocks):
    trace = read_trace(write(tmp_path / "t.jsonl", blocks))
    assert trace.header["schema"] == SCHEMA_VERSION
    assert trace.blocks == blocks                       # exact: every field survives JSON
    assert trace.footer["status"] == "complete" and trace.footer["blocks"] == len(blocks)
    assert trace.generations[0].stats["new_tokens"] == sum(len(b.emitted) for b in blocks)


def test_failure_leaves_nothing_half_written(tmp_path, blocks):
    path = tmp_path / "t.jsonl"
    with pytest.raises(RuntimeError):
        with TraceWriter(path, models={}, config={}) as w:
            w.begin([1], None, "cure", {})
            w.block(blocks[0])
            raise RuntimeError("boom")
    assert not path.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mangle,expect", [
    (lambda lines: lines[:-1], "truncated"),
    (lambda lines: lines[:3] + ["{not json"] + lines[3:], "corrupt trace line"),
    (lambda lines: [json.dumps({**json.loads(lines[0]), "schema": SCHEMA_VERSION + 1})] + lines[1:], "newer cure"),
    (lambda lines: lines[1:], "not a cure trace"),
    (lambda lines: lines[:2] + [json.dumps({"type": "block", "generation": 0, "index": 0})] + lines[2:],
     "corrupt block record"),
    (lambda lines: [], "empty"),
])
def test_bad_traces_are_clear_errors(tmp_path, blocks, mangle, expect):
    lines = write(tmp_path / "t.jsonl", blocks).read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(mangle(lines)))
    with pytest.raises(TraceError, match=expect):
        read_trace(bad)


def test_missing_trace(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        read_trace(tmp_path / "nope.jsonl")
