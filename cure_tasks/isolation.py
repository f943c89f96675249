"""OS isolation for model-written code: the command line that starts one sandboxed process, and whether
this machine can start it at all.

Every process (cure_tasks/sandbox_child.py in one of its roles) starts through well-kept tools only:
bubblewrap (``bwrap``) for the namespaces and the filesystem view, util-linux ``setpriv`` and ``prlimit``
for the uid and the limits.

    as root:    sh (join a per-run pids cgroup) -> bwrap, privileged: a read-only view of the roots below
                -> setpriv: uid/gid 65534, no supplementary groups, no capabilities, no-new-privs
                -> prlimit -> bwrap, unprivileged -> python
    as a user:  prlimit -> bwrap, unprivileged -> python

The unprivileged bwrap gives each process its own user, mount, PID, network (loopback only), IPC, UTS and
cgroup namespaces, forbids further user namespaces, drops every capability, sets no-new-privs, and shows
a read-only view: /usr (plus the merged-/usr links), the Python installation, /etc/ld.so.cache, a fresh
/proc of its own PID namespace and a read-only /dev holding null, zero, full, random, urandom and the fd
links (/dev/shm is a link to /tmp). The only writable places are two size-capped tmpfs (/sandbox, the cwd,
and /tmp) that vanish with it; a seccomp filter refuses the other ways to hold the host's memory (memfd,
SysV shm and message queues, POSIX mq). Nothing from the parent's environment goes in.
When the process ends, its PID namespace ends, so nothing it started outlives the run; --die-with-parent
kills it if the grader dies. As root the outer bwrap exists because the unprivileged one resolves its
bind sources as uid 65534, which cannot pass through e.g. a 0700 /root holding a pyenv Python: the outer
view has 0755 parents, so the same binds work.

Limits, all set before the sample's exec: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC (offset by
what the sandbox uid already runs), RLIMIT_NOFILE, RLIMIT_CORE=0, and as root a pids cgroup with pids.max as well.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from typing import IO

from cure_core.errors import CureError

# The uid/gid a sample runs as when the grader is root (nobody/nogroup on Debian).
SANDBOX_UID = 65534
# Size of each writable tmpfs (/sandbox and /tmp) in a sandbox.
TMPFS_BYTES = 64 * 1024 * 1024
# RLIMIT_NOFILE: open files, so pipe and socket buffers (kernel memory no other cap counts) stay bounded.
NOFILE = 1024
# Where sandbox_child.py, the program and the tests appear inside.
CHILD_PATH = "/cure/child.py"
_CHILD_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
_CGROUP_PREFIX = "cure-sbx-"
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "HOME": "/sandbox", "TMPDIR": "/sandbox"}


class SandboxUnavailable(CureError):
    """This machine cannot isolate generated code; the message says what is missing."""


@dataclass(frozen=True)
class Limits:
    """Kernel limits for one sandboxed process."""

    timeout_s: float        # wall clock (the parent kills the process)
    cpu_s: int              # RLIMIT_CPU: SIGXCPU at cpu_s, SIGKILL one second later
    memory_mb: int          # RLIMIT_AS
    fsize_mb: int           # RLIMIT_FSIZE: largest file it can write (stdout included)
    nproc: int              # tasks it may add (RLIMIT_NPROC offset, and pids.max as root)


# --------------------------------------------------------------------------------------------
# Is isolation available?
# --------------------------------------------------------------------------------------------
def _root() -> bool:
    return os.geteuid() == 0


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """None when generated code can be isolated here; otherwise one line saying what is missing.

    Probes once per process by starting a real sandbox (the same command line every run uses).
    """
    tools = ("bwrap", "prlimit", "setpriv") if _root() else ("bwrap", "prlimit")
    missing = [tool for tool in tools if shutil.which(tool, path=_ENV["PATH"]) is None]
    if missing:
        return (f"cannot isolate generated code: {' and '.join(missing)} not found "
                f"(apt-get install bubblewrap util-linux)")
    limits = Limits(timeout_s=20.0, cpu_s=10, memory_mb=512, fsize_mb=1, nproc=8)
    try:
        with open(os.devnull, "rb") as null, _scratch() as out, _scratch() as err:
            proc = _spawn({"role": "run", "audit_hooks": False}, {"/sandbox/main.py": "print('ok')"},
                          limits=limits, stdin=null, stdout=out, stderr=err)
            try:
                proc.popen.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                pass
            proc.kill()
            output, error = _read(out), _read(err)
    except OSError as exc:
        return f"cannot isolate generated code: {exc}"
    if proc.popen.returncode == 0 and output.strip() == "ok":
        return None
    reason = next((line.strip() for line in error.splitlines() if line.strip()),
                  f"exit status {proc.popen.returncode}")
    return f"cannot isolate generated code: the sandbox does not start here ({cut_at_word(reason, 400)})"


def cut_at_word(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its words up to ``limit`` and "..." (a word
    longer than the limit is the only thing cut inside)."""
    if len(text) <= limit:
        return text
    head = text[:limit + 1].rsplit(None, 1)[0] if " " in text[:limit + 1] else text[:limit]
    return head.rstrip() + " ..."


def require_isolation() -> None:
    """Raise SandboxUnavailable (one line) unless generated code can be isolated here."""
    problem = isolation_problem()
    if problem is not None:
        raise SandboxUnavailable(problem)


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def python_roots() -> tuple[str, ...]:
    """Directories of the running Python installation (stdlib, lib-dynload, the binary)."""
    roots = {sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    for key in ("stdlib", "platstdlib"):
        roots.add(sysconfig.get_paths()[key])
    return tuple(sorted({os.path.realpath(r) for r in roots if r}))


def _view() -> tuple[list[str], list[str], list[str]]:
    """(bwrap arguments for the system part of the read-only view, those for the Python installation and
    /etc/ld.so.cache, the directories bound).

    Rule: the caller puts the second part after its tmpfs mounts, so a Python that lives under /tmp (a venv
    there) is bound on top of the fresh /tmp instead of being hidden by it.
    """
    system: list[str] = ["--ro-bind", "/usr", "/usr"]
    bound = ["/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):             # merged /usr: keep the link
            system += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            system += ["--ro-bind", top, top]
            bound.append(top)
    made: set[str] = set()

    def parents(path: str) -> list[str]:
        # Rule: parents of a bind are made 0755, so the unprivileged uid can reach it.
        parts = path.strip("/").split("/")[:-1]
        out: list[str] = []
        for i in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:i])
            if parent not in made:
                made.add(parent)
                out += ["--perms", "0755", "--dir", parent]
        return out

    python: list[str] = []
    for root in python_roots():
        if any(root == b or root.startswith(b + "/") for b in bound):
            continue
        python += [*parents(root), "--ro-bind", root, root]
        bound.append(root)
    python += [*parents("/etc/ld.so.cache"), "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return system, python, bound


# The device nodes a sandbox gets (bound from the host's /dev, read-only /dev around them).
DEVICES = ("null", "zero", "full", "random", "urandom")


def _dev() -> list[str]:
    """bwrap arguments for a minimal /dev: the five devices, the fd links, and /dev/shm as a link to the
    capped /tmp. The caller remounts /dev read-only, so nothing can be written in it (a writable /dev is an
    uncapped tmpfs in the host's memory)."""
    args = ["--perms", "0755", "--size", str(64 * 1024), "--tmpfs", "/dev"]
    for name in DEVICES:
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"), ("shm", "/tmp")):
        args += ["--symlink", target, f"/dev/{name}"]
    return args


def read_roots() -> list[str]:
    """What the audit hook inside lets the sample read besides its own dirs (the view, less /etc)."""
    return [*_view()[2], *python_roots(), "/cure", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random",
            "/proc/cpuinfo", "/proc/meminfo"]


def _outer_privileged() -> list[str]:
    """As root: a privileged bwrap that builds the view, then setpriv down to the sandbox uid."""
    system, python, _ = _view()
    return [
        "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--die-with-parent", *system, "--dev", "/dev", "--bind", "/proc", "/proc",
        "--size", str(1024 * 1024), "--tmpfs", "/tmp", *python,
        "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP",
        "--",
        "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--no-new-privs",
        "--inh-caps=-all", "--bounding-set=-all", "--",
    ]


def _prlimit(limits: Limits, uid: int) -> list[str]:
    mb = 1024 * 1024
    nproc = _running_tasks(uid) + limits.nproc + 3     # + the unprivileged bwrap, its init and python
    return ["prlimit", f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}", f"--as={limits.memory_mb * mb}",
            f"--fsize={limits.fsize_mb * mb}", f"--nproc={nproc}", f"--nofile={NOFILE}", "--core=0", "--"]


def _running_tasks(uid: int) -> int:
    """Tasks (threads included) that ``uid`` runs now.

    Rule: RLIMIT_NPROC counts every task of the real uid, not just the sample's, so the limit is offset by
    this count.
    """
    running = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if fields.get("Uid", "").split()[:1] == [str(uid)]:
                running += int(fields.get("Threads", "1"))
        except (OSError, ValueError):
            continue
    return running


def _sandbox(files: dict[str, int], cfg: dict, seccomp_fd: int | None) -> list[str]:
    """The unprivileged bwrap and the python in it; ``files`` maps a path inside to an fd with its text,
    ``seccomp_fd`` holds the filter from :func:`seccomp_filter`."""
    system, python, _ = _view()
    data: list[str] = []
    for dest, fd in files.items():
        data += ["--ro-bind-data", str(fd), dest]
    env: list[str] = []
    for key, value in _ENV.items():
        env += ["--setenv", key, value]
    return [
        "bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session",
        "--hostname", "sandbox", *system, "--proc", "/proc", *_dev(),
        "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp", "--size", str(TMPFS_BYTES), "--tmpfs", "/sandbox",
        *python, *data, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/sandbox", "--clearenv", *env,
        "--cap-drop", "ALL", *([] if seccomp_fd is None else ["--seccomp", str(seccomp_fd)]),
        "--", os.path.realpath(sys.executable), "-I", "-S", CHILD_PATH, json.dumps(cfg),
    ]


# --------------------------------------------------------------------------------------------
# The seccomp filter: memory a sample could hold outside its capped tmpfs
# --------------------------------------------------------------------------------------------
# Per architecture: the AUDIT_ARCH value, the syscalls refused, and whether syscall numbers at or above
# 0x40000000 (the x32 ABI) are another ABI. memfd_create, memfd_secret, shmget, msgget and mq_open each make
# kernel memory (shmem, message queues) that no tmpfs cap or RLIMIT_AS counts and that lives as long as
# the sandbox; refused with EPERM. A syscall of another ABI (i386 or x32 on x86_64, arm32 on aarch64) is
# refused too, so the same calls cannot come in under other numbers.
_SECCOMP_ARCHES = {
    #          AUDIT_ARCH   memfd_create memfd_secret shmget msgget mq_open    x32 bit
    "x86_64": (0xC000003E, (319, 447, 29, 68, 240), True),
    "aarch64": (0xC00000B7, (279, 447, 194, 186, 180), False),
}


@functools.lru_cache(maxsize=1)
def seccomp_filter() -> bytes | None:
    """The classic-BPF program (struct sock_filter[]) bwrap's --seccomp loads; None on an architecture
    this table does not know (there the tmpfs caps and RLIMIT_AS are the only memory bounds)."""
    spec = _SECCOMP_ARCHES.get(os.uname().machine)
    if spec is None:
        return None
    arch, refused, x32 = spec
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1          # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    # (code, jump-to-deny when true?, jump-to-deny when false?, k); jumps are filled in below.
    program: list[tuple[int, bool, bool, int]] = [(ld_abs, False, False, 4), (jeq, False, True, arch),
                                                 (ld_abs, False, False, 0)]
    if x32:
        program.append((jge, True, False, 0x40000000))
    program += [(jeq, True, False, nr) for nr in refused]
    program += [(ret, False, False, allow), (ret, False, False, deny)]
    last = len(program) - 1
    out = b""
    for i, (code, true_denies, false_denies, k) in enumerate(program):
        to_deny = last - (i + 1)
        out += struct.pack("=HBBI", code, to_deny if true_denies else 0, to_deny if false_denies else 0, k)
    return out


# --------------------------------------------------------------------------------------------
# Running one sandboxed process
# --------------------------------------------------------------------------------------------
@dataclass
class Sandboxed:
    """One started sandbox: its outermost process, the init of its PID namespace, and as root its pids
    cgroup."""

    popen: subprocess.Popen
    cgroup: "_PidsCgroup | None"
    init_pidfd: int | None = None     # pidfd of the outermost bwrap's namespace init

    def kill(self) -> None:
        """SIGKILL it and wait until nothing of it is left.

        Rule: killing bwrap kills its namespace init (--die-with-parent), and the kernel kills every other
        process of that PID namespace before the init's exit completes; so once the init's pidfd is readable,
        everything the sample started is gone.
        """
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.popen.wait()
        if self.init_pidfd is not None:
            select.select([self.init_pidfd], [], [], 10.0)
            os.close(self.init_pidfd)
            self.init_pidfd = None
        if self.cgroup is not None:
            self.cgroup.kill_all_and_remove()

    @property
    def returncode(self) -> int | None:
        """The sample's exit status; -N when a signal N ended it (bwrap reports those as 128 + N)."""
        rc = self.popen.returncode
        if rc is not None and 128 < rc < 128 + signal.NSIG:
            return -(rc - 128)
        return rc


def start(cfg: dict, files: dict[str, str], *, limits: Limits, stdin: IO[bytes], stdout: IO[bytes],
          stderr: IO[bytes], pass_fds: dict[str, int] | None = None) -> Sandboxed:
    """Start sandbox_child.py in one sandbox. ``files``: path inside -> text (read-only there);
    ``pass_fds``: name -> fd of this process, handed in under the same number (cfg["fds"] names them)."""
    require_isolation()
    return _spawn(cfg, files, limits=limits, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds)


def _spawn(cfg: dict, files: dict[str, str], *, limits: Limits, stdin: IO[bytes], stdout: IO[bytes],
           stderr: IO[bytes], pass_fds: dict[str, int] | None = None) -> Sandboxed:
    fds = dict(pass_fds or {})
    cfg = {**cfg, "fds": fds, "read_roots": read_roots(), "python_roots": list(python_roots())}
    with open(_CHILD_SOURCE, encoding="utf-8") as f:
        texts = {CHILD_PATH: f.read(), **files}
    data_fds = {dest: _memfd(text) for dest, text in texts.items()}
    bpf = seccomp_filter()
    seccomp_fd = None if bpf is None else _memfd(bpf)
    info_r, info_w = os.pipe()
    cgroup = None
    try:
        uid = SANDBOX_UID if _root() else os.getuid()
        command = _prlimit(limits, uid) + _sandbox(data_fds, cfg, seccomp_fd)
        if _root():
            cgroup = _PidsCgroup.create(limits.nproc + 8)
            command = _outer_privileged() + command
        # The outermost bwrap reports the pid of its namespace init (kill() waits for it).
        first = command.index("bwrap") + 1
        command[first:first] = ["--info-fd", str(info_w)]
        if cgroup is not None:
            # Rule: join the pids cgroup before anything else runs, so the kernel counts every fork.
            command = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cgroup.procs_file, *command]
        try:
            popen = subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=stderr, env=dict(_ENV),
                                     cwd="/", close_fds=True, start_new_session=True,
                                     pass_fds=(*fds.values(), *data_fds.values(), info_w,
                                               *([] if seccomp_fd is None else [seccomp_fd])))
        except OSError:
            if cgroup is not None:
                cgroup.kill_all_and_remove()
            raise
        os.close(info_w)
        info_w = -1
        return Sandboxed(popen, cgroup, _init_pidfd(info_r))
    finally:
        for fd in (*data_fds.values(), info_r, info_w, -1 if seccomp_fd is None else seccomp_fd):
            if fd >= 0:
                os.close(fd)


def _init_pidfd(info_r: int) -> int | None:
    """A pidfd for the "child-pid" bwrap writes to its --info-fd (None if it wrote nothing: it failed)."""
    data, deadline = b"", time.monotonic() + 10.0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([info_r], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(info_r, 4096) if ready else b""
        if not chunk:
            break
        data += chunk
    try:
        pid = json.loads(data)["child-pid"]
        return os.pidfd_open(pid) if type(pid) is int else None
    except (ValueError, KeyError, TypeError, OSError):
        return None


def _memfd(text: str | bytes) -> int:
    """An anonymous in-memory file holding ``text``, positioned at its start (bwrap reads it)."""
    fd = os.memfd_create("cure-sandbox")
    data = memoryview(text.encode("utf-8") if isinstance(text, str) else text)
    while data:
        data = data[os.write(fd, data):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _scratch() -> IO[bytes]:
    return tempfile.TemporaryFile()


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------
# The per-run pids cgroup (root only)
# --------------------------------------------------------------------------------------------
@dataclass
class _PidsCgroup:
    """A per-run ``pids`` cgroup: a kernel process-count limit counted per sandbox."""

    path: str

    @classmethod
    def create(cls, max_pids: int) -> "_PidsCgroup | None":
        """Make one under the v1 ``pids`` hierarchy or the v2 root; None when not possible."""
        name = f"{_CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        for base in pids_cgroup_bases():
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
    """Whether runs get a per-run pids cgroup on top of RLIMIT_NPROC (root with a writable pids controller)."""
    if not _root():
        return False
    probe = _PidsCgroup.create(1)
    if probe is None:
        return False
    probe.kill_all_and_remove()
    return True


def pids_cgroup_bases() -> list[str]:
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
