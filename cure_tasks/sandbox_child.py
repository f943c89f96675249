"""The program that runs inside the sandbox: `python -I -S /cure/child.py CONFIG_JSON`.

cure_tasks/isolation.py builds the sandbox around it (namespaces, uid, read-only view, limits); this file is
bound into it read-only and uses the standard library only (nothing of cure is importable in there).
CONFIG_JSON holds the role and the fd numbers the parent passed. Roles:

run     The sample is the whole program (run_program, check_stdio): /sandbox/main.py runs as __main__ and
        its exit status and output are the result.
sample  /sandbox/main.py runs as __main__, then its top-level names are served to the judge over two pipes
        (check_correctness, check_functional): the judge asks, the sample calls and answers with values.
judge   A separate sandbox that runs the tests (/sandbox/tests.py, or one functional case). The names the
        program defined are proxies that call into the sample; every value that comes back is rebuilt here
        from plain data of exact builtin types (so an object whose __eq__ always says True arrives as an
        opaque handle that equals only itself; its str() is the judge's own, `in` is decided by value, and
        bool/len/iter are answered only for Python's own types, never by the program's class; a "stop"
        counts only as the answer to `next`). When the tests finish, the judge copies the nonce it read
        from its nonce pipe to its result pipe: the only pass signal, and the sample holds neither pipe.

The audit hook (install_audit_hook) is defence in depth on top of the OS isolation, not the boundary.
"""

from __future__ import annotations

import base64
import builtins
import importlib
import json
import os
import sys
import types
import weakref

SOURCE = "/sandbox/main.py"
TESTS = "/sandbox/tests.py"
# Exit code when the child cannot start the sample at all (the parent reports status "error").
BOOT_FAILED_RC = 213
# Bounds on what crosses the pipes: one message, and the nesting of one value.
MAX_FRAME_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 64
# Exception types the judge re-raises by name; anything else arrives as RemoteError.
_RERAISED = tuple(
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception)
    and not issubclass(value, (StopIteration, StopAsyncIteration))
)


class WireError(BaseException):
    """A message on the pipes that is not what the protocol allows.

    A BaseException: the tests' own ``except Exception`` must not swallow a forged reply."""


class RemoteError(Exception):
    """The program raised an exception that is not a builtin one (its type name leads the message)."""


# --------------------------------------------------------------------------------------------
# Framing: 4-byte big-endian length, then that many bytes of JSON.
# --------------------------------------------------------------------------------------------
def send(fd: int, message: dict) -> None:
    data = json.dumps(message, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(f"message of {len(data)} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def receive(fd: int) -> dict | None:
    """The next message, or None at end of file (the other side exited)."""
    head = _read_exact(fd, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_FRAME_BYTES:
        raise WireError(f"message of {size} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    data = _read_exact(fd, size)
    if data is None:
        raise WireError("the pipe closed in the middle of a message")
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        raise WireError("a message that is not valid JSON") from None
    if type(message) is not dict:
        raise WireError("a message that is not a JSON object")
    return message


# --------------------------------------------------------------------------------------------
# Values: exact builtin types travel by value, anything else as a handle.
# --------------------------------------------------------------------------------------------
_SEQUENCES = {list: "l", tuple: "t", set: "s", frozenset: "fs"}
_BUILD = {"l": list, "t": tuple, "s": set, "fs": frozenset}


def encode(value, handle, depth: int = 0):
    """Plain JSON data for ``value``.

    Rule: only exact builtin types (``type(v) is int``, never a subclass) travel by value, so no code of the
    program's runs while encoding and nothing but plain data reaches the other side; everything else (and
    anything nested deeper than MAX_DEPTH) becomes ``handle(value)``.
    """
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"i": hex(value)}              # hex: exact, and free of the int-to-decimal digit limit
    if kind is float:
        return {"f": value.hex()}
    if kind is complex:
        return {"c": [value.real.hex(), value.imag.hex()]}
    if kind is bytes:
        return {"b": base64.b64encode(value).decode("ascii")}
    if kind is types.ModuleType and _stdlib_module(getattr(value, "__name__", None)):
        return {"m": value.__name__}
    if depth >= MAX_DEPTH:
        return handle(value)
    if kind in _SEQUENCES:
        return {_SEQUENCES[kind]: [encode(v, handle, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, handle, depth + 1), encode(v, handle, depth + 1)] for k, v in value.items()]}
    return handle(value)


def decode(data, resolve, depth: int = 0):
    """The value ``data`` encodes; ``resolve(handle_id)`` turns a handle into an object. Strict: any other
    shape raises WireError."""
    if depth > MAX_DEPTH:
        raise WireError("a value nested too deeply")
    if data is None or type(data) is bool or type(data) is str:
        return data
    if type(data) is not dict or len(data) != 1:
        raise WireError("a value of an unknown shape")
    ((tag, body),) = data.items()
    try:
        if tag == "i" and type(body) is str:
            return int(body, 16)
        if tag == "f" and type(body) is str:
            return float.fromhex(body)
        if tag == "c" and type(body) is list and len(body) == 2 and all(type(x) is str for x in body):
            return complex(float.fromhex(body[0]), float.fromhex(body[1]))
        if tag == "b" and type(body) is str:
            return base64.b64decode(body.encode("ascii"), validate=True)
        if tag in _BUILD and type(body) is list:
            return _BUILD[tag](decode(v, resolve, depth + 1) for v in body)
        if tag == "d" and type(body) is list:
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise WireError("a dict entry that is not a pair")
                out[decode(pair[0], resolve, depth + 1)] = decode(pair[1], resolve, depth + 1)
            return out
        if tag == "h" and type(body) is int:
            return resolve(body)
        if tag == "m" and type(body) is str and _stdlib_module(body):
            return importlib.import_module(body)
    except WireError:
        raise
    except (ValueError, TypeError, OverflowError, ImportError) as exc:  # bad number text, unhashable key...
        raise WireError(f"a bad {tag!r} value ({type(exc).__name__})") from None
    raise WireError(f"a value of an unknown kind {tag!r}")


def _stdlib_module(name) -> bool:
    return type(name) is str and name.split(".")[0] in sys.stdlib_module_names


def same_value(got, want) -> bool:
    """Strict by-value equality of two JSON-shaped values: bool never equals a number, numbers compare by
    value (1 == 1.0), lists compare elementwise, dicts by keys and values."""
    if type(want) is bool or type(got) is bool:
        return type(got) is type(want) and got == want
    if type(want) in (int, float):
        return type(got) in (int, float) and got == want
    if type(want) is list:
        return (type(got) is list and len(got) == len(want)
                and all(same_value(g, w) for g, w in zip(got, want)))
    if type(want) is dict:
        return (type(got) is dict and got.keys() == want.keys()
                and all(same_value(got[k], want[k]) for k in want))
    return type(got) is type(want) and got == want


# --------------------------------------------------------------------------------------------
# The sample's side: serve the program's names.
# --------------------------------------------------------------------------------------------
class _Handles:
    """Objects of the program's handed to the judge by number (the same object always gets the same one)."""

    def __init__(self) -> None:
        self.objects: dict[int, object] = {}
        self._numbers: dict[int, int] = {}

    def handle(self, obj) -> dict:
        number = self._numbers.get(id(obj))
        if number is None:
            number = self._numbers[id(obj)] = len(self.objects)
            self.objects[number] = obj
        return {"h": number}

    def resolve(self, number: int):
        if number not in self.objects:
            raise WireError(f"unknown handle {number}")
        return self.objects[number]


def _perform(request: dict, handles: _Handles):
    op, target = request.get("op"), handles.resolve(request.get("h"))
    args = decode(request.get("a", {"l": []}), handles.resolve)
    if type(args) is not list:
        raise WireError("arguments that are not a list")
    if op == "call":
        kwargs = decode(request.get("k", {"d": []}), handles.resolve)
        if type(kwargs) is not dict or not all(type(k) is str for k in kwargs):
            raise WireError("keyword arguments that are not a dict of names")
        return target(*args, **kwargs)
    if op == "getattr" and len(args) == 1 and type(args[0]) is str:
        return getattr(target, args[0])
    if op == "getitem" and len(args) == 1:
        return target[args[0]]
    unary = {"iter": iter, "next": next, "len": len, "bool": bool}
    if op in unary and not args:
        # Rule: only a type of Python's own answers these (a generator, map, range, deque...): the program's
        # class would decide by its own __bool__/__len__/__iter__ what the tests see, not by value.
        if not _fixed_type(target):
            raise TypeError(f"the tests cannot ask for {op}() of a {type(target).__name__} the program "
                            f"defined (only of plain data and Python's own types)")
        return unary[op](target)
    raise WireError(f"unknown request {op!r}")


def _fixed_type(obj) -> bool:
    """Whether ``obj``'s type and every base are Python's own compiled types (no class statement of the
    program's anywhere), and not one that hands bool/len/iter on to another object (weakref proxies,
    mappingproxy)."""
    cls = type(obj)
    if cls in (weakref.ProxyType, weakref.CallableProxyType, types.MappingProxyType):
        return False
    return not any(base.__flags__ & _HEAPTYPE for base in cls.__mro__)


_HEAPTYPE = 1 << 9      # Py_TPFLAGS_HEAPTYPE: the type was made by a class statement (or type())


def _exception_reply(exc: BaseException) -> dict:
    name = type(exc).__name__ if type(exc).__name__ in _RERAISED and type(exc).__module__ == "builtins" \
        else "RemoteError"
    try:
        text = str(exc)
    except Exception:
        text = "(unprintable)"
    if type(text) is not str:
        text = "(unprintable)"
    if name == "RemoteError":
        text = f"{type(exc).__name__}: {text}"
    return {"x": [name, text[:2000]]}


def serve(namespace: dict, requests_fd: int, replies_fd: int) -> None:
    """Answer the judge until it closes the pipe: first the program's names, then one reply per request."""
    handles = _Handles()
    names = {name: encode(value, handles.handle) for name, value in list(namespace.items())
             if type(name) is str and not (name.startswith("__") and name.endswith("__"))}
    send(replies_fd, {"ready": names})
    while True:
        request = receive(requests_fd)
        if request is None:
            return
        try:
            reply = {"v": encode(_perform(request, handles), handles.handle)}
        except StopIteration as exc:
            # Rule: "stop" is the end of an iteration, so only the answer to `next`; a StopIteration out of
            # a call is the program's error (a test built on map() or a generator must not end early).
            reply = {"stop": True} if request.get("op") == "next" else _exception_reply(exc)
        except WireError:
            raise
        except Exception as exc:        # the program's own error: the judge re-raises it
            reply = _exception_reply(exc)
        send(replies_fd, reply)


# --------------------------------------------------------------------------------------------
# The judge's side: proxies for the program's objects.
# --------------------------------------------------------------------------------------------
class Remote:
    """An object of the program's that is not plain data. It stays in the sample's process: the judge can
    call it, read its attributes, index and iterate it, and every answer comes back by value; it compares
    equal only to itself (the sample's __eq__ is never asked), its str() is drawn here, and its truth, len
    and iteration come from the sample only where Python's own type decides them (see _fixed_type)."""

    __slots__ = ("_cure_link", "_cure_number")

    def __init__(self, link: "Link", number: int) -> None:
        object.__setattr__(self, "_cure_link", link)
        object.__setattr__(self, "_cure_number", number)

    def _ask(self, op: str, *args, **kwargs):
        return self._cure_link.request(op, self, list(args), kwargs)

    def __call__(self, *args, **kwargs):
        return self._ask("call", *args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_cure_"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value) -> None:
        raise TypeError("the judge cannot change the program's objects")

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __contains__(self, key) -> bool:
        # By value here, as ``==`` is: the program's own __contains__ or its items' __eq__ are never asked.
        return any(item is key or item == key for item in self)

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __len__(self) -> int:
        n = self._ask("len")
        if type(n) is not int:
            raise TypeError("len() of a program object did not give an int")
        return n

    def __bool__(self) -> bool:
        answer = self._ask("bool")
        if type(answer) is not bool:
            raise TypeError("bool() of a program object did not give a bool")
        return answer

    def __repr__(self) -> str:
        # Local, and str() and format() too: an assertion message or a comparison of str(result) never
        # calls into the program (its __str__ could say anything).
        return f"<program object #{self._cure_number}>"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __eq__(self, other) -> bool:
        return type(other) is Remote and other._cure_link is self._cure_link \
            and other._cure_number == self._cure_number

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(("cure-remote", self._cure_number))


class Link:
    """The judge's end of the pipes to the sample."""

    def __init__(self, requests_fd: int, replies_fd: int) -> None:
        self.requests_fd, self.replies_fd = requests_fd, replies_fd
        self._remotes: dict[int, Remote] = {}

    def value(self, data):
        return decode(data, self._remote)

    def _remote(self, number: int) -> Remote:
        if number not in self._remotes:
            self._remotes[number] = Remote(self, number)
        return self._remotes[number]

    def _argument(self, obj) -> dict:
        if type(obj) is Remote and obj._cure_link is self:
            return {"h": obj._cure_number}
        raise TypeError(f"cannot pass a {type(obj).__name__} to the program (only plain data)")

    def request(self, op: str, target: Remote, args: list, kwargs: dict):
        message = {"op": op, "h": target._cure_number, "a": encode(args, self._argument)}
        if kwargs:
            message["k"] = encode(kwargs, self._argument)
        send(self.requests_fd, message)
        reply = receive(self.replies_fd)
        if reply is None:
            raise RemoteError("the program exited while the tests were calling it")
        if set(reply) == {"v"}:
            return self.value(reply["v"])
        if reply == {"stop": True} and op == "next":
            raise StopIteration
        if set(reply) == {"x"} and type(reply["x"]) is list and len(reply["x"]) == 2 \
                and all(type(x) is str for x in reply["x"]):
            name, text = reply["x"]
            cls = getattr(builtins, name) if name in _RERAISED else RemoteError
            raise cls(text)
        raise WireError("a reply of an unknown shape")


def _functional_case(names: dict, spec: dict) -> None:
    """One LiveCodeBench functional case: ``Solution().<func>(*args)`` (or a plain top-level function),
    its return value compared with the expected JSON by :func:`same_value`."""
    func_name = spec["func_name"]
    args = [json.loads(line) for line in spec["input"].split("\n") if line.strip()]
    cls = names.get("Solution")
    fn = getattr(cls(), func_name) if cls is not None and hasattr(cls, func_name) else names[func_name]
    got = json.dumps(fn(*args))             # a program object is not JSON: TypeError, the case fails
    try:
        want = json.loads(spec["output"])
    except json.JSONDecodeError:
        ok = got.strip() == spec["output"].strip()
    else:
        ok = same_value(json.loads(got), want)
    if not ok:
        raise AssertionError(f"wrong answer: expected {spec['output'][:300]!r}, got {got[:300]!r}")


def judge(cfg: dict) -> int:
    fds = cfg["fds"]
    nonce = os.read(fds["nonce"], 256)
    os.close(fds["nonce"])
    tests = None
    if cfg.get("functional") is None:
        with open(TESTS, encoding="utf-8") as f:
            tests = compile(f.read(), TESTS, "exec")
    if cfg["audit_hooks"]:
        install_audit_hook(cfg)
    link = Link(fds["requests"], fds["replies"])
    first = receive(fds["replies"])
    if first is None or set(first) != {"ready"} or type(first["ready"]) is not dict:
        sys.stderr.write("cure-sandbox: the program exited before the tests could call it\n")
        return 1
    keep = cfg.get("entry_point")
    # Rule: a program's name never shadows a builtin in the tests (its `abs` that always says 0 stays its
    # own), except the entry point the tests call by name.
    names = {name: link.value(data) for name, data in first["ready"].items()
             if name == keep or not hasattr(builtins, name)}
    if cfg.get("functional") is not None:
        _functional_case(names, cfg["functional"])
    else:
        namespace = {**names, "__name__": "__main__", "__builtins__": builtins}
        exec(tests, namespace)
    # Rule: the pass signal is written only here, after every test ran, on a pipe the sample never holds.
    os.write(fds["result"], nonce)
    return 0


# --------------------------------------------------------------------------------------------
# The audit hook: defence in depth inside the sandbox (the OS isolation is the boundary).
# --------------------------------------------------------------------------------------------
def install_audit_hook(cfg: dict) -> None:
    """Refuse process creation, sockets, ctypes, writes outside the sandbox dir, reads outside the allowed
    roots, signals to other processes, raising limits and gc walks, for ordinary Python code."""
    root = os.path.realpath(os.getcwd())
    pid = os.getpid()
    pgid = os.getpgid(0)

    # Rule: no process creation through _posixsubprocess (subprocess, multiprocessing spawn).
    stub = types.ModuleType("_posixsubprocess")

    def fork_exec(*args, **kwargs):
        raise PermissionError("sandbox: starting processes is not allowed")
    stub.fork_exec = fork_exec
    sys.modules["_posixsubprocess"] = stub

    write_roots = (root,)
    read_roots = tuple(cfg["read_roots"]) + write_roots + ("/proc/%d" % pid, "/proc/self")
    stdin_names = ("/dev/stdin", "/proc/self/fd/0", "/proc/%d/fd/0" % pid)
    native_roots = tuple(cfg["python_roots"])
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    default_dir_fds = (None, -1, -100)  # -100 is AT_FDCWD
    realpath, abspath, join, split, isdir = (
        os.path.realpath, os.path.abspath, os.path.join, os.path.split, os.path.isdir)
    fsdecode, fspath, readlink = os.fsdecode, os.fspath, os.readlink

    def deny(what):
        raise PermissionError("sandbox: %s is not allowed" % what)

    def under(path, roots):
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def resolve(path, dir_fd=None, follow=True):
        """Absolute real path the kernel will touch; None for an already-open fd."""
        if isinstance(path, int):
            return None
        try:
            p = fsdecode(fspath(path))
            if dir_fd not in default_dir_fds:
                p = join(readlink("/proc/self/fd/%d" % dir_fd), p)
            if follow:
                return realpath(p)
            head, tail = split(abspath(p))
            return join(realpath(head), tail)
        except Exception:
            deny("an unresolvable path")

    def check_write(path, dir_fd=None, entry=True, target=True):
        # Rule: everything written (the entry itself and, through symlinks, its target) stays inside the
        # sandbox dir; /dev/null is the one exception.
        for follow, wanted in ((False, entry), (True, target)):
            if wanted:
                real = resolve(path, dir_fd, follow)
                if real is not None and real != "/dev/null" and not under(real, write_roots):
                    deny("writing %r outside the sandbox dir" % real)

    def check_read(path):
        if not isinstance(path, int) and fsdecode(fspath(path)) in stdin_names:
            return
        real = resolve(path)
        if real is None or under(real, write_roots):
            return
        # Rule: outside the sandbox dir only files (no directory fds to use as dir_fd) under the read roots.
        if not under(real, read_roots) or isdir(real):
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


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------
def _main_module() -> types.ModuleType:
    module = types.ModuleType("__main__")
    module.__file__ = SOURCE
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    return module


def main() -> None:
    try:
        cfg = json.loads(sys.argv[1])
        role = cfg["role"]
        sys.dont_write_bytecode = True
        if role == "judge":
            sys.argv = ["tests.py"]
        else:
            sys.argv = ["main.py"]
            with open(SOURCE, encoding="utf-8") as f:
                source = f.read()
            if cfg["audit_hooks"]:
                install_audit_hook(cfg)
            module = _main_module()
    except BaseException as exc:
        sys.stderr.write("cure-sandbox: boot failed: %r\n" % (exc,))
        sys.stderr.flush()
        os._exit(BOOT_FAILED_RC)
    if role == "judge":
        sys.exit(judge(cfg))
    # Compiled here, outside the boot's try: a SyntaxError is the sample's failure, not ours.
    exec(compile(source, SOURCE, "exec"), module.__dict__)
    if role == "sample":
        sys.stdout.flush()
        serve(module.__dict__, cfg["fds"]["requests"], cfg["fds"]["replies"])


if __name__ == "__main__":
    main()
