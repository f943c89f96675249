"""The training loop shared by every drafter kind: seeded batches, AdamW with warmup + cosine decay,
periodic atomic checkpoints (checkpoint.py) and --resume.

Every step's batch (chunks and anchors) comes from a generator seeded by (seed, step), so a run resumed
from a checkpoint sees exactly the batches an uninterrupted run would have seen. Each process that
trains is a stretch: its steps and minutes go into the checkpoint, so a run resumed on another machine
still knows every stretch before it.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from . import checkpoint as ckpt
from ..errors import CureError
from .features import FeatureSet

CKPT_DIR = "checkpoint"


@dataclass
class TrainSpec:
    kind: str = "dflash"
    steps: int = 1000
    block_size: int = 16
    layers: int = 1
    lr: float = 3e-4
    warmup: int = 20
    weight_decay: float = 0.0
    batch: int = 2                  # chunks per step
    anchors: int = 16               # random anchors (blocks) per chunk
    labels: str = "target"          # target (greedy argmax, self-distillation) | text
    loss_vocab: int = 16384         # most frequent label ids (+ the batch's labels) in the softmax; 0 = full
    draft_vocab: int = 16384        # dflash: ids saved as the drafter's draft vocabulary (DraftVocab); 0 = none
    gamma: float = 4.0              # offset i weighs exp(-(i-1)/gamma); 0 = equal weights
    seed: int = 0
    checkpoint_every: int = 100
    max_minutes: float | None = None
    grad_clip: float = 1.0


class CheckpointError(CureError, ValueError):
    """A training checkpoint that cannot be resumed."""


def lr_at(spec: TrainSpec, step: int) -> float:
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    t = (step - spec.warmup) / max(spec.steps - spec.warmup, 1)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def ranked_labels(fs: FeatureSet, labels: str, vocab: int, mask_id: int) -> torch.Tensor:
    """Every label id seen in training, most frequent first (ties by id); never the mask."""
    src = fs.argmax if labels == "target" else fs.tokens
    counts = torch.bincount(torch.cat(src).clamp(0, vocab - 1), minlength=vocab)
    counts[mask_id] = -1
    ranked = torch.argsort(counts, descending=True, stable=True)
    return ranked[counts[ranked] > 0]


def frequent_labels(fs: FeatureSet, spec: TrainSpec, vocab: int, mask_id: int) -> torch.Tensor | None:
    if spec.loss_vocab <= 0 or spec.loss_vocab >= vocab:
        return None
    return ranked_labels(fs, spec.labels, vocab, mask_id)[: spec.loss_vocab]


def draft_vocab_ids(fs: FeatureSet, labels: str, vocab: int, mask_id: int, n: int) -> torch.Tensor | None:
    """The drafter's draft vocabulary: every label id seen in training, most frequent first, then the
    lowest ids not yet in (a BPE tokenizer numbers its tokens in merge order, roughly by frequency)
    up to n ids; never the mask. None when n is 0 or covers the whole vocabulary."""
    if n <= 0 or n >= vocab - 1:
        return None
    seen = ranked_labels(fs, labels, vocab, mask_id)[:n]
    rest = torch.ones(vocab, dtype=torch.bool)
    rest[seen] = False
    rest[mask_id] = False
    fill = torch.nonzero(rest).flatten()[: n - seen.numel()]
    return torch.cat([seen, fill])


def batch_generator(spec: TrainSpec, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(spec.seed * 1_000_003 + step)


def train(model: torch.nn.Module, step_fn: Callable, fs: FeatureSet, spec: TrainSpec, out: Path,
          resume: bool = False, on_step: Callable | None = None, log: Callable = print) -> dict:
    """step_fn(chunk_ids, gen) -> (loss, stats). Returns the history summary and the stretches."""
    params = [p for _, p in ckpt.trainable(model)]
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95))
    folder = out / CKPT_DIR
    state = ckpt.TrainState(spec=asdict(spec))
    if resume:                      # Rule: --resume continues a checkpoint or fails; it never starts over
        try:
            loaded = ckpt.load(folder, model, opt)
        except (OSError, RuntimeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"cannot resume from {folder}: it does not fit this drafter (other --kind, "
                                  f"--layers or target?): {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") from None
        if loaded is None:
            raise CheckpointError(f"--resume: there is no checkpoint at {folder} to continue; "
                                  f"run without --resume to start a new training")
        state = ckpt.TrainState(step=loaded.step, history=loaded.history, stretches=loaded.stretches,
                                spec=asdict(spec))
        log(f"resumed from {folder} at step {state.step}")
    t0 = time.monotonic()
    stretch = ckpt.Stretch(start_step=state.step, end_step=state.step, minutes=0.0,
                           started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), threads=torch.get_num_threads())
    state.stretches.append(stretch)

    def save():
        stretch.end_step = state.step
        stretch.minutes = round((time.monotonic() - t0) / 60, 2)
        ckpt.save(folder, model, opt, state)

    model.train()
    stretch.stopped_by = "running"
    while state.step < spec.steps:
        if spec.max_minutes is not None and time.monotonic() - t0 > spec.max_minutes * 60:
            stretch.stopped_by = "time"
            break
        step = state.step
        gen = batch_generator(spec, step)
        chunk_ids = torch.randint(len(fs), (spec.batch,), generator=gen).tolist()
        for g in opt.param_groups:
            g["lr"] = lr_at(spec, step)
        loss, stats = step_fn(chunk_ids, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if spec.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, spec.grad_clip)
        opt.step()
        acc = (stats["hits"] / stats["count"].clamp(min=1)).tolist()
        state.history.append({"step": step, "loss": float(loss.detach()), "acc": [round(a, 4) for a in acc[1:5]]})
        state.step += 1
        if on_step is not None:
            on_step(state.step, float(loss.detach()), acc)
        if spec.checkpoint_every and state.step % spec.checkpoint_every == 0:
            save()
    if stretch.stopped_by == "running":
        stretch.stopped_by = "steps"
    save()
    model.eval()
    return {"steps_done": state.step, "stopped_by": stretch.stopped_by, "seconds": time.monotonic() - t0,
            "history": state.history, "stretches": [asdict(s) for s in state.stretches]}
