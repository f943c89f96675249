"""Task correctness for bench: each task grades itself (cure_tasks); this adds the cache and the summary.

Code is graded only with --allow-code-exec: grading means running model-written programs in the
sandbox (cure_tasks/sandbox.py). Math problems are graded by final-number extraction, which runs nothing.
"""
from __future__ import annotations

from typing import Sequence

from cure_tasks import REFUSAL, grade, needs_exec  # noqa: F401 - re-exported for bench_cmd
from cure_tasks.isolation import require_isolation


class Scorer:
    """Grades completions; identical completions of the same task are graded once (lossless runs
    produce the same text under every strategy, so this saves most sandbox runs)."""

    def __init__(self, allow_code_exec: bool, timeout_s: float = 10.0):
        if allow_code_exec:
            require_isolation()     # Rule: no code runs without OS isolation (one line saying what is missing)
        self.allow = allow_code_exec
        self.timeout_s = timeout_s
        self._cache: dict[tuple[str, str], dict | None] = {}

    def __call__(self, problem, completion: str) -> dict | None:
        key = (problem.task_id, completion)
        if key not in self._cache:
            self._cache[key] = grade(problem, completion, allow_exec=self.allow, timeout_s=self.timeout_s)
        verdict = self._cache[key]
        return dict(verdict) if verdict is not None else None


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
