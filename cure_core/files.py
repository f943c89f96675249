"""Atomic file writes: a crash mid-write never leaves a half-written file (checkpoint, shard, report, saved
chat, exported folder): each is written to a temporary file (or folder) beside its path, then renamed into place
(os.replace). The one owner of that rule for the core, the CLI and the benchmark scripts."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch


@contextlib.contextmanager
def _replacing(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (its folders made) to write; on success rename it onto `path`,
    on any failure remove it. The name is `_unique`: a chat saved from its worker while the app saves it
    never shares the other's temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _unique(path, "part")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _unique(path: Path, kind: str) -> Path:
    """A hidden name beside `path`, unique per call (pid, thread, random): two writers of one path, in two
    processes or two threads, never share it."""
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(3)}.{kind}")


@contextlib.contextmanager
def replacing_folder(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary folder beside `path` to fill; on success it takes `path`'s place (a folder
    already there is moved aside first and removed after, so `path` is the old folder or the new one, never
    a mix); on any failure the temporary folder is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _unique(path, "part")
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            old = _unique(path, "old")
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old, path)                       # the old folder goes back where it was
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_copy(src: str | Path, path: str | Path) -> Path:
    """A copy of the file `src` at `path`, whole or not at all."""
    with _replacing(path) as tmp:
        shutil.copyfile(src, tmp)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """`text` at `path` (its folders made), whole or not at all."""
    with _replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: str | Path, obj, indent: int = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def atomic_torch_save(path: str | Path, obj) -> None:
    import torch
    with _replacing(path) as tmp:
        torch.save(obj, tmp)


def atomic_save_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    from safetensors.torch import save_file
    with _replacing(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata or {"format": "pt"})
