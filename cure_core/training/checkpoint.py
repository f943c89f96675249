"""Training checkpoints that travel: commit one, resume anywhere.

A checkpoint folder holds only what the run cannot rebuild from its options and corpus:
- `shard-NNNNN.safetensors`: the trainable parameters and their AdamW moments, float32, packed into
  shards of at most SHARD_BYTES each, so a repository commit of <= 60 MB can hold every shard;
- `state.json`: the step, the loss history and every stretch of work (steps and minutes each).
Frozen weights (a base model, a target's embedding) are rebuilt by the run's seeded initialisation.

A save writes a new folder beside the old one and swaps them in two renames; a crash between the two
leaves `<folder>.old`, which `load` falls back to, so a checkpoint is never half-written.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..files import atomic_write_json

SHARD_BYTES = 45 << 20          # < 60 MB a commit, with room for the corpus and the cards
STATE = "state.json"
MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class Stretch:
    """One uninterrupted stretch of training (one process)."""
    start_step: int
    end_step: int
    minutes: float
    started: str                # local wall time, ISO 8601
    threads: int                # torch threads
    stopped_by: str = "running"  # steps | time | running (the last save came before the end)


@dataclass
class TrainState:
    step: int = 0
    history: list[dict] = field(default_factory=list)     # per step: loss, accuracies at offsets 1-4
    stretches: list[Stretch] = field(default_factory=list)
    spec: dict = field(default_factory=dict)


def trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _shards(tensors: list[tuple[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Greedy packing in order; a tensor larger than SHARD_BYTES gets a shard of its own."""
    shards, cur, size = [], {}, 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if cur and size + nbytes > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += nbytes
    if cur:
        shards.append(cur)
    return shards


def save(folder: str | Path, model: torch.nn.Module, opt: torch.optim.Optimizer, state: TrainState) -> None:
    from safetensors.torch import save_file
    folder = Path(folder)
    tensors = []
    for name, p in trainable(model):
        tensors.append((f"param.{name}", p.detach().to("cpu", torch.float32).contiguous()))
        st = opt.state.get(p, {})
        for m in MOMENTS:
            if m in st:
                tensors.append((f"{m}.{name}", st[m].detach().to("cpu", torch.float32).contiguous()))
        if "step" in st:
            tensors.append((f"step.{name}", torch.as_tensor(st["step"], dtype=torch.float32).reshape(1)))
    new = folder.with_name(folder.name + ".new")
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(parents=True)
    for i, shard in enumerate(_shards(tensors)):
        save_file(shard, str(new / f"shard-{i:05d}.safetensors"), metadata={"format": "pt"})
    atomic_write_json(new / STATE, {"step": state.step, "history": state.history, "spec": state.spec,
                                    "stretches": [asdict(s) for s in state.stretches]})
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    new.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _readable(folder: Path) -> Path | None:
    for f in (folder, folder.with_name(folder.name + ".old")):
        if (f / STATE).exists():
            return f
    return None


def exists(folder: str | Path) -> bool:
    return _readable(Path(folder)) is not None


def read_state(folder: str | Path) -> TrainState | None:
    """The step, history and stretches of a checkpoint, without its tensors (None: no checkpoint)."""
    f = _readable(Path(folder))
    if f is None:
        return None
    d = json.loads((f / STATE).read_text())
    return TrainState(step=int(d["step"]), history=list(d["history"]), spec=dict(d.get("spec", {})),
                      stretches=[Stretch(**s) for s in d.get("stretches", [])])


def load(folder: str | Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> TrainState | None:
    """Restore the trainable parameters and the optimizer moments in place; None when there is none."""
    from safetensors.torch import load_file
    f = _readable(Path(folder))
    if f is None:
        return None
    tensors = {}
    for shard in sorted(f.glob("shard-*.safetensors")):
        tensors.update(load_file(str(shard)))
    params = trainable(model)
    missing = [n for n, _ in params if f"param.{n}" not in tensors]
    if missing:
        raise ValueError(f"checkpoint {f} does not match this model: no {missing[0]} "
                         f"(and {len(missing) - 1} more); were the options changed?")
    with torch.no_grad():
        for name, p in params:
            p.copy_(tensors[f"param.{name}"].to(p.device, p.dtype))
            if f"step.{name}" in tensors:
                opt.state[p] = {"step": tensors[f"step.{name}"].reshape(()).clone(),
                                **{m: tensors[f"{m}.{name}"].to(p.device, p.dtype) for m in MOMENTS}}
    return read_state(f)
