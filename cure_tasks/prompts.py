"""Custom prompts: a local jsonl with at least ``prompt``; optional task_id, kind, answer, tests,
entry_point (other fields go to meta). Code prompts with tests are graded like HumanEval's; math
prompts with an answer like GSM8K's; the rest are timed only."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import gsm8k
from .common import DatasetError, Problem, fenced_code, field_of, local_file, read_jsonl, run_tests, take

NAME = "prompts"
RAW = False


def load(path: str | Path | None = None, limit: int | None = None) -> list[Problem]:
    source = local_file(path, NAME, 'write a .jsonl file with one {"prompt": "...", "task_id": "..."} per line')
    problems = []
    known = {"prompt", "task_id", "kind", "answer", "tests", "entry_point"}
    for i, rec in enumerate(read_jsonl(source)):
        where = f"{source} record {i}"
        prompt = field_of(rec, "prompt", where)
        if not isinstance(prompt, str):
            raise DatasetError(f"{where}: 'prompt' must be a string")
        kind = str(rec.get("kind", "code"))
        if kind not in ("code", "math"):
            raise DatasetError(f"{where}: 'kind' must be 'code' or 'math', got {kind!r}")
        problems.append(Problem(
            task_id=str(rec.get("task_id", f"prompt/{i}")), prompt=prompt, kind=kind,
            tests=_optional_str(rec.get("tests")), entry_point=_optional_str(rec.get("entry_point")),
            answer=_optional_str(rec.get("answer")), meta={k: v for k, v in rec.items() if k not in known},
            dataset=NAME))
    return take(problems, limit)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def program(problem: Problem, completion: str) -> str:
    fenced = fenced_code(completion, problem.entry_point)
    return fenced if fenced is not None else completion


def grade(problem: Problem, completion: str, timeout_s: float = 10.0) -> dict | None:
    if problem.kind == "math":
        return gsm8k.grade(problem, completion) if problem.answer is not None else None
    return run_tests(program(problem, completion), problem, timeout_s) if problem.tests else None
