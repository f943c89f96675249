"""What every benchmark task shares: the Problem record, data-file helpers, code extraction.

A task module (humaneval.py, gsm8k.py, ...) has `load(path, limit) -> list[Problem]` and
`grade(problem, completion, allow_exec) -> dict | None`; this module holds the pieces they share.
When data is missing a loader raises DatasetError whose message is one line saying how to get it.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from cure_core.errors import CureError
from cure_core.records import RecordError, parse_line


class DatasetError(CureError, RuntimeError):
    """The data set is missing or malformed; the message says how to get or fix it."""


@dataclass(frozen=True)
class Problem:
    """One benchmark prompt.

    kind: ``"code"`` (graded by running ``tests``) or ``"math"`` (graded against ``answer``).
    tests: HumanEval/MBPP: Python test code to append to the program; lcb-lite: a JSON list of
    ``{input, output, testtype}`` (read it with :func:`cure_tasks.lcb_lite.io_cases`); None when ungraded.
    dataset: the task that made it (``humaneval``, ``gsm8k``, ``mbpp``, ``lcb-lite``, ``prompts``).
    """

    task_id: str
    prompt: str
    kind: str
    tests: str | None = None
    entry_point: str | None = None
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    dataset: str = "prompts"


@dataclass(frozen=True)
class IOCase:
    """One LiveCodeBench test: stdin text and expected stdout, or JSON args and return value."""

    input: str
    output: str
    testtype: str  # "stdin" | "functional"


def take(problems: list[Problem], limit: int | None) -> list[Problem]:
    if limit is None:
        return problems
    if limit < 0:
        raise DatasetError(f"limit must be >= 0, got {limit}")
    return problems[:limit]


def package_file(package: str, relative: str, pip_spec: str) -> Path:
    """Path of a data file inside an installed package, found without importing the package."""
    hint = f"pip install {pip_spec} (or pip install 'cure[bench]')"
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise DatasetError(f"the {package} package is not installed: {hint}")
    if spec.submodule_search_locations:
        base = Path(list(spec.submodule_search_locations)[0])
    elif spec.origin:
        base = Path(spec.origin).parent
    else:
        raise DatasetError(f"cannot locate the {package} package's files: reinstall with {hint}")
    path = base / relative
    if not path.is_file():
        raise DatasetError(f"{path} is missing from the {package} package: reinstall with {hint}")
    return path


def local_file(path: str | Path | None, what: str, how_to_get: str) -> Path:
    if path is None:
        raise DatasetError(f"{what} needs a local file (--data PATH): {how_to_get}")
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetError(f"{what} file not found: {p}: {how_to_get}")
    return p


def read_jsonl(path: Path, *, array_ok: bool = False) -> list[dict[str, Any]]:
    """Records of a .jsonl or .jsonl.gz file; blank lines skipped. ``array_ok``: a file whose text opens
    with ``[`` is one JSON array of objects instead (sanitized MBPP).

    Every task reads its file through here, so a malformed file (bad JSON, nesting too deep for the
    parser, not objects) is one DatasetError line, never a traceback."""
    opener = gzip.open if path.suffix == ".gz" else open
    out: list[dict[str, Any]] = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            if array_ok:
                text = f.read()
                if text.lstrip()[:1] == "[":
                    records = json_value(text, f"{path}")
                    if not all(isinstance(r, dict) for r in records):
                        raise DatasetError(f"{path}: expected a JSON array of objects")
                    return records
                f = text.splitlines()
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.append(parse_line(line, f"{path}:{lineno}: not valid JSON"))
                except RecordError as exc:
                    raise DatasetError(str(exc)) from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    return out


def json_value(text: str, where: str) -> Any:
    """``json.loads(text)``, with a bad or too deeply nested text as DatasetError "<where>: ..."."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise DatasetError(f"{where}: not valid JSON (nested too deeply)") from None


def field_of(record: dict[str, Any], name: str, where: str) -> Any:
    if name not in record:
        raise DatasetError(f"{where}: missing field {name!r}")
    return record[name]


# --------------------------------------------------------------------------------------------
# Turning a completion into a program
# --------------------------------------------------------------------------------------------
_FENCE_RE = re.compile(r"```([\w+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3")


def fenced_code(completion: str, entry_point: str | None) -> str | None:
    """The Python code in a ```python (or untagged) fence; an unclosed last fence counts.

    Rule: prefer the first block that defines the entry point, else the first python block.
    """
    blocks = [(tag.lower(), body) for tag, body in _FENCE_RE.findall(completion)]
    python_blocks = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    if not python_blocks:
        return None
    if entry_point:
        defines = re.compile(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
        for body in python_blocks:
            if defines.search(body):
                return body
    return python_blocks[0]


def truncate_at_stops(text: str, stops: Iterable[str]) -> str:
    """Cut ``text`` at the earliest stop sequence found after its first non-blank line.

    Rule: the first line is never a cut point, so a completion that opens with a top-level line
    (e.g. it re-emits ``def f(...):``) keeps that block.
    """
    first = re.search(r"\S", text)
    if first is None:
        return text
    after_first_line = text.find("\n", first.start())
    if after_first_line == -1:
        return text
    cuts = [i for i in (text.find(stop, after_first_line) for stop in stops) if i != -1]
    return text[: min(cuts)] if cuts else text


def run_tests(program: str, problem: Problem, timeout_s: float) -> dict:
    """pass@1 of a program followed by the problem's tests (HumanEval / MBPP / custom code prompts)."""
    from .sandbox import check_correctness
    res = check_correctness(program, problem.tests, problem.entry_point, timeout_s=timeout_s)
    return {"metric": "pass@1", "passed": bool(res.passed), "status": res.status}
