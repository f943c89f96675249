"""Run model-generated Python in a throw-away child process and grade it.

Every sample gets its own ``python -I -S`` child: isolated mode (no ``PYTHON*`` variables, no
user site, no cwd on ``sys.path``) and no ``site`` import, so only the standard library loads.
The child starts in a new session (so the whole process group can be SIGKILLed), in a fresh
temp dir used as cwd and deleted afterwards, with an environment built from scratch (PATH, LANG,
HOME=TMPDIR=the temp dir; nothing inherited, so no HF_TOKEN or other secrets).

What is guarded, and by what:

* Kernel-enforced (hold even against native code):
  - CPU time (RLIMIT_CPU), address space (RLIMIT_AS), file size (RLIMIT_FSIZE), no core dumps.
  - Wall clock: the parent SIGKILLs the process group on timeout, and again after every normal
    exit so stragglers die too.
  - Process count: RLIMIT_NPROC (non-root only: the kernel ignores it for root), and where
    a writable ``pids`` cgroup controller exists (v1 or v2) each run gets its own cgroup with
    ``pids.max = nproc``; every task in it is SIGKILLed at the end (this also catches children
    that called ``setsid`` to leave the process group). As root without that controller, the
    process count rests on the audit hook below.
  - Network: best effort, the child moves into a fresh network namespace (no interface up)
    when it has CAP_SYS_ADMIN; otherwise only the audit hook blocks sockets.
* Guarded by a ``sys.addaudithook`` hook installed before the sample runs (holds against
  ordinary Python code, including careless or buggy samples):
  - starting processes: ``os.fork/forkpty/system/exec*/posix_spawn/spawn*``, ``subprocess``,
    ``multiprocessing`` (its fork and ``_posixsubprocess`` paths are stubbed out);
  - writes outside the temp dir: ``open`` for writing, ``os.remove/rename/replace/rmdir/mkdir/
    chmod/chown/utime/truncate/link/symlink``, ``shutil.rmtree/copy*/move``; paths are resolved
    with ``realpath`` (symlinks followed) and ``dir_fd`` through ``/proc/self/fd``;
  - reads: only files in the temp dir, the Python installation, ``/usr``, ``/lib*``, ``/etc``
    (less shadow/sudoers/ssh), ``/dev/{null,zero,random,urandom,stdin}``, ``/proc/cpuinfo``,
    ``/proc/meminfo`` and the child's own ``/proc/<pid>`` (so no ``~/.cache`` tokens and no
    other process's ``/proc/<pid>/environ``); outside the temp dir no directory may be opened
    (a directory fd would let ``dir_fd=`` calls dodge the path checks);
  - sockets: ``connect``, ``bind``, ``sendto`` and name resolution;
  - signals to any process but itself / its own group; raising rlimits; ``ctypes``; loading
    native extension modules from outside the Python installation; ``gc`` object walks (which
    could reach the hook).

What is NOT guarded: audit hooks are not a security boundary. Hostile code can get around them
(a ``__fspath__`` that answers differently on the second call, a bug in an extension module,
anything native). Listing directories (``os.listdir``/``scandir``) and ``stat`` are not
guarded anywhere, and nothing limits disk usage in the temp dir beyond RLIMIT_FSIZE per file.
The network namespace and the pids cgroup are only there when the host allows them (root with
CAP_SYS_ADMIN and a writable cgroup fs): see :func:`pids_cgroup_available`. Running as root,
the kernel-enforced limits above are the only hard guarantees; for hostile code use a container
or VM around the whole harness.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import IO, Literal, Protocol, Sequence

Status = Literal["passed", "failed", "timeout", "killed", "error"]

# How much of stdout/stderr a SandboxResult keeps (the end is where tracebacks are).
TAIL_CHARS = 4000
# Exit code the boot stub uses when it cannot start the sample at all.
_BOOT_FAILED_RC = 213
_CGROUP_PREFIX = "cure-sbx-"


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
    # pid of the sample's session leader; also its process-group and session id.
    pid: int | None = None


class IOCaseLike(Protocol):
    """A stdin/stdout or functional test case (``cure_tasks.common.IOCase`` fits)."""

    input: str
    output: str


# --------------------------------------------------------------------------------------------
# The boot stub: runs inside the child before the sample, as `python -I -S -c _BOOT <config>`.
# --------------------------------------------------------------------------------------------
_BOOT = r'''
import json, os, resource, sys

def _cure_boot():
    cfg = json.loads(sys.argv[1])
    root = os.path.realpath(os.getcwd())
    pid = os.getpid()
    pgid = os.getpgid(0)

    # Rule: join the per-run pids cgroup first, so the kernel counts every later fork.
    if cfg["cgroup_procs"]:
        try:
            with open(cfg["cgroup_procs"], "w") as f:
                f.write(str(pid))
        except OSError:
            pass
    # Rule: kernel resource limits (RLIMIT_NPROC is ignored for root; the cgroup covers it).
    for name, soft, hard in cfg["rlimits"]:
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError):
            pass
    # Rule: a fresh network namespace has no interface up (needs CAP_SYS_ADMIN; best effort).
    if cfg["unshare_net"]:
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # CLONE_NEWNET
        except Exception:
            pass
    sys.dont_write_bytecode = True
    sys.argv = ["main.py"]

    with open("main.py", encoding="utf-8") as f:
        source = f.read()
    if not cfg["audit_hooks"]:
        return source

    # Rule: no process creation through _posixsubprocess (subprocess, multiprocessing spawn).
    import types
    stub = types.ModuleType("_posixsubprocess")
    def fork_exec(*args, **kwargs):
        raise PermissionError("sandbox: starting processes is not allowed")
    stub.fork_exec = fork_exec
    sys.modules["_posixsubprocess"] = stub

    write_roots = (root,)
    read_roots = tuple(cfg["read_roots"]) + (root, "/proc/%d" % pid)
    read_denied = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh")
    stdin_names = ("/dev/stdin", "/proc/self/fd/0", "/proc/%d/fd/0" % pid)
    native_roots = tuple(cfg["python_roots"])
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    default_dir_fds = (None, -1, -100)  # -100 is AT_FDCWD
    realpath, abspath, join, split, isdir = (
        os.path.realpath, os.path.abspath, os.path.join, os.path.split, os.path.isdir)

    def deny(what):
        raise PermissionError("sandbox: %s is not allowed" % what)

    def under(path, roots):
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def resolve(path, dir_fd=None, follow=True):
        """Absolute real path the kernel will touch; None for an already-open fd."""
        if isinstance(path, int):
            return None
        try:
            p = os.fsdecode(os.fspath(path))
            if dir_fd not in default_dir_fds:
                p = join(os.readlink("/proc/self/fd/%d" % dir_fd), p)
            if follow:
                return realpath(p)
            head, tail = split(abspath(p))
            return join(realpath(head), tail)
        except Exception:
            deny("an unresolvable path")

    def check_write(path, dir_fd=None, entry=True, target=True):
        # Rule: everything written (the entry itself and, through symlinks, its target) stays
        # inside the sandbox dir; /dev/null is the one exception.
        for follow, wanted in ((False, entry), (True, target)):
            if wanted:
                real = resolve(path, dir_fd, follow)
                if real is not None and real != "/dev/null" and not under(real, write_roots):
                    deny("writing %r outside the sandbox dir" % real)

    def check_read(path):
        if not isinstance(path, int) and os.fsdecode(os.fspath(path)) in stdin_names:
            return
        real = resolve(path)
        if real is None or under(real, write_roots):
            return
        # Rule: outside the sandbox dir only files (no directory fds to use as dir_fd) under the
        # allowed read roots.
        if under(real, read_denied) or not under(real, read_roots) or isdir(real):
            deny("reading %r" % real)

    def on_open(args):
        path, mode, flags = args[0], args[1], args[2] or 0
        writing = bool(flags & write_flags) or (
            isinstance(mode, str) and any(c in mode for c in "wax+"))
        if writing:
            check_write(path)
        else:
            check_read(path)

    def on_kill(args):
        # Rule: signals only to itself or its own process group.
        if args[0] not in (0, pid, -pgid):
            deny("signalling pid %r" % (args[0],))

    def on_killpg(args):
        if args[0] not in (0, pgid):
            deny("signalling process group %r" % (args[0],))

    def on_import(args):
        # Rule: native extensions only from the Python installation (no .so written by the sample).
        name, filename = args[0], args[1]
        if name == "_posixsubprocess":
            deny("importing _posixsubprocess")
        if isinstance(filename, str) and not under(realpath(filename), native_roots):
            deny("loading native module %r" % filename)

    def on_prlimit(args):
        if args[2] is not None:
            deny("changing resource limits")

    checks = {
        "open": on_open,
        "os.remove": lambda a: check_write(a[0], a[1], target=False),
        "os.rmdir": lambda a: check_write(a[0], a[1], target=False),
        "os.mkdir": lambda a: check_write(a[0], a[2], target=False),
        "os.rename": lambda a: (check_write(a[0], a[2], target=False),
                                check_write(a[1], a[3], target=False)),
        "os.link": lambda a: (check_write(a[0], a[2]), check_write(a[1], a[3], target=False)),
        "os.symlink": lambda a: check_write(a[1], a[2], target=False),
        "os.chmod": lambda a: check_write(a[0], a[2]),
        "os.chown": lambda a: check_write(a[0], a[3]),
        "os.utime": lambda a: check_write(a[0], a[3]),
        "os.truncate": lambda a: check_write(a[0], entry=False),
        "os.setxattr": lambda a: check_write(a[0]),
        "os.removexattr": lambda a: check_write(a[0]),
        "shutil.rmtree": lambda a: check_write(a[0], a[1] if len(a) > 1 else None, target=False),
        "shutil.copyfile": lambda a: check_write(a[1], target=False),
        "shutil.copymode": lambda a: check_write(a[1]),
        "shutil.copystat": lambda a: check_write(a[1]),
        "shutil.copytree": lambda a: check_write(a[1], target=False),
        "shutil.move": lambda a: (check_write(a[0], target=False),
                                  check_write(a[1], target=False)),
        "shutil.chown": lambda a: check_write(a[0]),
        "os.kill": on_kill,
        "os.killpg": on_killpg,
        "import": on_import,
        "resource.prlimit": on_prlimit,
    }
    blocked = frozenset((
        # processes
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
        "os.startfile", "subprocess.Popen", "pty.spawn",
        # network
        "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr",
        "socket.getnameinfo", "socket.sethostname", "webbrowser.open",
        # limits and introspection that could reach this hook
        "resource.setrlimit", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    ))

    def hook(event, args):
        if event in blocked or event.startswith("ctypes."):
            deny(event)
        check = checks.get(event)
        if check is not None:
            check(args)

    sys.addaudithook(hook)
    return source

try:
    _cure_source = _cure_boot()
except BaseException as _cure_exc:
    sys.stderr.write("cure-sandbox: boot failed: %r\n" % (_cure_exc,))
    sys.stderr.flush()
    os._exit(%(boot_rc)d)
del _cure_boot
import types as _cure_types
_cure_main = _cure_types.ModuleType("__main__")
_cure_main.__file__ = os.path.realpath("main.py")
_cure_main.__builtins__ = __builtins__
sys.modules["__main__"] = _cure_main
del _cure_types
# Compiled here, outside the boot's try: a SyntaxError is the sample's failure, not ours.
exec(compile(_cure_source, _cure_main.__file__, "exec"), _cure_main.__dict__)
'''.replace("%(boot_rc)d", str(_BOOT_FAILED_RC))


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------
@dataclass
class _PidsCgroup:
    """A per-run ``pids`` cgroup: a kernel process-count limit that also binds root."""

    path: str

    @classmethod
    def create(cls, max_pids: int) -> _PidsCgroup | None:
        """Make one under the v1 ``pids`` hierarchy or the v2 root; None when not possible."""
        name = f"{_CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        for base in _pids_cgroup_bases():
            _remove_stale_cgroups(base)
            path = os.path.join(base, name)
            try:
                os.mkdir(path)
            except OSError:
                continue
            try:
                with open(os.path.join(path, "pids.max"), "w") as f:
                    f.write(str(max_pids))
                return cls(path)
            except OSError:
                _rmdir_quietly(path)
        return None

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def kill_all_and_remove(self) -> None:
        """SIGKILL every task in the cgroup until it is empty, then remove it."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            pids = self._pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        while time.monotonic() < deadline:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:  # EBUSY while killed tasks finish exiting
                time.sleep(0.01)

    def _pids(self) -> list[int]:
        try:
            with open(self.procs_file) as f:
                return [int(line) for line in f if line.strip()]
        except OSError:
            return []


@functools.lru_cache(maxsize=1)
def pids_cgroup_available() -> bool:
    """Whether runs get a kernel process-count limit (a per-run pids cgroup) on this host."""
    probe = _PidsCgroup.create(1)
    if probe is None:
        return False
    probe.kill_all_and_remove()
    return True


def _pids_cgroup_bases() -> list[str]:
    bases = []
    if os.path.isdir("/sys/fs/cgroup/pids"):  # cgroup v1
        bases.append("/sys/fs/cgroup/pids")
    try:  # cgroup v2 with the pids controller delegated to children of the root
        with open("/sys/fs/cgroup/cgroup.subtree_control") as f:
            if "pids" in f.read().split():
                bases.append("/sys/fs/cgroup")
    except OSError:
        pass
    return bases


def _remove_stale_cgroups(base: str) -> None:
    """Remove empty run cgroups left by parents that died before cleaning up."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(_CGROUP_PREFIX):
            continue
        owner = name[len(_CGROUP_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            _rmdir_quietly(os.path.join(base, name))  # fails (EBUSY) if tasks are still in it


def _rmdir_quietly(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


@functools.lru_cache(maxsize=1)
def _python_roots() -> tuple[str, ...]:
    """Directories of the running Python installation (stdlib, lib-dynload, the binary)."""
    roots = {sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    for key in ("stdlib", "platstdlib"):
        roots.add(sysconfig.get_paths()[key])
    return tuple(sorted({os.path.realpath(r) for r in roots if r}))


# Read roots besides the sandbox dir and the Python installation.
_SYSTEM_READ_ROOTS = (
    "/usr", "/lib", "/lib64", "/etc", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random",
    "/proc/cpuinfo", "/proc/meminfo",
)


def _nproc_rlimit(nproc: int) -> list[tuple[str, int, int]]:
    """RLIMIT_NPROC allowing ``nproc`` more tasks than this user already runs.

    Rule: the kernel counts every task of the real uid (not just the sample's), so the limit
    is offset by the current count; for root it is ignored by the kernel and left unset.
    """
    if os.geteuid() == 0:
        return []
    uid = str(os.getuid())
    running = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if fields.get("Uid", "").split()[:1] == [uid]:
                running += int(fields.get("Threads", "1"))
        except (OSError, ValueError):
            continue
    limit = running + nproc
    return [("RLIMIT_NPROC", limit, limit)]


def _child_env(workdir: str) -> dict[str, str]:
    # Rule: nothing inherited from the parent environment (no tokens, no PYTHON* variables).
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
    }


@dataclass(frozen=True)
class _Execution:
    """Raw outcome of one child run, before it is graded."""

    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    wall_s: float
    pid: int | None
    start_error: str | None = None


def _read_all(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def _wait_for_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait until the child exits or ``timeout_s`` passes; True on timeout. Does not reap."""
    try:
        # A pidfd wakes us the moment the child exits (Popen.wait(timeout) polls with sleeps).
        pidfd = os.pidfd_open(proc.pid)
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


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _execute(
    source: str,
    *,
    stdin: str,
    timeout_s: float,
    cpu_s: int,
    memory_mb: int,
    fsize_mb: int,
    nproc: int,
    audit_hooks: bool,
) -> _Execution:
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="cure-sandbox-"))
    cgroup = _PidsCgroup.create(nproc)
    started = time.monotonic()
    proc: subprocess.Popen[bytes] | None = None
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(source)
        mb = 1024 * 1024
        config = {
            "cgroup_procs": cgroup.procs_file if cgroup else None,
            "rlimits": [
                ("RLIMIT_CPU", cpu_s, cpu_s + 1),  # SIGXCPU at the soft limit, SIGKILL 1 s later
                ("RLIMIT_AS", memory_mb * mb, memory_mb * mb),
                ("RLIMIT_FSIZE", fsize_mb * mb, fsize_mb * mb),
                *_nproc_rlimit(nproc),
                ("RLIMIT_CORE", 0, 0),
            ],
            "unshare_net": True,
            "audit_hooks": audit_hooks,
            "read_roots": [*_python_roots(), *_SYSTEM_READ_ROOTS],
            "python_roots": _python_roots(),
        }
        # Output goes to unnamed temp files owned by the parent (no pipe deadlocks; the child's
        # RLIMIT_FSIZE bounds how much it can write).
        with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, \
                tempfile.TemporaryFile() as ferr:
            fin.write(stdin.encode("utf-8"))
            fin.seek(0)
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _BOOT, json.dumps(config)],
                    cwd=workdir,
                    env=_child_env(workdir),
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    close_fds=True,
                    start_new_session=True,  # own process group: one killpg reaches all of it
                )
            except OSError as exc:
                return _Execution(None, False, "", "", 0.0, None, start_error=repr(exc))
            timed_out = _wait_for_exit(proc, timeout_s)
            # Rule: SIGKILL the whole group on timeout and after a normal exit (stragglers).
            _kill_group(proc.pid)
            proc.wait()
            wall = time.monotonic() - started
            return _Execution(
                returncode=proc.returncode,
                timed_out=timed_out,
                stdout=_read_all(fout),
                stderr=_read_all(ferr),
                wall_s=wall,
                pid=proc.pid,
            )
    finally:
        if proc is not None and proc.returncode is None:  # interrupted before the normal kill
            _kill_group(proc.pid)
            proc.wait()
        if cgroup is not None:
            cgroup.kill_all_and_remove()  # also reaches tasks that left the group via setsid
        shutil.rmtree(workdir, ignore_errors=True)


def _status_of(run: _Execution) -> Status:
    if run.start_error is not None or run.returncode == _BOOT_FAILED_RC:
        return "error"
    if run.timed_out:
        return "timeout"
    if run.returncode == 0:
        return "passed"
    if run.returncode is not None and run.returncode < 0:
        return "killed"
    return "failed"


def _result(run: _Execution, status: Status | None = None, note: str = "") -> SandboxResult:
    status = status or _status_of(run)
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
    """Run ``source`` as ``__main__`` in a fresh sandboxed child; passed means exit status 0.

    ``nproc`` caps the child's tasks (processes and threads) through the pids cgroup where one
    can be made. ``audit_hooks=False`` leaves out the in-process guards and keeps only the
    kernel-enforced ones: for testing those, never for model output.
    """
    run = _execute(
        source,
        stdin=stdin,
        timeout_s=timeout_s,
        cpu_s=cpu_s,
        memory_mb=memory_mb,
        fsize_mb=fsize_mb,
        nproc=nproc,
        audit_hooks=audit_hooks,
    )
    return _result(run)


def _done_marker(nonce: str) -> str:
    """Code that prints the nonce once everything before it ran (so sys.exit(0) can't pass)."""
    return (
        "\n\nimport os as _cure_os, sys as _cure_sys\n"
        "_cure_sys.stdout.flush()\n"
        f"_cure_os.write(1, b'\\n{nonce}\\n')\n"
    )


def check_correctness(
    problem_program: str,
    tests: str,
    entry_point: str | None = None,
    timeout_s: float = 10.0,
    *,
    memory_mb: int = 1024,
) -> SandboxResult:
    """Run a HumanEval/MBPP-style program followed by its tests; passed iff all asserts hold.

    ``tests`` is appended after the program. When it defines ``check(candidate)`` without
    calling it, ``check(<entry_point>)`` is appended too. The run only passes if it reaches the
    end (a random marker printed after the tests), so an early ``sys.exit(0)`` fails.
    """
    nonce = f"cure-done-{secrets.token_hex(8)}"
    parts = [problem_program, "\n\n", tests, "\n"]
    calls_check = re.search(r"^check\(", tests, re.MULTILINE)
    if entry_point and re.search(r"^def check\(", tests, re.MULTILINE) and not calls_check:
        parts.append(f"\ncheck({entry_point})\n")
    parts.append(_done_marker(nonce))
    run = _execute(
        "".join(parts),
        stdin="",
        timeout_s=timeout_s,
        cpu_s=max(1, int(timeout_s) + 1),
        memory_mb=memory_mb,
        fsize_mb=16,
        nproc=32,
        audit_hooks=True,
    )
    status = _status_of(run)
    if status == "passed" and nonce not in run.stdout:
        return _result(run, "failed", "cure-sandbox: the program exited before the tests finished")
    return _result(run, status)


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

    Comparison ignores surrounding and repeated whitespace and compares numeric tokens as
    decimals (``1.0`` == ``1``). Stops at the first failing case; the result's stderr_tail
    then says which case failed and how.
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
    """LiveCodeBench ``functional`` cases: call ``Solution().<func_name>(*args)`` per case.

    ``case.input`` holds one JSON value per line (the arguments), ``case.output`` the JSON of
    the expected return value; tuples compare equal to lists. A plain top-level function named
    ``func_name`` is used when there is no ``Solution`` class.
    """
    return _check_cases(
        program, cases, timeout_s=timeout_s, memory_mb=memory_mb, func_name=func_name
    )


def _functional_driver(program: str, case_input: str, func_name: str, nonce: str) -> str:
    return (
        f"{program}\n\n"
        "import json as _cure_json, os as _cure_os, sys as _cure_sys\n"
        f"_cure_args = [_cure_json.loads(l) for l in {case_input!r}.split('\\n') if l.strip()]\n"
        "_cure_cls = globals().get('Solution')\n"
        f"_cure_fn = (getattr(_cure_cls(), {func_name!r}) if _cure_cls is not None "
        f"and hasattr(_cure_cls, {func_name!r}) else globals()[{func_name!r}])\n"
        "_cure_out = _cure_json.dumps(_cure_fn(*_cure_args))\n"
        "_cure_sys.stdout.flush()\n"
        f"_cure_os.write(1, ('\\n{nonce}' + _cure_out + '\\n').encode())\n"
    )


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
    total_wall = 0.0
    last: SandboxResult | None = None
    for index, case in enumerate(cases, 1):
        nonce = f"cure-ret-{secrets.token_hex(8)}:"
        if func_name is None:
            source, stdin = program, case.input
        else:
            source, stdin = _functional_driver(program, case.input, func_name, nonce), ""
        run = _execute(
            source,
            stdin=stdin,
            timeout_s=timeout_s,
            cpu_s=max(1, int(timeout_s) + 1),
            memory_mb=memory_mb,
            fsize_mb=64,
            nproc=32,
            audit_hooks=True,
        )
        total_wall += run.wall_s
        where = f"case {index}/{len(cases)}"
        status = _status_of(run)
        if status != "passed":
            return _with_wall(_result(run, status, f"cure-sandbox: {where}: {status}"), total_wall)
        if func_name is None:
            ok, got = _tokens_match(run.stdout, case.output), run.stdout
        else:
            ok, got = _functional_match(run.stdout, case.output, nonce)
        if not ok:
            note = (f"cure-sandbox: {where}: wrong answer: expected {_short(case.output)!r}, "
                    f"got {_short(got)!r}")
            return _with_wall(_result(run, "failed", note), total_wall)
        last = _result(run, "passed")
    assert last is not None
    return _with_wall(last, total_wall)


def _functional_match(stdout: str, expected: str, nonce: str) -> tuple[bool, str]:
    lines = [line for line in stdout.splitlines() if line.startswith(nonce)]
    if not lines:
        return False, "(no return value)"
    got = lines[-1][len(nonce):]
    try:
        return json.loads(got) == json.loads(expected), got
    except json.JSONDecodeError:
        return got.strip() == expected.strip(), got


def _with_wall(result: SandboxResult, wall_s: float) -> SandboxResult:
    return SandboxResult(
        passed=result.passed,
        status=result.status,
        returncode=result.returncode,
        stdout_tail=result.stdout_tail,
        stderr_tail=result.stderr_tail,
        wall_s=wall_s,
        pid=result.pid,
    )
