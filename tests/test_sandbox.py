"""Tests for cure_tasks.sandbox: limits, guards, cleanup, and grading of HumanEval/MBPP/LCB code."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from cure_tasks import IOCase, isolation
from cure_tasks.sandbox import check_correctness, check_functional, check_stdio, run_program


def processes_in_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group or session is ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the ")" closing the command name: state ppid pgrp session ...
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp, session = fields[0], int(fields[2]), int(fields[3])
        if state != "Z" and pgid in (pgrp, session):
            found.append(int(entry))
    return found


def sandbox_processes() -> set[int]:
    """Pids of live processes started by the sandbox (their command line runs /cure/child.py)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if isolation.CHILD_PATH.encode() in f.read():
                    pids.add(int(entry))
        except OSError:
            continue
    return pids


def test_plain_program_runs_and_sees_stdin() -> None:
    result = run_program("import sys\nprint(sys.stdin.read().upper())", stdin="hello\n")
    assert result.passed and result.status == "passed" and result.returncode == 0
    assert result.stdout_tail.strip() == "HELLO"


def test_infinite_loop_is_killed_on_timeout() -> None:
    start = time.monotonic()
    result = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and not result.passed
    assert time.monotonic() - start < 5
    assert processes_in_group(result.pid) == []


def test_cpu_limit_kills() -> None:
    result = run_program("while True:\n    pass\n", timeout_s=5.0, cpu_s=1)
    assert result.status == "killed"
    assert result.wall_s < 4


def test_fork_bomb_is_stopped_and_leaves_no_process() -> None:
    before = sandbox_processes()
    bomb = "import os\nwhile True:\n    os.fork()\n"
    start = time.monotonic()
    result = run_program(bomb, timeout_s=5.0)
    assert time.monotonic() - start < 5
    assert result.status == "failed"
    assert "os.fork is not allowed" in result.stderr_tail
    for spawner in ("import subprocess\nsubprocess.run(['sleep', '60'])",
                    "import os\nos.system('sleep 60')",
                    "import multiprocessing as m\nm.Process(target=print).start()"):
        assert "is not allowed" in run_program(spawner, timeout_s=5.0).stderr_tail
    assert processes_in_group(result.pid) == []
    assert sandbox_processes() - before == set()


def test_fork_bomb_without_audit_hooks_is_contained_by_the_kernel() -> None:
    # The audit hooks are off: only RLIMIT_NPROC (and as root the pids cgroup) and the end of the
    # sandbox's PID namespace stand between this bomb and the host. Children even call setsid.
    before = sandbox_processes()
    bomb = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "    except OSError:\n"
        "        time.sleep(0.005)\n"
    )
    start = time.monotonic()
    result = run_program(bomb, timeout_s=1.5, nproc=16, audit_hooks=False)
    assert result.status == "timeout"
    assert time.monotonic() - start < 8
    assert processes_in_group(result.pid) == []
    assert sandbox_processes() - before == set()
    leftover = [d for base in isolation.pids_cgroup_bases() for d in os.listdir(base)
                if d.startswith(f"{isolation._CGROUP_PREFIX}{os.getpid()}-")]
    assert leftover == []


def test_memory_hog_hits_the_limit() -> None:
    result = run_program("x = bytearray(2 * 1024 ** 3)\nprint('allocated')", memory_mb=256)
    assert result.status == "failed"
    assert "MemoryError" in result.stderr_tail
    assert "allocated" not in result.stdout_tail
    grower = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n"
    result = run_program(grower, memory_mb=256, timeout_s=10)
    assert result.status in ("failed", "killed") and "MemoryError" in result.stderr_tail


def test_write_outside_the_sandbox_dir_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    program = (
        "import os\n"
        "open('inside.txt', 'w').write('fine')\n"
        "assert os.path.exists('inside.txt')\n"
        f"open({str(target)!r}, 'w').write('pwned')\n"
    )
    result = run_program(program)
    assert result.status == "failed"
    assert "outside the sandbox dir is not allowed" in result.stderr_tail
    assert not target.exists()

    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    for attack in (
        f"import os\nos.remove({str(keep)!r})",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        f"import os\nos.rename({str(keep)!r}, 'stolen.txt')",
        f"import os\nos.chmod({str(keep)!r}, 0o777)",
        f"import os\nos.symlink({str(keep)!r}, 'link')\nopen('link', 'w').write('x')",
        f"import os\nos.chdir('/')\nopen({str(keep)[1:]!r}, 'a').write('x')",
    ):
        result = run_program(attack)
        assert result.status == "failed", attack
        assert "not allowed" in result.stderr_tail, attack
    assert keep.read_text() == "precious"


def test_sandbox_dir_is_private_and_in_memory() -> None:
    program = "import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd(), os.listdir('.'))"
    result = run_program(program)
    assert result.passed, result.stderr_tail
    assert result.stdout_tail.split()[0] == "/sandbox"          # a tmpfs inside the sandbox
    assert not os.path.exists("/sandbox/scratch.txt")          # nothing of it on the host


def test_network_connect_is_refused() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.2)
        port = server.getsockname()[1]
        program = f"import socket\nsocket.socket().connect(('127.0.0.1', {port}))\n"
        result = run_program(program)
        assert result.status == "failed"
        assert "socket.connect is not allowed" in result.stderr_tail
        by_name = f"import socket\nsocket.create_connection(('localhost', {port}), timeout=2)\n"
        assert "socket.getaddrinfo is not allowed" in run_program(by_name).stderr_tail
        with pytest.raises(socket.timeout):
            server.accept()


def test_environment_secrets_are_not_visible(monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "x-secret-token")
    program = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(os.environ.get('HF_TOKEN'))\n"
        "try:\n"
        "    print(open(f'/proc/{os.getppid()}/environ').read())\n"
        "except PermissionError as exc:\n"
        "    print('refused', exc)\n"
    )
    result = run_program(program)
    assert result.passed, result.stderr_tail
    assert "x-secret-token" not in result.stdout_tail
    assert "HF_TOKEN" not in result.stdout_tail
    assert "refused" in result.stdout_tail


def test_syntax_error_is_the_samples_failure() -> None:
    result = run_program("def f(:\n    pass\n")
    assert result.status == "failed" and "SyntaxError" in result.stderr_tail


def test_signals_to_other_processes_are_refused() -> None:
    result = run_program(f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)")
    assert result.status == "failed" and "signalling pid" in result.stderr_tail


HUMANEVAL_PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
HUMANEVAL_TESTS = (
    "def check(candidate):\n"
    "    assert candidate(1, 2) == 3\n"
    "    assert candidate(-1, 1) == 0\n"
)


def test_check_correctness_humaneval_style() -> None:
    right = check_correctness(HUMANEVAL_PROMPT + "    return a + b\n", HUMANEVAL_TESTS, "add")
    assert right.passed and right.status == "passed"
    wrong = check_correctness(HUMANEVAL_PROMPT + "    return a - b\n", HUMANEVAL_TESTS, "add")
    assert not wrong.passed and wrong.status == "failed"
    assert "AssertionError" in wrong.stderr_tail
    # Exiting before the tests run is not a pass.
    sneaky = HUMANEVAL_PROMPT + "    return 0\nimport sys\nsys.exit(0)\n"
    assert check_correctness(sneaky, HUMANEVAL_TESTS, "add").status == "failed"
    hang = HUMANEVAL_PROMPT + "    while True:\n        pass\n"
    assert check_correctness(hang, HUMANEVAL_TESTS, "add", timeout_s=1).status == "timeout"


def test_check_correctness_mbpp_style() -> None:
    tests = "assert is_even(2) == True\nassert is_even(3) == False\n"
    assert check_correctness("def is_even(n):\n    return n % 2 == 0\n", tests).passed
    assert not check_correctness("def is_even(n):\n    return True\n", tests).passed


def test_check_stdio_and_functional() -> None:
    cases = [IOCase("1 2\n", "3\n", "stdin"), IOCase("5 6\n", "11\n", "stdin")]
    good = "a, b = map(int, input().split())\nprint(a + b)\n"
    assert check_stdio(good, cases).passed
    bad = check_stdio("a, b = map(int, input().split())\nprint(a * b)\n", cases)
    assert bad.status == "failed" and "case 1/2: wrong answer" in bad.stderr_tail

    fcases = [IOCase("[1, 2, 3]", "6", "functional"), IOCase("[4, 5]\n2", "[9, 2]", "functional")]
    solution = (
        "from typing import List\n"
        "class Solution:\n"
        "    def total(self, nums: List[int], k: int = 0):\n"
        "        return sum(nums) if not k else (sum(nums), k)\n"
    )
    assert check_functional(solution, fcases, "total").passed
    wrong = solution.replace("sum(nums) if", "len(nums) if")
    result = check_functional(wrong, fcases, "total")
    assert result.status == "failed" and "case 1/2" in result.stderr_tail


def test_nproc_rlimit_is_offset_by_what_the_uid_already_runs() -> None:
    limits = isolation.Limits(timeout_s=1, cpu_s=1, memory_mb=64, fsize_mb=1, nproc=8)
    (nproc,) = [a for a in isolation._prlimit(limits, os.getuid()) if a.startswith("--nproc=")]
    assert int(nproc.split("=")[1]) >= 8 + 1     # this process counts too
