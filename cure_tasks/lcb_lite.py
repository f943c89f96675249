"""LiveCodeBench ``code_generation_lite`` from a local upstream jsonl, graded by its stdin/stdout or
functional test cases in the sandbox."""
from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

from .common import DatasetError, IOCase, Problem, fenced_code, field_of, json_value, local_file, read_jsonl, take

NAME = "lcb-lite"
RAW = False
# Upper bound on one decompressed LiveCodeBench private-test blob (the largest are ~100 MB).
_MAX_PRIVATE_TESTS_BYTES = 1 << 30

HINT = (
    "download test*.jsonl from the livecodebench/code_generation_lite data set on Hugging Face"
)
_LCB_STARTER_FORMAT = (
    "You will use the following starter code to write the solution to the problem and enclose "
    "your code within delimiters."
)
_LCB_STDIN_FORMAT = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not "
    "directly test on the sample inputs). Enclose your code within delimiters as follows."
)


def load(path: str | Path | None = None, limit: int | None = None) -> list[Problem]:
    """LiveCodeBench ``code_generation_lite`` problems from a local upstream jsonl.

    Fields: question_title, question_content, platform, question_id, contest_id, contest_date,
    starter_code, difficulty, public_test_cases (JSON string of [{input, output, testtype}]),
    private_test_cases (the same JSON, or base64(zlib(pickle(JSON string)))), metadata (JSON
    string, e.g. {"func_name": ...}). prompt = LiveCodeBench's generic question template;
    tests = JSON list of public then private cases (see :func:`io_cases`);
    entry_point = metadata func_name (functional problems) or None (stdin problems).
    """
    source = local_file(path, NAME, HINT)
    problems = []
    for i, rec in enumerate(read_jsonl(source)):
        where = f"{source} record {i}"
        public = _parse_cases(_json_field(rec, "public_test_cases", where), where)
        private = _parse_cases(
            decode_private_tests(field_of(rec, "private_test_cases", where), where), where
        )
        metadata = _json_field(rec, "metadata", where) if rec.get("metadata") else {}
        if not isinstance(metadata, dict):
            raise DatasetError(f"{where}: 'metadata' must be a JSON object")
        starter = str(rec.get("starter_code") or "")
        content = str(field_of(rec, "question_content", where))
        problems.append(
            Problem(
                task_id=f"lcb/{field_of(rec, 'question_id', where)}",
                prompt=_lcb_prompt(content, starter),
                kind="code",
                tests=json.dumps([dataclasses.asdict(c) for c in public + private]),
                entry_point=metadata.get("func_name"),
                meta={
                    "question_title": rec.get("question_title", ""),
                    "platform": rec.get("platform", ""),
                    "contest_id": rec.get("contest_id", ""),
                    "contest_date": rec.get("contest_date", ""),
                    "difficulty": rec.get("difficulty", ""),
                    "starter_code": starter,
                    "n_public": len(public),
                },
                dataset=NAME,
            )
        )
    return take(problems, limit)


def _lcb_prompt(question_content: str, starter_code: str) -> str:
    """LiveCodeBench's generic question template (lcb_runner get_generic_question_template)."""
    prompt = f"### Question:\n{question_content}\n\n"
    if starter_code:
        prompt += f"### Format: {_LCB_STARTER_FORMAT}\n```python\n{starter_code}\n```\n\n"
    else:
        prompt += f"### Format: {_LCB_STDIN_FORMAT}\n```python\n# YOUR CODE HERE\n```\n\n"
    return prompt + "### Answer: (use the provided format with backticks)\n\n"


def _json_field(rec: dict[str, Any], name: str, where: str) -> Any:
    value = field_of(rec, name, where)
    if not isinstance(value, str):
        return value  # already decoded by whoever wrote the file
    return json_value(value, f"{where}: {name!r}")


def _parse_cases(raw: Any, where: str) -> list[IOCase]:
    if not isinstance(raw, list):
        raise DatasetError(f"{where}: test cases must be a JSON list")
    cases = []
    for case in raw:
        if not isinstance(case, dict) or "input" not in case or "output" not in case:
            raise DatasetError(f"{where}: each test case needs 'input' and 'output'")
        testtype = str(case.get("testtype", "stdin"))
        if testtype not in ("stdin", "functional"):
            raise DatasetError(f"{where}: unknown testtype {testtype!r}")
        cases.append(IOCase(str(case["input"]), str(case["output"]), testtype))
    return cases


class _StrOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain data; the only global it will resolve is ``builtins.str``."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "str"):
            return str
        raise pickle.UnpicklingError(f"forbidden global {module}.{name}")


def decode_private_tests(raw: Any, where: str = "private_test_cases") -> Any:
    """Decode LiveCodeBench ``private_test_cases``: plain JSON, or base64(zlib(pickle(JSON))).

    Rule: JSON is tried first; only a string that is not JSON goes through base64 and zlib,
    and the pickle inside is loaded by an unpickler that resolves no global but ``str``
    (so it cannot call anything); it must hold a string, which is then parsed as JSON.
    """
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    except RecursionError:
        raise DatasetError(f"{where}: private_test_cases is JSON nested too deeply") from None
    bad = f"{where}: private_test_cases is neither JSON nor base64(zlib(pickle(JSON)))"
    try:
        compressed = base64.b64decode(raw.encode("ascii"), validate=True)
        inflater = zlib.decompressobj()
        data = inflater.decompress(compressed, _MAX_PRIVATE_TESTS_BYTES)
        if inflater.unconsumed_tail:
            raise DatasetError(f"{where}: private tests decompress to more than 1 GiB")
        payload = _StrOnlyUnpickler(io.BytesIO(data)).load()
    except DatasetError:
        raise
    except (UnicodeEncodeError, binascii.Error, zlib.error, ValueError, EOFError, TypeError,
            pickle.UnpicklingError, AttributeError, IndexError, KeyError, MemoryError) as exc:
        raise DatasetError(f"{bad} ({type(exc).__name__}: {exc})") from None
    if not isinstance(payload, str):
        raise DatasetError(f"{bad} (the pickle holds {type(payload).__name__}, not str)")
    return json_value(payload, f"{bad} (decoded text)")


def io_cases(problem: Problem, *, public_only: bool = False) -> list[IOCase]:
    """The test cases of an ``lcb-lite`` problem (public ones first)."""
    if problem.tests is None:
        return []
    cases = _parse_cases(json_value(problem.tests, f"{problem.task_id}: tests"), problem.task_id)
    if public_only:
        return cases[: int(problem.meta.get("n_public", len(cases)))]
    return cases


def program(problem: Problem, completion: str) -> str:
    """A ```python block, else the completion as is."""
    fenced = fenced_code(completion, problem.entry_point)
    return fenced if fenced is not None else completion


def grade(problem: Problem, completion: str, timeout_s: float = 10.0) -> dict:
    from .sandbox import check_functional, check_stdio
    code, cases = program(problem, completion), io_cases(problem)
    res = (check_functional(code, cases, problem.entry_point, timeout_s=timeout_s) if problem.entry_point
           else check_stdio(code, cases, timeout_s=timeout_s))
    return {"metric": "pass@1", "passed": bool(res.passed), "status": res.status}
