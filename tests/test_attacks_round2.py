"""A hostile tester's second round against the sandbox (issue #60): the host's memory, a Python under /tmp,
and fake passes through StopIteration and the program's own truth/len/str/iter.

Runs as root (as CI does) and as a normal user, e.g.
    runuser -u someone -- python3 -m pytest -p no:cacheprovider --noconftest tests/test_attacks_round2.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from cure_tasks import isolation
from cure_tasks.sandbox import check_correctness, run_program

pytestmark = pytest.mark.skipif(isolation.isolation_problem() is not None,
                                reason=str(isolation.isolation_problem()))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024 * 1024


# --------------------------------------------------------------------------------------------
# 1. The host's memory: every writable place is capped, nothing else can hold shared memory.
# --------------------------------------------------------------------------------------------
def host_shmem() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


FILL = r"""
import ctypes, ctypes.util, mmap, os, sys, time
wrote = {}
block = b"x" * (1 << 20)
for where in ("/dev", "/dev/shm", "/dev/pts", "/dev/mqueue", "/tmp", "/sandbox", "/run", "/var/tmp", "/"):
    total = 0
    for i in range(400):                      # 400 MiB, far past every cap
        try:
            with open(f"{where}/fill{where.replace('/', '-')}{i}", "wb") as f:
                for _ in range(8):
                    total += f.write(block)
        except OSError:
            break
    wrote[where] = total
refused = {}
try:
    fd = os.memfd_create("fill")
    os.write(fd, block)
    refused["memfd"] = False
except OSError:
    refused["memfd"] = True
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.restype = ctypes.c_int
shmid = libc.shmget(0, ctypes.c_size_t(256 << 20), 0o1600)      # IPC_PRIVATE, IPC_CREAT | 0600
refused["shmget"] = shmid == -1
if shmid != -1:
    libc.shmat.restype = ctypes.c_void_p
    addr = libc.shmat(shmid, None, 0)
    ctypes.memset(addr, 1, 256 << 20)
refused["msgget"] = libc.msgget(0, 0o1600) == -1
librt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
refused["mq_open"] = librt.mq_open(b"/fill", os.O_CREAT | os.O_RDWR, 0o600, None) == -1
libc.syscall.restype = ctypes.c_long
refused["x32 memfd_create"] = libc.syscall(0x40000000 | 319, b"x", 0) == -1 if os.uname().machine == "x86_64" else True
print(repr((wrote, refused)))
sys.stdout.flush()
time.sleep(1.0)                               # hold it while the host is measured
"""


def test_filling_every_writable_place_stays_within_the_caps_in_host_memory():
    assert isolation.seccomp_filter() is not None, f"no seccomp filter for {os.uname().machine}"
    before = host_shmem()
    peak = [before]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], host_shmem())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = run_program(FILL, audit_hooks=False, timeout_s=30.0, cpu_s=30, memory_mb=1024)
    finally:
        done.set()
        watcher.join()
    assert result.passed, result.stderr_tail
    wrote, refused = eval(result.stdout_tail)
    growth = peak[0] - before
    # Two capped tmpfs (/tmp and /sandbox) and slack for the host's other processes.
    assert growth <= 2 * isolation.TMPFS_BYTES + 48 * MIB, (growth, wrote)
    assert wrote["/tmp"] + wrote["/dev/shm"] <= isolation.TMPFS_BYTES     # /dev/shm is /tmp
    assert wrote["/sandbox"] <= isolation.TMPFS_BYTES
    for place in ("/dev", "/dev/pts", "/dev/mqueue", "/run", "/var/tmp", "/"):
        assert wrote[place] == 0, (place, wrote)
    assert all(refused.values()), refused
    assert wrote["/dev/shm"] > 0 and wrote["/sandbox"] > 0    # the writable places still work


def test_open_files_are_capped():
    code = textwrap.dedent("""
        import os, resource
        pipes = []
        try:
            for _ in range(5000):
                pipes.append(os.pipe())
        except OSError:
            pass
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (100_000, 100_000))
            print("raised")
        except (OSError, ValueError):
            pass
        print(len(pipes))
    """)
    result = run_program(code, audit_hooks=False)
    assert result.passed, result.stderr_tail
    assert "raised" not in result.stdout_tail
    assert int(result.stdout_tail.split()[-1]) * 2 <= isolation.NOFILE


def test_dev_holds_the_devices_only_and_is_read_only():
    code = textwrap.dedent("""
        import os
        print(sorted(os.listdir("/dev")))
        for path in ("/dev/new", "/dev/null2", "/dev/fd/x"):
            try:
                open(path, "w")
                print("wrote", path)
            except OSError as exc:
                print("refused", path, exc.errno)
        with open("/dev/null", "w") as f:
            f.write("fine")
        with open("/dev/urandom", "rb") as f:
            assert len(f.read(8)) == 8
        print(os.readlink("/dev/shm"))
    """)
    result = run_program(code, audit_hooks=False)
    assert result.passed, result.stderr_tail
    lines = result.stdout_tail.splitlines()
    assert eval(lines[0]) == sorted([*isolation.DEVICES, "fd", "stdin", "stdout", "stderr", "shm"])
    assert not any(line.startswith("wrote") for line in lines), lines
    assert "refused /dev/new 30" in lines          # EROFS
    assert lines[-1] == "/tmp"


# --------------------------------------------------------------------------------------------
# 2. A Python that lives under /tmp (a venv there) starts the sandbox, as root and as a user.
# --------------------------------------------------------------------------------------------
GRADE = """
import sys
sys.path.insert(0, {repo!r})
from cure_tasks.sandbox import check_correctness
tests = "def check(candidate):\\n    assert candidate(1, 2) == 3\\n"
right = check_correctness("def add(a, b):\\n    return a + b\\n", tests, "add")
wrong = check_correctness("def add(a, b):\\n    return a - b\\n", tests, "add")
print(right.status, wrong.status, right.stderr_tail[-300:])
"""


def test_a_venv_under_a_private_tmp_folder_runs_the_sandbox():
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:       # 0700, like mkdtemp's
        venv = os.path.join(folder, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv],
                       check=True)
        python = os.path.join(venv, "bin", "python")
        done = subprocess.run([python, "-c", GRADE.format(repo=REPO)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": REPO})
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[:2] == ["passed", "failed"], done.stdout


# --------------------------------------------------------------------------------------------
# The refusal line when the sandbox cannot start: whole, or cut at a word.
# --------------------------------------------------------------------------------------------
USERNS = ("bwrap: No permissions to creating new namespace, likely because the kernel does not allow "
          "non-privileged user namespaces. On e.g. debian this can be enabled with "
          "'sysctl kernel.unprivileged_userns_clone=1'.")


def test_cut_at_word_keeps_whole_words():
    assert isolation.cut_at_word("short reason", 200) == "short reason"
    assert isolation.cut_at_word(USERNS, 400) == USERNS
    cut = isolation.cut_at_word(USERNS + " " + USERNS, 200)
    assert cut.endswith(" ...") and len(cut) <= 204
    assert (USERNS + " " + USERNS).startswith(cut[:-4]) and (USERNS + " ")[len(cut) - 4] == " "
    assert isolation.cut_at_word("x" * 300, 200) == "x" * 200 + " ..."


def test_the_refusal_line_is_whole(monkeypatch):
    class Failed:
        def __init__(self, stderr):
            stderr.write((USERNS + "\n").encode())
            self.popen = subprocess.Popen(["false"])

        def kill(self):
            self.popen.wait()

    monkeypatch.setattr(isolation, "_spawn", lambda *a, stderr, **k: Failed(stderr))
    isolation.isolation_problem.cache_clear()
    try:
        line = isolation.isolation_problem()
    finally:
        isolation.isolation_problem.cache_clear()
    assert line == f"cannot isolate generated code: the sandbox does not start here ({USERNS})"
    assert len(USERNS) > 200


# --------------------------------------------------------------------------------------------
# 6 and 7. Fake passes: a stop reply to a call, and the program deciding truth, len, str or iteration.
# --------------------------------------------------------------------------------------------
BY_MAP = ("def check(candidate):\n    cases = [((1, 2), 3), ((5, 7), 12)]\n"
          "    assert all(map(lambda x: candidate(*x[0]) == x[1], cases))\n")
SWALLOWED = ("def check(candidate):\n    try:\n        assert all(map(lambda x: candidate(*x[0]) == x[1], "
             "[((1, 2), 3)]))\n    except Exception:\n        pass\n")
# Writes a forged reply frame on the sample's reply pipe, as the answer to a call.
FORGE = textwrap.dedent("""
    import json, os
    _cfg = json.loads(open("/proc/self/cmdline", "rb").read().split(b"\\0")[-2])
    def add(a, b):
        data = json.dumps(REPLY).encode()
        os.write(_cfg["fds"]["replies"], len(data).to_bytes(4, "big") + data)
        os._exit(0)
""")
STOPS = {
    "raise StopIteration": ("def add(a, b):\n    raise StopIteration\n", BY_MAP),
    "nested StopIteration": ("def add(a, b):\n    return next(iter([]))\n", BY_MAP),
    "forged stop": ("REPLY = {'stop': True}" + FORGE, BY_MAP),
    "forged stop under except Exception": ("REPLY = {'stop': True}" + FORGE, SWALLOWED),
    "forged bad reply under except Exception": ("REPLY = {'v': {'zz': 1}}" + FORGE, SWALLOWED),
}


@pytest.mark.parametrize("name", STOPS)
def test_a_stop_as_the_answer_to_a_call_fails(name):
    program, tests = STOPS[name]
    result = check_correctness(program, tests, "add", timeout_s=8.0)
    assert result.status == "failed", (name, result)


CLASS = "class R:\n    def __bool__(self): return True\n    def __len__(self): return 3\n" \
        "    def __str__(self): return '3'\n    def __format__(self, spec): return '3'\n" \
        "    def __iter__(self): return iter([3])\n    def __contains__(self, x): return True\n" \
        "    def __eq__(self, other): return True\n    __hash__ = object.__hash__\n"
TRUTHS = {
    "__bool__": ("return R()", "assert candidate(1, 2)"),
    "not not": ("return R()", "assert not not candidate(1, 2)"),
    "__len__": ("return R()", "assert len(candidate(1, 2)) == 3"),
    "__str__": ("return R()", "assert str(candidate(1, 2)) == '3'"),
    "f-string": ("return R()", "assert f'{candidate(1, 2)}' == '3'"),
    "__iter__": ("return R()", "assert list(candidate(1, 2)) == [3]"),
    "__contains__": ("return R()", "assert 3 in candidate(1, 2)"),
    "__eq__ in a list": ("return [R()]", "assert candidate(1, 2) == [3]"),
    "__eq__ in a deque, in": ("import collections; return collections.deque([R()])",
                              "assert 3 in candidate(1, 2)"),
    "weakref proxy __bool__": ("import weakref; KEEP.append(R()); return weakref.proxy(KEEP[-1])",
                               "assert candidate(1, 2)"),
    "mappingproxy __len__": ("import types; return types.MappingProxyType(M())",
                             "assert len(candidate(1, 2)) == 3"),
}
MAPPING = "import collections.abc\nclass M(collections.abc.Mapping):\n" \
          "    def __getitem__(self, k): raise KeyError(k)\n    def __iter__(self): return iter([1, 2, 3])\n" \
          "    def __len__(self): return 3\nKEEP = []\n"


@pytest.mark.parametrize("name", TRUTHS)
def test_the_program_does_not_decide_truth_len_str_or_iteration(name):
    body, assertion = TRUTHS[name]
    program = f"{CLASS}{MAPPING}def add(a, b):\n    {body}\n"
    tests = f"def check(candidate):\n    {assertion}\n"
    result = check_correctness(program, tests, "add", timeout_s=8.0)
    assert result.status == "failed", (name, result)


HONEST = {
    "bool": ("def add(a, b):\n    return a + b == 3\n", "assert candidate(1, 2)"),
    "generator": ("def add(a, b):\n    yield from range(a, b)\n", "assert list(candidate(0, 3)) == [0, 1, 2]"),
    "map": ("def add(a, b):\n    return map(abs, [a, -b])\n", "assert sum(candidate(1, 2)) == 3"),
    "next to the end": ("def add(a, b):\n    return iter([a, b])\n",
                        "it = candidate(1, 2)\n    assert next(it) + next(it) == 3\n"
                        "    assert next(it, None) is None"),
    "in a range": ("def add(a, b):\n    return range(a, a + b + 1)\n", "assert 3 in candidate(1, 2)"),
    "len of a deque": ("import collections\ndef add(a, b):\n    return collections.deque(range(a + b))\n",
                       "assert len(candidate(1, 2)) == 3 and candidate(1, 2)"),
    "by map, right": ("def add(a, b):\n    return a + b\n", None),
}


@pytest.mark.parametrize("name", HONEST)
def test_honest_answers_still_pass(name):
    program, assertion = HONEST[name]
    tests = BY_MAP if assertion is None else f"def check(candidate):\n    {assertion}\n"
    result = check_correctness(program, tests, "add", timeout_s=8.0)
    assert result.status == "passed", (name, result)
