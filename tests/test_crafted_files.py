"""Crafted traces and progress files (issue #18): read_trace, `cure inspect`, `cure analyze` and
`cure bench --resume` check every record by type and range, so a hostile file ends in one clear line and
exit code 2: never a traceback, a crash inside the TUI, a hang or a MemoryError."""
import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cure_cli.bench.runner import BenchError, ProgressLog
from cure_cli.main import app
from cure_core.errors import TraceError
from cure_core.trace import read_trace

SAMPLE = Path(__file__).parent / "data" / "sample_trace.jsonl"
LINES = SAMPLE.read_text().splitlines()
FIRST_BLOCK = next(i for i, line in enumerate(LINES) if json.loads(line)["type"] == "block")


def with_block(change) -> list[str]:
    """The sample trace with its first block record changed by ``change(record)``."""
    record = json.loads(LINES[FIRST_BLOCK])
    change(record)
    return LINES[:FIRST_BLOCK] + [json.dumps(record)] + LINES[FIRST_BLOCK + 1:]


def with_line(index: int, text: str) -> list[str]:
    return LINES[:index] + [text] + LINES[index + 1:]


def node(i: int, **changes):
    def change(record):
        record["nodes"][i].update(changes)
    return change


def setter(key, value):
    def change(record):
        record[key] = value
    return change


CRAFTED = [
    ("node at depth 1e9", with_block(node(0, depth=10 ** 9)), "depth"),
    ("depth skipping a level", with_block(node(1, depth=5)), "depth"),
    ("parent after the child", with_block(node(0, parent=3)), "parent"),
    ("parent below -1", with_block(node(1, parent=-7)), "parent"),
    ("accepted index out of range", with_block(setter("accepted", [0, 10 ** 6])), "accepted"),
    ("negative accepted index", with_block(setter("accepted", [-1])), "accepted"),
    ("UFP position past the draft", with_block(lambda r: r["ufps"][0].update(position=99)), "position"),
    ("nodes is a string", with_block(setter("nodes", "abc")), "nodes"),
    ("token is a float", with_block(node(0, token=1.5)), "token"),
    ("token is 1e400", [line.replace('"token":236', '"token":1e400', 1) for line in LINES], "token"),
    ("accepted flag is a string", with_block(node(0, accepted="yes")), "accepted"),
    ("timings are strings", with_block(lambda r: r["timings"].update(verify_ms="fast")), "verify_ms"),
    ("unknown block field", with_block(setter("evil", 1)), "unknown"),
    ("block of an unknown generation", with_block(setter("generation", 7)), "never begun"),
    ("prompt_ids is an object", with_line(1, json.dumps({**json.loads(LINES[1]), "prompt_ids": {"a": 1}})),
     "prompt_ids"),
    ("tau_margin is a string", with_line(1, json.dumps({**json.loads(LINES[1]),
                                                         "config": {"tau_margin": "wide"}})), "tau_margin"),
    ("header config is a list", with_line(0, json.dumps({**json.loads(LINES[0]), "config": []})), "config"),
    ("a JSON array line", with_line(2, "[1, 2, 3]"), "not a JSON object"),
    ("deep nesting", with_line(2, "[" * 200_000 + "]" * 200_000), "nested too deeply"),
    ("not UTF-8", with_line(2, "\udcff"), "UTF-8"),
]


def write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "crafted.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + b"\n")
    return path


@pytest.mark.parametrize("lines,message", [c[1:] for c in CRAFTED], ids=[c[0] for c in CRAFTED])
def test_crafted_trace_is_one_clear_error(tmp_path, lines, message):
    path = write(tmp_path, lines)
    with pytest.raises(TraceError, match=message) as err:
        read_trace(path)
    assert "\n" not in str(err.value)
    for command in ("inspect", "analyze"):
        r = CliRunner().invoke(app, [command, str(path)])
        assert r.exit_code == 2, (command, r.output)
        assert "Traceback" not in r.output and message in r.output
        assert len(r.output.strip().splitlines()) == 1, r.output


def test_sample_trace_still_reads():
    assert len(read_trace(SAMPLE).blocks) > 10


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_device_files_are_refused_at_once(path):
    start = time.monotonic()
    with pytest.raises(TraceError, match="not a regular file"):
        read_trace(path)
    assert time.monotonic() - start < 2


def test_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    r = CliRunner().invoke(app, ["inspect", str(fifo)])
    assert r.exit_code == 2 and "not a regular file" in r.output


# ---------------------------------------------------------------- bench --resume

FP = {"dataset": "prompts", "models": {"target": "t"}, "runs": {"ar": {"k": 4}}}


def progress(tmp_path: Path, *records) -> Path:
    header = json.dumps({"type": "header", "fingerprint": FP})
    (tmp_path / "progress.jsonl").write_text("\n".join([header, *records]) + "\n")
    return tmp_path


def pair_record(**changes) -> str:
    block = {k: v for k, v in json.loads(LINES[FIRST_BLOCK]).items() if k not in ("type", "generation")}
    record = {"type": "pair", "prompt_index": 0, "task_id": "t0", "run": "ar", "strategy": "cure",
              "prompt_ids": [1, 2], "token_ids": [3], "completion": "x", "score": None, "blocks": [block]}
    record.update(changes)
    return json.dumps(record)


@pytest.mark.parametrize("records,message", [
    ([pair_record(prompt_index="zero"), pair_record()], "prompt_index"),
    ([pair_record(blocks="none"), pair_record()], "blocks"),
    ([pair_record(score={"passed": "yes", "metric": "pass@1"}), pair_record()], "passed"),
    ([pair_record(score={"passed": True}), pair_record()], "metric"),
    (["[" * 200_000 + "]" * 200_000, pair_record()], "nested too deeply"),
    ([json.dumps({"type": "pair", "blocks": [{"nodes": [{"depth": 1e9}]}]}), pair_record()], "corrupt progress"),
])
def test_crafted_progress_is_one_clear_error(tmp_path, records, message):
    out = progress(tmp_path, *records)
    with pytest.raises(BenchError, match=message) as err:
        ProgressLog(out, FP, resume=True)
    assert "\n" not in str(err.value) and "cannot resume" in str(err.value)


def test_crafted_progress_header_is_one_clear_error(tmp_path):
    (tmp_path / "progress.jsonl").write_text(json.dumps({"type": "header", "fingerprint": {"runs": []}}) + "\n")
    with pytest.raises(BenchError, match="fingerprint runs"):
        ProgressLog(tmp_path, FP, resume=True)
    (tmp_path / "progress.jsonl").write_text("[]\n")
    with pytest.raises(BenchError, match="not a JSON object"):
        ProgressLog(tmp_path, FP, resume=True)


def test_progress_on_dev_zero_is_refused(tmp_path):
    (tmp_path / "progress.jsonl").symlink_to("/dev/zero")
    with pytest.raises(BenchError, match="not a regular file"):
        ProgressLog(tmp_path, FP, resume=True)


def test_valid_pairs_load_and_a_torn_tail_is_dropped(tmp_path):
    out = progress(tmp_path, pair_record(), pair_record(run="ar", prompt_index=1))
    with (out / "progress.jsonl").open("a") as f:
        f.write('{"type": "pair", "prom')
    log = ProgressLog(out, FP, resume=True)
    log.close()
    assert [p.key for p in log.pairs] == [(0, "ar"), (1, "ar")]
    assert (out / "progress.jsonl").read_text().endswith("}\n")
