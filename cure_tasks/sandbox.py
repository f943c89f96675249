"""Run model-generated Python in an OS sandbox and grade it.

The boundary is the operating system (cure_tasks/isolation.py): every sample runs under bubblewrap as an
unprivileged uid with no capabilities and no-new-privs, in its own user/mount/PID/network/IPC namespaces,
with a read-only view of /usr and the Python installation, two private size-capped tmpfs as its only
writable places, nothing of the parent's environment, and CPU/memory/file-size/process limits set before
it starts. An in-process audit hook (sandbox_child.py) stays as defence in depth. Where this isolation
cannot be had, nothing runs: every entry point here raises SandboxUnavailable with one line saying what
is missing (see :func:`isolation_problem`); there is no fallback to the hook alone.

How a verdict is reached:

* ``run_program`` / ``check_stdio``: one sandbox runs the program; its exit status (and for check_stdio its
  stdout, compared here) is the result.
* ``check_correctness`` / ``check_functional``: two sandboxes. The *sample* runs the program and serves its
  top-level names; the *judge* runs the tests and calls into the sample over two pipes. Only plain data of
  exact builtin types comes back (anything else is an opaque handle equal only to itself), so an object
  whose ``__eq__`` always returns True fails. The judge alone holds the result pipe; it copies the nonce it
  read from a second pipe there once every test ran. The nonce is never in any source and the sample
  never holds either pipe, so printing a marker, exiting early or tampering with its own process cannot
  fake a pass.
"""

from __future__ import annotations

import os
import secrets
import select
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import IO, Literal, Protocol, Sequence

from . import isolation
from .isolation import Limits, SandboxUnavailable, isolation_problem, pids_cgroup_available  # noqa: F401
from .sandbox_child import BOOT_FAILED_RC, SOURCE, TESTS

Status = Literal["passed", "failed", "timeout", "killed", "error"]

# How much of stdout/stderr a SandboxResult keeps (the end is where tracebacks are).
TAIL_CHARS = 4000
# How long the sample may take to exit by itself once the judge is done (it sees end of file).
_SAMPLE_GRACE_S = 1.0


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    status: ``passed`` (exit 0, and for checks: all tests ran), ``failed`` (non-zero exit or a
    wrong answer), ``timeout`` (wall clock), ``killed`` (ended by a signal, e.g. the CPU limit),
    ``error`` (the sandbox itself could not run the sample).
    """

    passed: bool
    status: Status
    returncode: int | None
    stdout_tail: str
    stderr_tail: str
    wall_s: float
    # pid (in the grader's PID namespace) of the sandbox's outermost process; its process group too.
    pid: int | None = None


class IOCaseLike(Protocol):
    """A stdin/stdout or functional test case (``cure_tasks.common.IOCase`` fits)."""

    input: str
    output: str


@dataclass(frozen=True)
class _Execution:
    """Raw outcome of one sandboxed run (or sample + judge pair), before it is graded."""

    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    wall_s: float
    pid: int | None
    start_error: str | None = None
    judged_pass: bool = False       # the judge wrote the nonce (check_correctness / check_functional)
    killed: bool = False            # a process ended by a signal before the parent killed it


def _read_all(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def _wait_for_exit(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait until the process exits or ``timeout_s`` passes; True on timeout. Does not reap."""
    try:
        pidfd = os.pidfd_open(proc.pid)   # wakes the moment it exits (Popen.wait polls with sleeps)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout_s)
            return False
        except subprocess.TimeoutExpired:
            return True
    try:
        ready, _, _ = select.select([pidfd], [], [], max(0.0, timeout_s))
        return not ready
    finally:
        os.close(pidfd)


def _execute(source: str, *, stdin: str, limits: Limits, audit_hooks: bool) -> _Execution:
    """One sandbox running ``source`` as __main__ with ``stdin``."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        fin.write(stdin.encode("utf-8"))
        fin.seek(0)
        try:
            box = isolation.start({"role": "run", "audit_hooks": audit_hooks}, {SOURCE: source},
                                  limits=limits, stdin=fin, stdout=fout, stderr=ferr)
        except OSError as exc:
            return _Execution(None, False, "", "", 0.0, None, start_error=repr(exc))
        try:
            timed_out = _wait_for_exit(box.popen, limits.timeout_s)
        finally:
            box.kill()     # Rule: SIGKILL on timeout and after a normal exit (stragglers die with it)
        rc = box.returncode
        return _Execution(returncode=rc, timed_out=timed_out, stdout=_read_all(fout), stderr=_read_all(ferr),
                          wall_s=time.monotonic() - started, pid=box.popen.pid,
                          killed=not timed_out and rc is not None and rc < 0)


def _execute_judged(program: str, *, limits: Limits, entry_point: str | None, tests: str | None = None,
                    functional: dict | None = None) -> _Execution:
    """The sample (``program``) and the judge (``tests``, or one ``functional`` case) in two sandboxes."""
    started = time.monotonic()
    nonce = secrets.token_hex(16).encode("ascii")
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    nonce_r, nonce_w = os.pipe()
    result_r, result_w = os.pipe()
    child_ends = [requests_r, requests_w, replies_r, replies_w, nonce_r, result_w]
    boxes: list[isolation.Sandboxed] = []
    files = [tempfile.TemporaryFile() for _ in range(4)]
    s_out, s_err, j_out, j_err = files
    try:
        with open(os.devnull, "rb") as null:
            try:
                sample = isolation.start({"role": "sample", "audit_hooks": True}, {SOURCE: program},
                                         limits=limits, stdin=null, stdout=s_out, stderr=s_err,
                                         pass_fds={"requests": requests_r, "replies": replies_w})
                boxes.append(sample)
                judge = isolation.start({"role": "judge", "audit_hooks": True, "functional": functional,
                                         "entry_point": entry_point},
                                        {} if tests is None else {TESTS: tests},
                                        limits=limits, stdin=null, stdout=j_out, stderr=j_err,
                                        pass_fds={"requests": requests_w, "replies": replies_r,
                                                  "nonce": nonce_r, "result": result_w})
                boxes.append(judge)
            except OSError as exc:
                return _Execution(None, False, "", "", 0.0, None, start_error=repr(exc))
        for fd in child_ends:
            os.close(fd)
        child_ends = []
        os.write(nonce_w, nonce)
        os.close(nonce_w)
        nonce_w = -1
        timed_out = _wait_for_exit(judge.popen, limits.timeout_s)
        judge.kill()
        left = limits.timeout_s - (time.monotonic() - started)
        if not timed_out:
            _wait_for_exit(sample.popen, min(_SAMPLE_GRACE_S, max(0.0, left)))
        sample_alone = sample.popen.poll() is not None
        sample.kill()
        verdict = _read_nonblocking(result_r, len(nonce) + 1)
        judge_rc, sample_rc = judge.returncode, sample.returncode
        killed = (not timed_out) and ((judge_rc or 0) < 0 or (sample_alone and (sample_rc or 0) < 0))
        boot_failed = BOOT_FAILED_RC in (judge_rc, sample_rc if sample_alone else None)
        return _Execution(
            returncode=BOOT_FAILED_RC if boot_failed else judge_rc,
            timed_out=timed_out,
            stdout=_read_all(s_out) + _read_all(j_out),
            stderr=_read_all(s_err) + _read_all(j_err),
            wall_s=time.monotonic() - started,
            pid=sample.popen.pid,
            judged_pass=not timed_out and judge_rc == 0 and verdict == nonce,
            killed=killed,
        )
    finally:
        for box in boxes:
            if box.popen.returncode is None:
                box.kill()
        for fd in [*child_ends, nonce_w, result_r]:
            if fd >= 0:
                os.close(fd)
        for f in files:
            f.close()


def _read_nonblocking(fd: int, limit: int) -> bytes:
    """What is buffered in a pipe whose writers are gone (at most ``limit`` bytes)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, limit)
    except BlockingIOError:
        return b""


def _status_of(run: _Execution) -> Status:
    if run.start_error is not None or run.returncode == BOOT_FAILED_RC:
        return "error"
    if run.timed_out:
        return "timeout"
    if run.killed:
        return "killed"
    if run.returncode == 0:
        return "passed"
    return "failed"


def _judged_status(run: _Execution) -> Status:
    """A judged run passes on the judge's nonce alone; otherwise it is whatever went wrong."""
    if run.judged_pass:
        return "passed"
    status = _status_of(run)
    return "failed" if status == "passed" else status


def _result(run: _Execution, status: Status, note: str = "") -> SandboxResult:
    stderr = run.stderr if run.start_error is None else run.start_error
    if note:
        stderr = f"{stderr}\n{note}" if stderr else note
    return SandboxResult(
        passed=status == "passed",
        status=status,
        returncode=run.returncode,
        stdout_tail=run.stdout[-TAIL_CHARS:],
        stderr_tail=stderr[-TAIL_CHARS:],
        wall_s=run.wall_s,
        pid=run.pid,
    )


def run_program(
    source: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: int = 10,
    memory_mb: int = 1024,
    fsize_mb: int = 16,
    nproc: int = 32,
    stdin: str = "",
    audit_hooks: bool = True,
) -> SandboxResult:
    """Run ``source`` as ``__main__`` in a fresh sandbox; passed means exit status 0.

    ``nproc`` caps the tasks (processes and threads) it may add. ``audit_hooks=False`` leaves out the
    in-process guards and keeps only the OS isolation: for testing that, never for model output.
    Raises SandboxUnavailable when this machine cannot isolate it.
    """
    limits = Limits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, fsize_mb=fsize_mb, nproc=nproc)
    run = _execute(source, stdin=stdin, limits=limits, audit_hooks=audit_hooks)
    return _result(run, _status_of(run))


def _check_limits(timeout_s: float, memory_mb: int, fsize_mb: int) -> Limits:
    return Limits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s) + 1), memory_mb=memory_mb,
                  fsize_mb=fsize_mb, nproc=32)


def check_correctness(
    problem_program: str,
    tests: str,
    entry_point: str | None = None,
    timeout_s: float = 10.0,
    *,
    memory_mb: int = 1024,
) -> SandboxResult:
    """Run a HumanEval/MBPP-style program against its tests; passed iff every test ran and held.

    The program runs in the sample's sandbox; ``tests`` run in the judge's, where the program's top-level
    names call into the sample. When ``tests`` defines ``check(candidate)`` without calling it,
    ``check(<entry_point>)`` is added. Raises SandboxUnavailable when this machine cannot isolate it.
    """
    calls_check = any(line.startswith("check(") for line in tests.splitlines())
    defines_check = any(line.startswith("def check(") for line in tests.splitlines())
    if entry_point and defines_check and not calls_check:
        tests = f"{tests}\n\ncheck({entry_point})\n"
    run = _execute_judged(problem_program, limits=_check_limits(timeout_s, memory_mb, 16),
                          entry_point=entry_point, tests=tests)
    return _result(run, _judged_status(run))


def _tokens_match(got: str, expected: str) -> bool:
    """Line-by-line, whitespace-token comparison; numeric tokens compare as decimals."""
    got_lines = [line.split() for line in got.strip().splitlines()]
    exp_lines = [line.split() for line in expected.strip().splitlines()]
    got_lines = [line for line in got_lines if line]
    exp_lines = [line for line in exp_lines if line]
    if len(got_lines) != len(exp_lines):
        return False
    for gl, el in zip(got_lines, exp_lines):
        if len(gl) != len(el):
            return False
        for g, e in zip(gl, el):
            if g == e:
                continue
            try:
                if Decimal(g) != Decimal(e):
                    return False
            except InvalidOperation:
                return False
    return True


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def check_stdio(
    program: str,
    cases: Sequence[IOCaseLike],
    *,
    timeout_s: float = 6.0,
    memory_mb: int = 1024,
) -> SandboxResult:
    """Run ``program`` once per case with ``case.input`` on stdin; compare stdout to output.

    Comparison (here, outside the sandbox) ignores surrounding and repeated whitespace and compares
    numeric tokens as decimals (``1.0`` == ``1``). Stops at the first failing case; the result's
    stderr_tail then says which case failed and how.
    """
    return _check_cases(program, cases, timeout_s=timeout_s, memory_mb=memory_mb, func_name=None)


def check_functional(
    program: str,
    cases: Sequence[IOCaseLike],
    func_name: str,
    *,
    timeout_s: float = 6.0,
    memory_mb: int = 1024,
) -> SandboxResult:
    """LiveCodeBench ``functional`` cases: the judge calls ``Solution().<func_name>(*args)`` per case.

    ``case.input`` holds one JSON value per line (the arguments), ``case.output`` the JSON of the
    expected return value. The return value is compared strictly by value (sandbox_child.same_value:
    tuples as lists, bool never equal to a number). A plain top-level function named ``func_name`` is
    used when there is no ``Solution`` class.
    """
    return _check_cases(program, cases, timeout_s=timeout_s, memory_mb=memory_mb, func_name=func_name)


def _check_cases(
    program: str,
    cases: Sequence[IOCaseLike],
    *,
    timeout_s: float,
    memory_mb: int,
    func_name: str | None,
) -> SandboxResult:
    if not cases:
        return SandboxResult(False, "error", None, "", "cure-sandbox: no test cases", 0.0)
    limits = _check_limits(timeout_s, memory_mb, 64)
    total_wall = 0.0
    last: SandboxResult | None = None
    for index, case in enumerate(cases, 1):
        where = f"case {index}/{len(cases)}"
        if func_name is None:
            run = _execute(program, stdin=case.input, limits=limits, audit_hooks=True)
            status = _status_of(run)
        else:
            spec = {"func_name": func_name, "input": case.input, "output": case.output}
            run = _execute_judged(program, limits=limits, entry_point=func_name, functional=spec)
            status = _judged_status(run)
        total_wall += run.wall_s
        if status != "passed":
            return replace(_result(run, status, f"cure-sandbox: {where}: {status}"), wall_s=total_wall)
        if func_name is None and not _tokens_match(run.stdout, case.output):
            note = (f"cure-sandbox: {where}: wrong answer: expected {_short(case.output)!r}, "
                    f"got {_short(run.stdout)!r}")
            return replace(_result(run, "failed", note), wall_s=total_wall)
        last = _result(run, "passed")
    assert last is not None
    return replace(last, wall_s=total_wall)
