"""Benchmark tasks, one module each (nanochat `tasks/` style): `load()` the problems, `grade()` one
completion. Scoring is a lookup in TASKS, never a switch on the name.

    from cure_tasks import load, grade
    problems = load("humaneval", limit=20)
    score = grade(problems[0], completion, allow_exec=True)   # {"metric": "pass@1", "passed": ...}

Code is graded only when the caller allows it: grading runs model-written programs (sandbox.py).
"""
from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Sequence

from . import gsm8k, humaneval, lcb_lite, mbpp, prompts
from .common import DatasetError, IOCase, Problem, truncate_at_stops

TASKS: dict[str, ModuleType] = {m.NAME: m for m in (humaneval, gsm8k, mbpp, lcb_lite, prompts)}
TASK_NAMES = tuple(TASKS)

REFUSAL = ("code pass@1 not scored: grading runs model-written code; pass --allow-code-exec to run it in "
           "cure's sandbox (speed and acceptance are reported either way)")

__all__ = ["TASKS", "TASK_NAMES", "DatasetError", "IOCase", "Problem", "load", "load_set", "grade", "gradable",
           "needs_exec", "extract_code", "raw_by_default", "truncate_at_stops", "REFUSAL"]


def task(name: str) -> ModuleType:
    if name not in TASKS:
        raise DatasetError(f"unknown data set {name!r}: choose one of {', '.join(TASK_NAMES)}")
    return TASKS[name]


def load(name: str, data_path: str | Path | None = None, limit: int | None = None) -> list[Problem]:
    """The problems of a task: humaneval and gsm8k come from their packages unless `data_path` points
    elsewhere; mbpp, lcb-lite and prompts need `data_path`."""
    return task(name).load(data_path, limit)


def load_set(spec: str, limit: int | None = None) -> tuple[str, str, list[Problem]]:
    """A prompt set named on a command line -> (set name, task, problems): a task name, `task@N` (skip its
    first N problems: held-out ranges such as humaneval@20), or a prompts .jsonl file (named by its stem).
    `limit` problems at most, after the skipped ones."""
    name, _, skip = spec.partition("@")
    try:
        offset = int(skip) if skip else 0
    except ValueError:
        raise DatasetError(f"{spec!r}: the part after @ must be a number of problems to skip") from None
    if name in TASKS:
        problems = load(name, None, None if limit is None else offset + limit)[offset:]
        return spec, name, problems
    problems = load("prompts", name, None if limit is None else offset + limit)[offset:]
    return Path(name).stem + (f"@{offset}" if offset else ""), "prompts", problems


def raw_by_default(name: str) -> bool:
    """Completion-style tasks (a signature + docstring to continue) skip the chat template."""
    return task(name).RAW


def gradable(problem: Problem) -> str | None:
    """'pass@1' (code with tests), 'accuracy' (math with an answer) or None (ungraded)."""
    if problem.kind == "math" and problem.answer is not None:
        return "accuracy"
    if problem.kind == "code" and problem.tests:
        return "pass@1"
    return None


def needs_exec(problems: Sequence[Problem]) -> bool:
    return any(gradable(p) == "pass@1" for p in problems)


def extract_code(completion: str, problem: Problem) -> str:
    """The program a code task would run for `completion`."""
    return task(problem.dataset).program(problem, completion)


def grade(problem: Problem, completion: str, *, allow_exec: bool = False, timeout_s: float = 10.0) -> dict | None:
    """The task's verdict on one completion, or None when it is not graded (no tests / answer, or code
    that may not be run)."""
    metric = gradable(problem)
    if metric is None or (metric == "pass@1" and not allow_exec):
        return None
    return task(problem.dataset).grade(problem, completion, timeout_s=timeout_s)
