"""MBPP from a local file (upstream ``mbpp.jsonl`` or the sanitized JSON array), graded by its asserts.

Upstream lines: text, code, task_id, test_list, test_setup_code, challenge_test_list.
Sanitized records: prompt (instead of text), code, task_id, test_list, test_imports.
prompt = ``'\"\"\"\\n<description>\\n<first test>\\n\"\"\"\\n'`` (the usual MBPP style: the
description plus one test as a usage example); tests = imports + setup + all test asserts.
"""
from __future__ import annotations

import re
from pathlib import Path

from .common import (DatasetError, Problem, fenced_code, field_of, local_file, read_jsonl, run_tests, take,
                     truncate_at_stops)

NAME = "mbpp"
RAW = True
HINT = ("download mbpp.jsonl or sanitized-mbpp.json from "
        "https://github.com/google-research/google-research/tree/master/mbpp")
# MBPP completions are whole programs (helpers allowed), so only test/driver code stops them.
STOPS = ("\nassert ", '\n"""', "\nif __name__", "\nprint(", "\n```")


def load(path: str | Path | None = None, limit: int | None = None) -> list[Problem]:
    source = local_file(path, NAME, HINT)
    problems = []
    for i, rec in enumerate(read_jsonl(source, array_ok=True)):
        where = f"{source} record {i}"
        description = rec.get("text", rec.get("prompt"))
        if not isinstance(description, str):
            raise DatasetError(f"{where}: missing field 'text' (or 'prompt')")
        test_list = field_of(rec, "test_list", where)
        if not isinstance(test_list, list) or not test_list:
            raise DatasetError(f"{where}: 'test_list' must be a non-empty list of asserts")
        code = str(rec.get("code", ""))
        setup = [str(line) for line in rec.get("test_imports", [])]
        if rec.get("test_setup_code"):
            setup.append(str(rec["test_setup_code"]))
        problems.append(Problem(
            task_id=f"mbpp/{field_of(rec, 'task_id', where)}",
            prompt=f'"""\n{description.strip()}\n{test_list[0]}\n"""\n', kind="code",
            tests="\n".join([*setup, *map(str, test_list)]) + "\n",
            entry_point=_entry_point(code, str(test_list[0])),
            meta={"reference_code": code, "challenge_tests": list(rec.get("challenge_test_list", []))},
            dataset=NAME))
    return take(problems, limit)


_NOT_ENTRY_POINTS = frozenset(
    {"set", "list", "tuple", "sorted", "abs", "round", "isclose", "math", "len", "str", "int",
     "float", "dict", "frozenset", "all", "any", "sum", "min", "max"})


def _entry_point(code: str, first_test: str) -> str | None:
    """The reference solution's function that the first test calls (else its first def)."""
    defined = re.findall(r"^def\s+(\w+)\s*\(", code, re.MULTILINE)
    called = set(re.findall(r"(\w+)\s*\(", first_test))
    for name in defined:
        if name in called:
            return name
    if defined:
        return defined[0]
    names = [n for n in re.findall(r"(\w+)\s*\(", first_test) if n not in _NOT_ENTRY_POINTS]
    return names[0] if names else None


def program(problem: Problem, completion: str) -> str:
    """A ```python block alone, else the raw completion cut at STOPS."""
    fenced = fenced_code(completion, problem.entry_point)
    return fenced if fenced is not None else truncate_at_stops(completion, STOPS)


def grade(problem: Problem, completion: str, timeout_s: float = 10.0) -> dict:
    return run_tests(program(problem, completion), problem, timeout_s)
