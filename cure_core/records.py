"""Reading JSON-lines files that cure wrote (traces, bench progress) without trusting them.

A file on disk may be truncated, hand-edited or crafted. Everything read back goes through here:

* `json_lines` streams a regular file line by line with bounded sizes (no /dev/zero, no FIFO that never
  ends, no 10 GB line), and turns every way parsing can fail (bad UTF-8, bad JSON, nesting deep enough for
  a RecursionError, a MemoryError) into one `RecordError` naming the line.
* `block_from_record` rebuilds a Block only from values of the right type and range: node parents point
  to earlier nodes, depths are the parent's depth + 1 (so bounded by the node count), accepted indices and
  UFP positions are in range, numbers are numbers. Views that walk a tree (`cure inspect`) can then trust
  what they walk.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterator

from .block import UFP, Block, Resync, Timings, TreeNode

# Bounds on one file and one line: far above anything cure writes (a block line is a few KB).
MAX_FILE_BYTES = 4 * 1024 ** 3
MAX_LINE_BYTES = 64 * 1024 ** 2
# Token ids and counts stay below this (a JSON number can be 1e308).
MAX_INT = 2 ** 31 - 1


class RecordError(ValueError):
    """A line or file that is not what cure writes; the message says where and what. ``line``: the line
    number when one line is at fault; ``last``: that line is the file's last (a torn final write)."""

    def __init__(self, message: str, line: int | None = None, last: bool = False):
        super().__init__(message)
        self.line, self.last = line, last


def json_lines(path: Path, kind: str) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) for every non-blank line of ``path``.

    Rule: only a regular file under MAX_FILE_BYTES, lines under MAX_LINE_BYTES, each a JSON object;
    anything else raises RecordError (RecursionError and MemoryError included), "corrupt <kind> line" for
    a line that does not parse.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise RecordError(f"cannot read {path}: {e.strerror}") from None
    if not os.path.isfile(path):
        raise RecordError(f"{path} is not a regular file")
    if st.st_size > MAX_FILE_BYTES:
        raise RecordError(f"{path} is {st.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit")
    try:
        with open(path, "rb") as f:
            no = 0
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                no += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise RecordError(f"{path}:{no}: corrupt {kind} line (longer than {MAX_LINE_BYTES} bytes)", no)
                if not raw.strip():
                    continue
                try:
                    obj = parse_line(raw, f"{path}:{no}: corrupt {kind} line")
                except RecordError as e:
                    raise RecordError(str(e), no, last=not f.read(1)) from None
                yield no, obj
    except OSError as e:
        raise RecordError(f"cannot read {path}: {e.strerror or e}") from None
    except MemoryError:
        raise RecordError(f"{path} is too large to read") from None


def parse_line(raw: bytes | str, where: str) -> dict:
    """One JSON-lines record: a JSON object, else RecordError "<where> (why)"."""
    try:
        obj = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except UnicodeDecodeError:
        raise RecordError(f"{where} (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise RecordError(f"{where} ({e.msg})") from None
    except RecursionError:
        raise RecordError(f"{where} (JSON nested too deeply)") from None
    if not isinstance(obj, dict):
        raise RecordError(f"{where} (not a JSON object)")
    return obj


# ---------------------------------------------------------------- typed fields

def integer(value, what: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise RecordError(f"{what} must be an integer in [{lo}, {hi}], got {_show(value)}")
    return value


def number(value, what: str) -> float:
    """A JSON number (NaN/inf allowed: margins can be infinite), never a bool or a string."""
    if type(value) not in (int, float):
        raise RecordError(f"{what} must be a number, got {_show(value)}")
    return float(value)


def finite(value, what: str, lo: float = -math.inf) -> float:
    x = number(value, what)
    if not math.isfinite(x) or x < lo:
        raise RecordError(f"{what} must be a finite number >= {lo}, got {_show(value)}")
    return x


def text(value, what: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if type(value) is not str:
        raise RecordError(f"{what} must be a string, got {_show(value)}")
    return value


def mapping(value, what: str, optional: bool = False) -> dict:
    if value is None and optional:
        return {}
    if type(value) is not dict:
        raise RecordError(f"{what} must be a JSON object, got {_show(value)}")
    return value


def listing(value, what: str) -> list:
    if type(value) is not list:
        raise RecordError(f"{what} must be a list, got {_show(value)}")
    return value


def token_ids(value, what: str) -> tuple[int, ...]:
    return tuple(integer(t, f"{what}[{i}]") for i, t in enumerate(listing(value, what)))


def field(record: dict, key: str, what: str):
    if key not in record:
        raise RecordError(f"{what} has no {key!r}")
    return record[key]


def _show(value) -> str:
    text_ = repr(value)
    return text_ if len(text_) <= 40 else text_[:37] + "..."


# ---------------------------------------------------------------- blocks

def block_from_record(d: dict) -> Block:
    """A Block from its to_dict() form, every field checked by type and range (RecordError otherwise)."""
    d = mapping(d, "block")
    get = lambda key: field(d, key, "block")  # noqa: E731
    draft = token_ids(get("draft"), "draft")
    margins = tuple(number(m, f"margins[{i}]") for i, m in enumerate(listing(get("margins"), "margins")))
    ufps = tuple(_ufp(u, i, len(draft)) for i, u in enumerate(listing(get("ufps"), "ufps")))
    raw_nodes = listing(get("nodes"), "nodes")
    nodes: list[TreeNode] = []
    for i, n in enumerate(raw_nodes):
        nodes.append(_node(n, i, nodes))
    accepted = token_ids(get("accepted"), "accepted")
    for j, a in enumerate(accepted):
        if a >= len(nodes):
            raise RecordError(f"accepted[{j}] = {a} is not one of the block's {len(nodes)} nodes")
    resync = mapping(get("resync"), "resync")
    timings = mapping(get("timings"), "timings")
    known = set(Timings.__dataclass_fields__)          # the record's fields are the dataclass's: one list
    if set(timings) - known:
        raise RecordError(f"timings has unknown fields {sorted(set(timings) - known)}")
    stop = text(d.get("stop"), "stop", optional=True)
    extra = set(d) - set(Block.__dataclass_fields__)
    if extra:
        raise RecordError(f"block has unknown fields {sorted(extra)}")
    return Block(
        index=integer(get("index"), "index"),
        strategy=text(get("strategy"), "strategy"),
        context_len=integer(get("context_len"), "context_len"),
        root=integer(get("root"), "root"),
        draft=draft,
        margins=margins,
        ufps=ufps,
        nodes=tuple(nodes),
        accepted=accepted,
        winner=integer(get("winner"), "winner", hi=max(len(nodes), 0)),
        branch0_accepted=integer(get("branch0_accepted"), "branch0_accepted", hi=max(len(nodes), 0)),
        bonus=integer(get("bonus"), "bonus"),
        emitted=token_ids(get("emitted"), "emitted"),
        resync=Resync(mode=text(field(resync, "mode", "resync"), "resync mode"),
                      tokens=token_ids(field(resync, "tokens", "resync"), "resync tokens")),
        timings=Timings(**{k: integer(v, f"timings {k}") if k.endswith("_tokens") else finite(v, f"timings {k}", lo=0.0)
                           for k, v in timings.items()}),
        stop=stop,
        meta=mapping(d.get("meta"), "meta", optional=True),
    )


def _ufp(u, i: int, n_draft: int) -> UFP:
    u = mapping(u, f"ufps[{i}]")
    where = f"ufps[{i}]"
    return UFP(position=integer(field(u, "position", where), f"{where} position", hi=max(n_draft - 1, 0)),
               margin=number(field(u, "margin", where), f"{where} margin"),
               budget=integer(field(u, "budget", where), f"{where} budget"),
               alternatives=token_ids(field(u, "alternatives", where), f"{where} alternatives"))


def _node(n, i: int, earlier: list[TreeNode]) -> TreeNode:
    """Rule: parents come before children (parent in [-1, i)), and depth = parent depth + 1 (root: 0)."""
    where = f"nodes[{i}]"
    n = mapping(n, where)
    parent = integer(field(n, "parent", where), f"{where} parent", lo=-1, hi=i - 1)
    depth = integer(field(n, "depth", where), f"{where} depth", lo=1, hi=i + 1)
    want = 1 if parent == -1 else earlier[parent].depth + 1
    if depth != want:
        raise RecordError(f"{where} depth is {depth}, but its parent's depth + 1 is {want}")
    accepted = field(n, "accepted", where)
    if type(accepted) is not bool:
        raise RecordError(f"{where} accepted must be true or false, got {_show(accepted)}")
    return TreeNode(token=integer(field(n, "token", where), f"{where} token"), parent=parent, depth=depth,
                    branch=integer(field(n, "branch", where), f"{where} branch", hi=i + 1), accepted=accepted)
