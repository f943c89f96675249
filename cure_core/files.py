"""Atomic file writes: a crash mid-write never leaves a half-written file (checkpoint, shard, report, saved
chat): each is written to a temporary file beside its path, then renamed into place (os.replace). The one
owner of that rule for the core, the CLI and the benchmark scripts."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch



def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def atomic_write_text(path: str | Path, text: str) -> Path:
    """`text` at `path` (its folders made), whole or not at all; the temporary file never outlives a failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, obj, indent: int = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def atomic_torch_save(path: str | Path, obj) -> None:
    import torch
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    torch.save(obj, tmp)
    os.replace(tmp, path)


def atomic_save_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    from safetensors.torch import save_file
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata or {"format": "pt"})
    os.replace(tmp, path)
