"""Task correctness: code pass@1 (sandboxed, only when the user allows it) and GSM8K accuracy.

Code is graded only with --allow-code-exec: grading means running model-written programs, and
the sandbox (cure_cli/sandbox.py) is a guard against accidents, not a security boundary. Math
problems are graded by final-number extraction, which runs nothing.
"""
from __future__ import annotations

from typing import Sequence

REFUSAL = ("code pass@1 not scored: grading runs model-written code; pass --allow-code-exec to run it in "
           "cure's sandbox (speed and acceptance are reported either way)")


def gradable(problem) -> str | None:
    """'pass@1' (code with tests), 'accuracy' (math with an answer) or None (ungraded)."""
    if problem.kind == "math" and problem.answer is not None:
        return "accuracy"
    if problem.kind == "code" and problem.tests:
        return "pass@1"
    return None


def needs_exec(problems: Sequence) -> bool:
    return any(gradable(p) == "pass@1" for p in problems)


class Scorer:
    """Grades completions; identical programs for the same task are run once (lossless runs
    produce the same text under every strategy, so this saves most sandbox runs)."""

    def __init__(self, allow_code_exec: bool, timeout_s: float = 10.0):
        self.allow = allow_code_exec
        self.timeout_s = timeout_s
        self._cache: dict[tuple[str, str], dict] = {}

    def __call__(self, problem, completion: str) -> dict | None:
        kind = gradable(problem)
        if kind == "accuracy":
            from cure_cli.datasets import extract_final_number, gsm8k_correct
            return {"metric": kind, "passed": bool(gsm8k_correct(completion, problem.answer)),
                    "predicted": extract_final_number(completion), "answer": problem.answer}
        if kind == "pass@1" and self.allow:
            from cure_cli.datasets import extract_code
            program = extract_code(completion, problem)
            key = (problem.task_id, program)
            if key not in self._cache:
                self._cache[key] = self._run(problem, program)
            return dict(self._cache[key])
        return None

    def _run(self, problem, program: str) -> dict:
        from cure_cli import sandbox
        if problem.dataset == "lcb-lite":
            from cure_cli.datasets import io_cases
            cases = io_cases(problem)
            if problem.entry_point:
                res = sandbox.check_functional(program, cases, problem.entry_point, timeout_s=self.timeout_s)
            else:
                res = sandbox.check_stdio(program, cases, timeout_s=self.timeout_s)
        else:
            res = sandbox.check_correctness(program, problem.tests, problem.entry_point, timeout_s=self.timeout_s)
        return {"metric": "pass@1", "passed": bool(res.passed), "status": res.status}


def summarize_scores(pairs: Sequence, run_names: Sequence[str], prompt_indices: Sequence[int]) -> dict:
    """Per run over the compared prompts: {"metric", "passed", "scored", "rate"} (None when nothing
    was graded)."""
    keep = set(prompt_indices)
    out = {}
    for name in run_names:
        scored = [p.score for p in pairs if p.run == name and p.prompt_index in keep and p.score]
        if not scored:
            out[name] = None
            continue
        metrics = sorted({s["metric"] for s in scored})
        passed = sum(bool(s["passed"]) for s in scored)
        out[name] = {"metric": "/".join(metrics), "passed": passed, "scored": len(scored),
                     "rate": passed / len(scored)}
    return out
