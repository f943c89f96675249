"""Atomic file writes: a crash mid-write never leaves a half-written file (checkpoint, shard, report, saved
chat): each is written to a temporary file beside its path, then renamed into place (os.replace). The one
owner of that rule for the core, the CLI and the benchmark scripts."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch


@contextlib.contextmanager
def _replacing(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (its folders made) to write; on success rename it onto `path`,
    on any failure remove it. The name is unique per call (pid, thread, random), so two writers of one path,
    in two processes or two threads (a chat saved from its worker while the app saves it), never share it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(3)}.part")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
