"""benchmarks/common.py: the flags every benchmark script shares, their checks, the JSON write, the main tail."""
import json

import pytest

from conftest import benchmark_script
from cure_core.errors import CureError


@pytest.fixture
def common():
    with benchmark_script("common") as mod:
        yield mod


def _parser(common):
    ap = common.parser("a script\n\nwith a body")
    common.add_sets(ap, default="humaneval")
    common.add_threads(ap)
    common.add_tiny(ap)
    common.add_json(ap)
    return ap


def test_the_shared_flags_parse_with_their_defaults(common, tmp_path):
    ap = _parser(common)
    args = common.check(ap, ap.parse_args([]))
    assert (args.sets, args.limit, args.threads, args.tiny, args.json) == ("humaneval", 20, None, False, None)
    out = tmp_path / "new" / "r.json"
    args = common.check(ap, ap.parse_args(["--sets", "gsm8k@20", "--limit", "3", "--threads", "2", "--tiny",
                                           "--out", str(out)]))
    assert (args.sets, args.limit, args.threads, args.tiny, args.json) == ("gsm8k@20", 3, 2, True, str(out))
    assert out.parent.is_dir()                                   # made before the run, not after it


@pytest.mark.parametrize("argv, message", [
    (["--threads", "0"], "--threads must be >= 1"),
    (["--limit", "0"], "--limit must be >= 1"),
])
def test_bad_shared_flags_are_one_line_and_exit_2(common, capsys, argv, message):
    ap = _parser(common)
    with pytest.raises(SystemExit) as e:
        common.check(ap, ap.parse_args(argv))
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(common, tmp_path, capsys):
    ap = _parser(common)
    with pytest.raises(SystemExit) as e:
        common.check(ap, ap.parse_args(["--json", str(tmp_path)]))           # a folder, not a file
    assert e.value.code == 2 and "not a writable file path" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as e:
        common.check(ap, ap.parse_args(["--json", str(blocker / "r.json")]))  # its folder is a file
    assert e.value.code == 2 and "cannot make its folder" in capsys.readouterr().err


def test_write_json_writes_only_with_a_path_and_says_so(common, tmp_path):
    said = []
    report = {"a": [1, 2.5], "b": None}
    assert common.write_json(None, report, say=said.append) is report and said == []
    path = tmp_path / "r.json"
    assert common.write_json(path, report, say=said.append) is report
    assert json.loads(path.read_text()) == report and said == [f"wrote {path}"]


def test_set_threads_applies_the_count(common):
    import torch
    before = torch.get_num_threads()
    try:
        assert common.set_threads(1) == 1 == torch.get_num_threads()
        assert common.set_threads(None) == 1                      # None leaves torch's count as it is
    finally:
        torch.set_num_threads(before)


def test_entry_turns_bad_input_into_one_line_and_exit_2(common, capsys):
    def bad():
        raise CureError("no such prompt set: nope")
    with pytest.raises(SystemExit) as e:
        common.entry(bad)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == "error: no such prompt set: nope\n"
    ran = []
    common.entry(lambda: ran.append(1))
    assert ran == [1]


def test_other_errors_are_not_swallowed(common):
    def broken():
        raise ValueError("a bug")
    with pytest.raises(ValueError):
        common.entry(broken)


def test_every_script_takes_its_shared_flags_from_common():
    """No benchmark script declares a shared flag itself (one declaration, here)."""
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    for path in root.glob("*.py"):
        if path.name == "common.py":
            continue
        text = path.read_text()
        for flag in ("--threads", "--json", "--tiny", "--sets", "--limit", "--out"):
            assert f'add_argument("{flag}"' not in text, f"{path.name} declares {flag}"
