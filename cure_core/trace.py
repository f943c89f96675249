"""Trace files: JSON lines, one per Block, framed by a header and a footer.

    {"type": "header", "schema": 1, "models": {...}, "config": {...}, "versions": {...}, "created": ...}
    {"type": "generation", "id": 0, "prompt_ids": [...], "prompt": "...", "strategy": "cure", "config": {...}}
    {"type": "block", "generation": 0, ...Block fields...}
    {"type": "end", "generation": 0, "stats": {...}}
    {"type": "footer", "status": "complete" | "interrupted", "generations": N, "blocks": M, "summary": {...}}

The writer writes to a temporary file beside the target and renames it into place on close, so a
reader never sees a half-written trace under the final name. The reader validates every line and
reports the line number of the first problem.
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from . import records
from .block import Block
from .errors import TraceError
from .metrics import summarize
from .version import __version__

SCHEMA_VERSION = 1


def versions() -> dict:
    import torch
    import transformers
    return {"cure": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


@dataclass
class TraceGeneration:
    id: int
    prompt_ids: list[int]
    prompt: str | None
    strategy: str
    config: dict
    blocks: list[Block] = field(default_factory=list)
    stats: dict | None = None

    @property
    def token_ids(self) -> list[int]:
        return [t for b in self.blocks for t in b.emitted]


@dataclass
class Trace:
    header: dict
    generations: list[TraceGeneration]
    footer: dict

    @property
    def blocks(self) -> list[Block]:
        return [b for g in self.generations for b in g.blocks]


class TraceWriter:
    """Context manager; `begin()` a generation, `block()` each Block, `end()` it."""

    def __init__(self, path: str | os.PathLike, models: dict, config: dict, extra: dict | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".part", dir=self.path.parent)
        self._tmp = Path(tmp)
        self._f = os.fdopen(fd, "w", encoding="utf-8")
        self._gen = -1
        self._blocks: list[Block] = []
        self._all: list[Block] = []
        self._write({"type": "header", "schema": SCHEMA_VERSION, "models": models, "config": config,
                     "versions": versions(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(extra or {})})

    def _write(self, obj: dict) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def begin(self, prompt_ids: Sequence[int], prompt: str | None, strategy: str, config: dict) -> int:
        self._gen += 1
        self._blocks = []
        self._write({"type": "generation", "id": self._gen, "prompt_ids": list(prompt_ids), "prompt": prompt,
                     "strategy": strategy, "config": config})
        return self._gen

    def block(self, block: Block) -> None:
        self._blocks.append(block)
        self._all.append(block)
        self._write({"type": "block", "generation": self._gen, **block.to_dict()})
        self._f.flush()

    def end(self) -> None:
        stats = summarize(self._blocks).to_dict() if self._blocks else None
        self._write({"type": "end", "generation": self._gen, "stats": stats})

    def close(self, status: str = "complete") -> Path:
        if self._f.closed:
            return self.path
        summary = summarize(self._all).to_dict() if self._all else None
        self._write({"type": "footer", "status": status, "generations": self._gen + 1,
                     "blocks": len(self._all), "summary": summary})
        self._f.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._tmp, 0o666 & ~umask)          # mkstemp made it 0600; give it a normal file's mode
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Drop the temporary file: nothing is left under the final name."""
        if not self._f.closed:
            self._f.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close("complete")
        elif issubclass(exc_type, KeyboardInterrupt) and self._all:
            self.close("interrupted")      # keep what finished
        else:
            self.abort()


def traced(blocks: Iterator[Block], path: str | os.PathLike, *, models: dict, config: dict, strategy: str,
           prompt_ids: Sequence[int], prompt: str | None, extra: dict | None = None) -> Iterator[Block]:
    """`blocks` (one generation) passed through, each written to a one-generation trace at `path` as it comes.

    Rules: the file appears under its name complete; a generation stopped early (an exception,
    KeyboardInterrupt, or the caller closing the iterator) keeps the blocks it finished as an "interrupted"
    trace, and one stopped before its first block leaves no file. Nothing is written before the first
    block is asked for."""
    writer = TraceWriter(path, models=models, config=config, extra=extra)
    written = 0
    try:
        writer.begin(prompt_ids, prompt, strategy, config)
        for block in blocks:
            writer.block(block)
            written += 1
            yield block
        writer.end()
        writer.close()
    except BaseException:
        writer.abort() if not written else writer.close("interrupted")
        raise
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()                    # the engine's generator ends here too, not whenever it is collected


def read_trace(path: str | os.PathLike) -> Trace:
    """The trace at ``path`` (or ``path/trace.jsonl``), every record checked by type and range.

    Rule: whatever is wrong with the file (missing, not a regular file, too big, bad UTF-8 or JSON, nesting
    deep enough for a RecursionError, a field of the wrong type or out of range) ends in one TraceError
    naming the line; nothing past the reader has to re-check.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"trace file not found: {path}")
    if path.is_dir():
        trace_in_dir = path / "trace.jsonl"
        if trace_in_dir.exists():
            path = trace_in_dir
        else:
            raise TraceError(f"{path} is a directory with no trace.jsonl")
    header, footer = None, None
    gens: dict[int, TraceGeneration] = {}
    try:
        for no, obj in records.json_lines(path, "trace"):
            kind = obj.get("type")
            if header is None:
                header = _header(obj, path, f"{path}:{no}")
                continue
            if footer is not None:
                raise TraceError(f"{path}:{no}: data after the footer")
            try:
                footer = _record(obj, kind, gens)
            except records.RecordError as e:
                raise TraceError(f"{path}:{no}: corrupt {kind} record ({e})") from None
    except records.RecordError as e:
        raise TraceError(f"{e}" if str(e).startswith(str(path)) else f"{path}: {e}") from None
    if header is None:
        raise TraceError(f"{path} is empty, not a trace")
    if footer is None:
        raise TraceError(f"{path} is truncated (no footer): the run that wrote it did not finish")
    return Trace(header=header, generations=[gens[k] for k in sorted(gens)], footer=footer)


def _header(obj: dict, path: Path, where: str) -> dict:
    if obj.get("type") != "header":
        raise TraceError(f"{path} is not a cure trace (first line is not a header)")
    schema = obj.get("schema")
    if type(schema) is not int:
        raise TraceError(f"{where}: header has no schema version")
    if schema > SCHEMA_VERSION:
        raise TraceError(f"{path} was written by a newer cure (trace schema {schema}; this cure reads "
                         f"up to {SCHEMA_VERSION}): upgrade cure to open it")
    try:
        records.mapping(obj.get("models"), "models", optional=True)
        _config(obj.get("config"), "header config")
    except records.RecordError as e:
        raise TraceError(f"{where}: corrupt header ({e})") from None
    return obj


def _config(value, what: str) -> dict:
    """A decoding config as the readers use it: the keys they read have the right types."""
    config = records.mapping(value, what, optional=True)
    if "tau_margin" in config:
        records.number(config["tau_margin"], f"{what} tau_margin")
    if config.get("k") is not None:
        records.integer(config["k"], f"{what} k", lo=1)
    for key in ("keep_branch0", "resync"):
        if key in config and type(config[key]) is not bool:
            raise records.RecordError(f"{what} {key} must be true or false")
    return config


def _record(obj: dict, kind, gens: dict[int, TraceGeneration]) -> dict | None:
    """Add one record after the header to ``gens``; the footer record is returned, else None."""
    field = records.field
    if kind == "generation":
        gid = records.integer(field(obj, "id", "generation"), "id")
        if gid in gens:
            raise records.RecordError(f"generation {gid} begun twice")
        gens[gid] = TraceGeneration(id=gid, prompt_ids=list(records.token_ids(field(obj, "prompt_ids", "generation"),
                                                                              "prompt_ids")),
                                    prompt=records.text(obj.get("prompt"), "prompt", optional=True),
                                    strategy=records.text(field(obj, "strategy", "generation"), "strategy"),
                                    config=_config(obj.get("config"), "config"))
    elif kind == "block":
        g = _generation(obj, gens)
        body = {k: v for k, v in obj.items() if k not in ("type", "generation")}
        g.blocks.append(records.block_from_record(body))
    elif kind == "end":
        _generation(obj, gens).stats = records.mapping(obj.get("stats"), "stats", optional=True) or None
    elif kind == "footer":
        return obj
    else:
        raise records.RecordError(f"unknown record type {kind!r}")
    return None


def _generation(obj: dict, gens: dict[int, TraceGeneration]) -> TraceGeneration:
    g = records.field(obj, "generation", "record")
    if type(g) is not int or g not in gens:
        raise records.RecordError(f"record for generation {records._show(g)}, which was never begun")
    return gens[g]
