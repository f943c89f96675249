"""Target features for drafter training, cached on disk.

For every corpus chunk the target runs one plain forward; we keep the token ids, the target's greedy
(argmax) next token at every position (self-distillation labels) and, for DFlash, the hidden states
after decoder layers `layer_ids` (HF hidden_states[id + 1]) concatenated, in float16. Shards are
safetensors files written atomically under DIR/features; a rerun or --resume skips shards already
written for the same target/layers/chunks (meta.json fingerprint).

A chunk's features depend on its tokens alone (one plain forward, no cache, no padding), so a further
version trained on old corpora plus a new one need not run the target over the old text again:
`donors` (other runs' feature folders, `train-drafter --features-from`) are indexed by chunk tokens,
and a chunk found there is copied from it. Donors for another target or other layers are refused.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..files import atomic_save_safetensors, atomic_write_json

SHARD_CHUNKS = 32


@dataclass
class FeatureSet:
    tokens: list[torch.Tensor]        # per chunk [L] int64
    argmax: list[torch.Tensor]        # per chunk [L] int64: target's greedy token after position t
    features: list[torch.Tensor]      # per chunk [L, n_ids*H] float16 (empty [L, 0] when no layers)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_tokens(self) -> int:
        return sum(int(t.numel()) for t in self.tokens)


@torch.inference_mode()
def target_forward(model, ids: Sequence[int], layer_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chain forward -> (argmax [L] on cpu, features [L, n_ids*H] on the model's device)."""
    dev = next(model.parameters()).device
    out = model(input_ids=torch.tensor([list(ids)], device=dev), output_hidden_states=bool(layer_ids),
                use_cache=False)
    am = out.logits[0].argmax(-1).cpu()
    if layer_ids:
        feats = torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], dim=-1)
    else:
        feats = torch.zeros((len(ids), 0), device=dev)
    return am, feats


class DonorError(ValueError):
    """A --features-from folder that cannot give features to this run."""


def _chunk_key(ids) -> str:
    return hashlib.sha256(torch.as_tensor(ids, dtype=torch.int32).numpy().tobytes()).hexdigest()


def check_donor(folder: str | Path, target: str, layer_ids: Sequence[int]) -> None:
    """Raise DonorError unless `folder` holds features of `target` at `layer_ids`."""
    mfile = Path(folder) / "meta.json"
    try:
        meta = json.loads(mfile.read_text())
    except (OSError, ValueError):
        raise DonorError(f"--features-from {folder}: no readable meta.json there (a train-drafter features "
                         "folder, OUT/features)") from None
    if meta.get("target") != target or list(meta.get("layer_ids", [])) != list(layer_ids):
        raise DonorError(f"--features-from {folder}: its features are of {meta.get('target')} layers "
                         f"{meta.get('layer_ids')}, this run needs {target} layers {list(layer_ids)}")


class Donors:
    """Other runs' cached features, looked up by chunk tokens (the module's rule)."""

    def __init__(self, folders: Sequence[str | Path], target: str, layer_ids: Sequence[int]):
        from safetensors import safe_open
        self.index: dict[str, tuple[Path, int, int]] = {}     # chunk key -> (shard file, row from, row to)
        for folder in map(Path, folders):
            check_donor(folder, target, layer_ids)
            for f in sorted(folder.glob("shard_*.safetensors")):
                with safe_open(str(f), framework="pt") as d:
                    toks, off = d.get_tensor("tokens"), d.get_tensor("offsets").tolist()
                for j in range(len(off) - 1):
                    self.index.setdefault(_chunk_key(toks[off[j]:off[j + 1]]), (f, off[j], off[j + 1]))

    def get(self, ids) -> tuple[torch.Tensor, torch.Tensor] | None:
        """-> (argmax [L] int32, features [L, F] float16) of a chunk with these tokens, or None."""
        hit = self.index.get(_chunk_key(ids))
        if hit is None:
            return None
        from safetensors import safe_open
        f, a, b = hit
        with safe_open(str(f), framework="pt") as d:
            return d.get_slice("argmax")[a:b], d.get_slice("features")[a:b]


def extract(model, chunks: Sequence[Sequence[int]], layer_ids: Sequence[int], folder: str | Path, meta: dict,
            progress=None, donors: Donors | None = None) -> FeatureSet:
    """Compute (or reuse) the cached features of `chunks` under `folder`, copying those `donors` hold;
    progress(n_tokens) per chunk."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = dict(meta, layer_ids=list(layer_ids), n_chunks=len(chunks), shard_chunks=SHARD_CHUNKS)
    mfile = folder / "meta.json"
    if mfile.exists():
        old = json.loads(mfile.read_text())
        if old != meta:                       # different corpus/target/layers: start the cache afresh
            for f in folder.glob("shard_*.safetensors"):
                f.unlink()
    atomic_write_json(mfile, meta)
    from safetensors.torch import load_file
    fs = FeatureSet([], [], [])
    for s in range(0, len(chunks), SHARD_CHUNKS):
        part = chunks[s: s + SHARD_CHUNKS]
        f = folder / f"shard_{s // SHARD_CHUNKS:05d}.safetensors"
        if f.exists():
            d = load_file(str(f))
            off = d["offsets"].tolist()
            for j in range(len(part)):
                a, b = off[j], off[j + 1]
                fs.tokens.append(d["tokens"][a:b].long())
                fs.argmax.append(d["argmax"][a:b].long())
                fs.features.append(d["features"][a:b])
            if progress is not None:
                progress(sum(len(c) for c in part))
            continue
        toks, ams, feats = [], [], []
        for c in part:
            hit = donors.get(c) if donors is not None else None
            am, ft = hit if hit is not None else target_forward(model, c, layer_ids)
            toks.append(torch.tensor(c, dtype=torch.int32))
            ams.append(am.to(torch.int32))
            feats.append(ft.to(torch.float16).cpu())
            if progress is not None:
                progress(len(c))
        off = [0]
        for t in toks:
            off.append(off[-1] + len(t))
        atomic_save_safetensors(f, {"tokens": torch.cat(toks), "argmax": torch.cat(ams),
                                    "features": torch.cat(feats), "offsets": torch.tensor(off, dtype=torch.int64)})
        fs.tokens.extend(t.long() for t in toks)
        fs.argmax.extend(a.long() for a in ams)
        fs.features.extend(feats)
    return fs
