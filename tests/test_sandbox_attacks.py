"""A hostile tester's attacks on the sandbox (issue #18): each must fail to escape, fail grading, and leave
the grader and everything else on the host untouched.

Every attack runs twice:
  * graded: a wrong ``add`` plus the attack, through check_correctness (the path `cure bench` takes);
    it must not pass.
  * bare: the attack alone through run_program, with the audit hook OFF unless the attack is about
    neutering the hook, so the OS isolation alone has to hold.
After each run the host is checked, whatever the attack printed: the secret env var and secret file did
not leak into its output, nothing appeared in the host directory, the listener on 127.0.0.1 got no
connection, a bystander process of the sandbox's own uid is alive, no process the attack started is
left, and the run ended within its time limit.

Runs as root (as CI does) and as a normal user, e.g.
    runuser -u someone -- python3 -m pytest -p no:cacheprovider --noconftest tests/test_sandbox_attacks.py
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

import pytest

from cure_tasks import isolation
from cure_tasks.sandbox import check_correctness, run_program

pytestmark = pytest.mark.skipif(isolation.isolation_problem() is not None,
                                reason=str(isolation.isolation_problem()))

WRONG_ADD = "def add(a, b):\n    return a - b\n\n"
TESTS = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(5, 7) == 12\n"
TIMEOUT_S = 4.0


@dataclass(frozen=True)
class Attack:
    name: str
    expected: str          # what must happen instead
    code: str              # formatted with the Host fields
    hooks: bool = False    # keep the audit hook on in the bare run (attacks on the hook itself)


# Neuters the audit hook from inside: a denied call's traceback leads to the hook's frame, whose locals
# hold its check table and its deny() function.
NEUTER_BY_FRAMES = """
import os
try:
    os.system("true")
except PermissionError as exc:
    tb = exc.__traceback__
    while tb is not None:
        loc = tb.tb_frame.f_locals
        if "checks" in loc and "deny" in loc:
            loc["checks"].clear()
            loc["deny"].__code__ = (lambda what: None).__code__
            print("hook neutered")
        tb = tb.tb_next
"""

ESCAPES = """
import os, socket
def attempt(what, fn):
    try:
        out = fn()
        print("ESCAPED", what, repr(out)[:200])
    except BaseException as exc:
        print("blocked", what, type(exc).__name__)
attempt("write host dir", lambda: open({host_dir!r} + "/escaped.txt", "w").write("pwned"))
attempt("read secret file", lambda: open({secret_file!r}).read())
attempt("connect listener", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1))
def shell(command):
    status = os.system(command)     # runs once the hook is off; only where it can write matters
    if status:
        raise OSError(status, "the shell command failed")
attempt("system copy", lambda: shell("cat {secret_file} > {host_dir}/copied.txt && echo pwned > {host_dir}/sys.txt"))
attempt("kill bystander", lambda: os.kill({bystander}, 9))
"""

ATTACKS = [
    Attack("secrets: env and /proc/<pid>/environ", "no parent env var visible anywhere", """
import os, glob
print(dict(os.environ))
for p in sorted(glob.glob("/proc/*/environ")) + ["/proc/{grader}/environ", "/proc/%d/environ" % os.getppid()]:
    try:
        print(p, open(p, "rb").read())
    except OSError as exc:
        print("blocked", p, exc)
"""),
    Attack("secrets: host files", "host files outside the view unreadable", """
import os
for p in [{secret_file!r}, "/root/.bashrc", "/etc/shadow", "/etc/passwd", "/home", {host_dir!r}]:
    try:
        print(p, os.listdir(p) if os.path.isdir(p) else open(p).read())
    except OSError as exc:
        print("blocked", p, exc)
print(os.listdir("/"))
"""),
    Attack("write outside the sandbox dir", "read-only view: nothing written on the host", """
import os
for p in [{host_dir!r} + "/escaped.txt", "/usr/escaped.txt", "/escaped.txt", "/etc/escaped.txt",
          "/root/escaped.txt", "/proc/sys/kernel/hostname"]:
    try:
        open(p, "w").write("pwned")
        print("ESCAPED wrote", p)
    except OSError as exc:
        print("blocked", p, exc)
try:
    os.symlink({host_dir!r} + "/escaped.txt", "link")
    open("link", "w").write("pwned")
except OSError as exc:
    print("blocked symlink", exc)
"""),
    Attack("mknod device nodes", "no device node can be made or used", """
import os, stat
for name, major, minor in [("mem", 1, 1), ("kmsg", 1, 11), ("loop0", 7, 0), ("sda", 8, 0)]:
    try:
        os.mknod(name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
        with open(name, "rb") as f:
            print("ESCAPED read", name, f.read(64))
    except OSError as exc:
        print("blocked", name, exc)
"""),
    Attack("mkfifo / mknod outside", "nothing created on the host", """
import os, stat
for p in [{host_dir!r} + "/fifo", "/usr/fifo", "/fifo"]:
    try:
        os.mkfifo(p)
        print("ESCAPED fifo", p)
    except OSError as exc:
        print("blocked", p, exc)
try:
    os.mknod({host_dir!r} + "/node", stat.S_IFREG | 0o644)
except OSError as exc:
    print("blocked node", exc)
"""),
    Attack("host device nodes", "only null/zero/full/random/urandom/tty exist", """
for p in ["/dev/kmsg", "/dev/loop0", "/dev/mem", "/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/kvm"]:
    try:
        with open(p, "r+b") as f:
            print("ESCAPED opened", p)
    except OSError as exc:
        print("blocked", p, exc)
"""),
    Attack("signals and pidfd to the grader", "grader and a same-uid bystander survive", """
import os, signal
for target in [{grader}, {bystander}, os.getppid(), 1]:
    for how in ("kill", "pidfd"):
        try:
            if how == "kill":
                os.kill(target, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(os.pidfd_open(target), signal.SIGKILL)
            print("sent", how, target)
        except OSError as exc:
            print("blocked", how, target, exc)
os.kill(-1, signal.SIGKILL)
"""),
    Attack("hook neutered via traceback frames", "hook off, still no escape", NEUTER_BY_FRAMES + ESCAPES, hooks=True),
    Attack("hook neutered via __code__ replacement", "hook off, still no escape", """
import os
try:
    open({host_dir!r} + "/x", "w")
except PermissionError as exc:
    tb = exc.__traceback__
    while tb is not None:
        for value in list(tb.tb_frame.f_locals.values()):
            if callable(value) and getattr(value, "__name__", "") in ("deny", "check_write", "check_read"):
                value.__code__ = (lambda *a, **k: None).__code__
        tb = tb.tb_next
""" + ESCAPES, hooks=True),
    Attack("hook neutered by monkeypatching os.fspath", "path guard fooled, OS still refuses", """
import os, posixpath
inside = os.getcwd() + "/ok"              # every path now looks like one in the sandbox dir
os.fspath = lambda p: inside
posixpath.abspath = lambda p: inside
posixpath.realpath = lambda p, *a, **k: inside
""" + ESCAPES, hooks=True),
    Attack("setns / unshare namespace re-entry", "no way back into host namespaces", """
import ctypes, glob, os, socket
libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWUSER, NEWPID, NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
def check(rc, what):
    if rc != 0:
        raise OSError(ctypes.get_errno(), what)
for p in glob.glob("/proc/*/ns/*"):
    try:
        fd = os.open(p, os.O_RDONLY)
        check(libc.setns(fd, 0), "setns")
        print("setns into", p, os.readlink("/proc/self/ns/net"))
    except OSError as exc:
        print("blocked", p, exc)
for pid in (os.getppid(), 1, {grader}):
    try:
        check(libc.setns(os.pidfd_open(pid), NEWNET | NEWNS | NEWUSER), "setns pidfd")
        print("setns pidfd", pid)
    except OSError as exc:
        print("blocked pidfd", pid, exc)
for name, flag in (("user", NEWUSER), ("net", NEWNET), ("mount", NEWNS), ("pid", NEWPID)):
    try:
        check(libc.unshare(flag), "unshare")
        print("unshared", name)
    except OSError as exc:
        print("blocked unshare", name, exc)
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1)
    print("ESCAPED connected")
except OSError as exc:
    print("blocked connect", exc)
try:
    print("ESCAPED", open({secret_file!r}).read())
except OSError as exc:
    print("blocked read", exc)
"""),
    Attack("network to a local listener", "no connection reaches the host", """
import socket
for family, addr in [(socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_INET6, ("::1", {port}))]:
    try:
        s = socket.socket(family)
        s.settimeout(1)
        s.connect(addr)
        print("ESCAPED connected", addr)
    except OSError as exc:
        print("blocked", addr, exc)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {port}))
except OSError as exc:
    print("blocked udp", exc)
"""),
    Attack("orphan that outlives the run", "everything it started dies with it", """
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {token!r}])
    os._exit(0)
os.wait()
print("orphan started")
"""),
    Attack("fork bomb", "stopped by the process limit, nothing left", """
import os, time
n = 0
while True:
    try:
        if os.fork() == 0:
            os.setsid()
        n += 1
    except OSError:
        time.sleep(0.01)
"""),
    Attack("thread bomb", "stopped by the process limit", """
import threading, time
threads = []
try:
    while True:
        t = threading.Thread(target=time.sleep, args=(60,), daemon=True)
        t.start()
        threads.append(t)
except RuntimeError as exc:
    print("stopped after", len(threads), "threads:", exc)
"""),
    Attack("disk fill", "capped tmpfs, nothing on the host disk", """
import os
total = 0
for where in (".", "/tmp"):
    for i in range(10000):
        try:
            with open(os.path.join(where, "fill%d" % i), "wb") as f:
                f.write(b"x" * (1 << 20))
            total += 1
        except OSError as exc:
            print("stopped", where, exc)
            break
print("filled MB", total)
assert total <= 2 * 64, total
"""),
    Attack("become root", "setuid(0)/setgid(0) refused", """
import os
for name, call in [("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                   ("setgroups", lambda: os.setgroups([0])), ("chroot", lambda: os.chroot("/"))]:
    try:
        call()
        print("ESCAPED", name)
    except OSError as exc:
        print("blocked", name, exc)
print(open("/proc/self/status").read())
"""),
    Attack("fake pass: print markers, exit 0", "no pass without the judge's nonce", """
import os, sys
for guess in ("cure-done-0123456789abcdef", "ok", "PASS", "passed"):
    print(guess)
    for fd in range(3, 64):
        try:
            os.write(fd, guess.encode())
        except OSError:
            pass
sys.stdout.flush()
os._exit(0)
"""),
    Attack("fake pass: hunt the nonce", "the nonce is nowhere the sample can read", """
import os
found = []
for fd in os.listdir("/proc/self/fd"):
    try:
        os.set_blocking(int(fd), False)
        found.append(os.read(int(fd), 4096))
    except OSError:
        pass
for p in ("/proc/self/cmdline", "/proc/self/environ", "/sandbox/main.py", "/cure/child.py"):
    try:
        found.append(open(p, "rb").read())
    except OSError:
        pass
for blob in found:
    for fd in range(3, 64):
        try:
            os.write(fd, blob)
        except OSError:
            pass
os._exit(0)
"""),
    Attack("fake pass: garbage on the pipes", "the judge fails cleanly", """
import os
for fd in range(3, 64):
    try:
        os.write(fd, b"\\xff\\xff\\xff\\x7f" + b"{{" * 1000)
    except OSError:
        pass
"""),
    Attack("ptrace / memory of the grader", "grader invisible", """
import os
for p in ["/proc/{grader}/mem", "/proc/{grader}/maps", "/proc/{grader}/cmdline"]:
    try:
        print("ESCAPED", p, open(p, "rb").read(64))
    except OSError as exc:
        print("blocked", p, exc)
"""),
]

VALUE_ATTACKS = [
    # (name, expected, program, tests): wrong answers dressed up to compare equal.
    ("__eq__ always True", "an opaque handle, equal only to itself",
     "class Liar:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
     "def add(a, b):\n    return Liar()\n", TESTS),
    ("int subclass with __eq__ always True", "subclasses travel as handles, not values",
     "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
     "def add(a, b):\n    return Int(0)\n", TESTS),
    ("list holding an __eq__ liar", "elements are checked by value too",
     "class Liar:\n    def __eq__(self, other):\n        return True\n"
     "def add(a, b):\n    return [Liar()]\n", "def check(candidate):\n    assert candidate(1, 2) == [3]\n"),
    ("shadowing a builtin the tests use", "the tests keep the real builtins",
     "abs = lambda x: 0\ndef add(a, b):\n    return 0\n",
     "def check(candidate):\n    assert abs(candidate(1, 2) - 3) < 1e-9\n"),
    ("sys.exit(0) before the tests", "exiting early is a failure",
     "import sys\ndef add(a, b):\n    return 0\nsys.exit(0)\n", TESTS),
    ("raising SystemExit(0) from the call", "exiting mid-test is a failure",
     "import os\ndef add(a, b):\n    os._exit(0)\n", TESTS),
]


@dataclass
class Host:
    host_dir: str
    secret_file: str
    secret: str
    port: int
    grader: int
    bystander: int
    token: str
    listener: socket.socket


def sandbox_uid() -> int:
    return isolation.SANDBOX_UID if os.geteuid() == 0 else os.getuid()


def processes_with(needle: bytes) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.add(int(entry))
        except OSError:
            continue
    return found


def wait_until_gone(needle: bytes, baseline: set[int], within_s: float = 5.0) -> set[int]:
    deadline = time.monotonic() + within_s
    while True:
        left = processes_with(needle) - baseline
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.fixture
def host(tmp_path, monkeypatch):
    secret = "s3cr3t-" + secrets.token_hex(8)
    monkeypatch.setenv("HF_TOKEN", secret)
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    secret_file.chmod(0o644)                     # readable by anyone who can see it
    os.chmod(tmp_path, 0o755)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    drop = (["setpriv", f"--reuid={sandbox_uid()}", f"--regid={sandbox_uid()}", "--clear-groups"]
            if os.geteuid() == 0 else [])
    bystander = subprocess.Popen([*drop, "sleep", "600"])
    time.sleep(0.1)
    yield Host(str(host_dir), str(secret_file), secret, listener.getsockname()[1], os.getpid(),
               bystander.pid, "cure-orphan-" + secrets.token_hex(6), listener)
    bystander.kill()
    bystander.wait()
    listener.close()


def assert_contained(host: Host, output: str, wall_s: float, timeout_s: float, baseline: set[int]) -> None:
    assert host.secret not in output, "a secret leaked into the sample's output"
    assert "ESCAPED" not in output, output[-2000:]
    assert os.listdir(host.host_dir) == [], "the sample wrote into the host directory"
    for path in ("/usr/escaped.txt", "/escaped.txt", "/etc/escaped.txt", "/usr/fifo", "/fifo"):
        assert not os.path.exists(path)
    with pytest.raises(BlockingIOError):
        host.listener.accept()
    assert subprocess.run(["kill", "-0", str(host.bystander)]).returncode == 0, "the bystander was killed"
    assert wall_s < timeout_s + 5, f"the run took {wall_s:.1f} s"
    assert wait_until_gone(host.token.encode(), set()) == set(), "an orphan outlived the run"
    assert wait_until_gone(isolation.CHILD_PATH.encode(), baseline) == set(), "sandbox processes left"


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_is_contained_and_fails_grading(attack: Attack, host: Host) -> None:
    code = attack.code.format(**vars(host))
    baseline = processes_with(isolation.CHILD_PATH.encode())

    start = time.monotonic()
    graded = check_correctness(WRONG_ADD + code, TESTS, "add", timeout_s=TIMEOUT_S)
    wall = time.monotonic() - start
    assert not graded.passed, graded
    assert_contained(host, graded.stdout_tail + graded.stderr_tail, wall, TIMEOUT_S, baseline)

    start = time.monotonic()
    bare = run_program(code, timeout_s=TIMEOUT_S, cpu_s=int(TIMEOUT_S), nproc=16, audit_hooks=attack.hooks)
    wall = time.monotonic() - start
    assert_contained(host, bare.stdout_tail + bare.stderr_tail, wall, TIMEOUT_S, baseline)


@pytest.mark.parametrize("name,expected,program,tests", VALUE_ATTACKS, ids=[a[0] for a in VALUE_ATTACKS])
def test_value_attack_fails_grading(name: str, expected: str, program: str, tests: str) -> None:
    result = check_correctness(program, tests, "add", timeout_s=TIMEOUT_S)
    assert not result.passed and result.status == "failed", result


def test_the_sample_runs_unprivileged_in_its_own_namespaces() -> None:
    # Seen from the host: the sample execs a sleeper carrying a token; its /proc entry tells the truth.
    token = "cure-probe-" + secrets.token_hex(6)
    program = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(4)', {token!r}])\n"
    seen: dict = {}

    def watch() -> None:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and not seen:
            for pid in processes_with(token.encode()):
                try:
                    with open(f"/proc/{pid}/status") as f:
                        seen.update(line.split(":", 1) for line in f if ":" in line)
                    seen["ns"] = {n: os.readlink(f"/proc/{pid}/ns/{n}") for n in ("user", "mnt", "pid", "net", "ipc")}
                except OSError:
                    seen.clear()
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    run_program(program, timeout_s=6, audit_hooks=False)
    watcher.join()
    assert seen, "the sleeper never showed up"
    assert seen["Uid"].split() == [str(sandbox_uid())] * 4 and seen["Gid"].split()[0] == str(sandbox_uid())
    assert seen["Uid"].split()[0] != "0"
    assert seen["CapEff"].strip() == seen["CapPrm"].strip() == seen["CapBnd"].strip() == "0" * 16
    assert seen["NoNewPrivs"].strip() == "1"
    mine = {n: os.readlink(f"/proc/self/ns/{n}") for n in seen["ns"]}
    assert all(seen["ns"][n] != mine[n] for n in mine), (seen["ns"], mine)


def test_refuses_with_one_line_when_isolation_is_missing(monkeypatch) -> None:
    isolation.isolation_problem.cache_clear()
    monkeypatch.setattr(isolation, "_ENV", {**isolation._ENV, "PATH": "/nonexistent"})
    try:
        problem = isolation.isolation_problem()
        assert problem is not None and "bwrap" in problem and "\n" not in problem
        with pytest.raises(isolation.SandboxUnavailable, match="bwrap"):
            check_correctness("def add(a, b):\n    return a + b\n", TESTS, "add")
        with pytest.raises(isolation.SandboxUnavailable):
            run_program("print(1)")
    finally:
        monkeypatch.undo()
        isolation.isolation_problem.cache_clear()
    assert isolation.isolation_problem() is None
