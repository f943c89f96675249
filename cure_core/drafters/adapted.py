"""A drafter adapted from an embedded base model: the checkpoint holds only the trained delta.

Layout (written by `cure train-drafter --kind pard --pard-init adapt`):

    config.json          {"architectures": ["CureAdaptedDrafter"], "cure_adapter": {...}}
    adapter.safetensors  <module>.lora_A [r, in], <module>.lora_B [out, r] per adapted linear,
                         and mask_embedding [H] (the mask token's trained input embedding)

`cure_adapter` names the base (an embedded alias such as qwen-coder-0.5b, or a folder), the drafter
kind (pard), the mask token, the LoRA rank and alpha and the trained block size. Loading
(checkpoints.load_adapted: `read_adapter`, the base, `apply_adapter`) reads the base from its usual place (the embedded models' cache: never a second copy on disk), adds
alpha/rank * B @ A to every adapted weight, writes the mask embedding into the mask token's row and
returns a plain causal LM: it drafts as fast as the base, and its kernels pack like any model's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelLoadError

ADAPTER_KEY = "cure_adapter"
ADAPTER_FILE = "adapter.safetensors"
ARCHITECTURE = "CureAdaptedDrafter"
KINDS = ("pard",)


@dataclass
class AdaptedDrafter:
    model: torch.nn.Module          # the base with the delta merged in; config.pard_token = mask_token_id
    mask_token_id: int
    base_path: str                  # the base's folder (its tokenizer is the drafter's)
    block_size: int | None          # the block length it was trained for


def _config(folder: str | Path) -> dict | None:
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def is_adapted_checkpoint(folder: str | Path) -> bool:
    cfg = _config(folder)
    return cfg is not None and isinstance(cfg.get(ADAPTER_KEY), dict)


def adapter_config(folder: str | Path) -> dict:
    cfg = _config(folder)
    if cfg is None or not isinstance(cfg.get(ADAPTER_KEY), dict):
        raise ModelLoadError(f"{folder} is not an adapted drafter (no {ADAPTER_KEY} in config.json)")
    ad = cfg[ADAPTER_KEY]
    missing = [k for k in ("base", "kind", "mask_token_id", "rank", "alpha") if k not in ad]
    if missing:
        raise ModelLoadError(f"{folder}/config.json: {ADAPTER_KEY} lacks {', '.join(missing)}")
    if ad["kind"] not in KINDS:
        raise ModelLoadError(f"{folder}: unknown adapted drafter kind {ad['kind']!r}")
    return ad


def merge_lora(model: torch.nn.Module, tensors: dict[str, torch.Tensor], scale: float) -> int:
    """weight += scale * B @ A for every `<module>.lora_A/.lora_B` pair; returns how many were merged."""
    modules = dict(model.named_modules())
    names = sorted({k.rsplit(".", 1)[0] for k in tensors if k.endswith((".lora_A", ".lora_B"))})
    with torch.no_grad():
        for name in names:
            lin = modules.get(name)
            a, b = tensors.get(f"{name}.lora_A"), tensors.get(f"{name}.lora_B")
            if lin is None or a is None or b is None or not hasattr(lin, "weight"):
                raise ModelLoadError(f"the adapter's {name} matches no linear layer of the base")
            w = lin.weight
            if tuple(w.shape) != (b.shape[0], a.shape[1]) or a.shape[0] != b.shape[1]:
                raise ModelLoadError(f"adapter {name}: A {tuple(a.shape)} / B {tuple(b.shape)} do not fit the "
                                     f"base weight {tuple(w.shape)}")
            w.add_((b.float() @ a.float()).mul_(scale).to(w.dtype))
    return len(names)


def read_adapter(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(its `cure_adapter` section, the delta's tensors) of an adapted checkpoint, read and checked before
    the base loads (checkpoints.load_adapted loads the base, then `apply_adapter`)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    ad = adapter_config(folder)
    if is_adapted_checkpoint(str(ad["base"])):
        raise ModelLoadError(f"{folder}: the base of an adapted drafter cannot itself be one ({ad['base']})")
    try:
        tensors = load_file(str(folder / ADAPTER_FILE))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {folder / ADAPTER_FILE}: {e}") from None
    return ad, tensors


def apply_adapter(model: torch.nn.Module, base_path: str, folder: str | Path, ad: dict,
                  tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> AdaptedDrafter:
    """The delta merged into `model` (the base, loaded in float32), the mask token's embedding written, then
    cast once to `dtype`: the drafter `read_adapter` describes."""
    merge_lora(model, tensors, float(ad["alpha"]) / int(ad["rank"]))
    mask = int(ad["mask_token_id"])
    emb = model.get_input_embeddings().weight
    if "mask_embedding" in tensors:
        if mask >= emb.shape[0] or tensors["mask_embedding"].shape != emb.shape[1:]:
            raise ModelLoadError(f"{folder}: mask_embedding does not fit the base's embedding {tuple(emb.shape)}")
        with torch.no_grad():
            # A tied head row changes too: the mask is never proposed, so that row is never used.
            emb[mask] = tensors["mask_embedding"].to(emb.dtype)
    if dtype != torch.float32:
        model = model.to(dtype)
    model.config.pard_token = mask          # --drafter auto: a causal LM naming its mask token is PARD
    block = ad.get("block_size")
    model.config.pard_block_size = int(block) if block else None
    return AdaptedDrafter(model=model, mask_token_id=mask, base_path=base_path,
                          block_size=int(block) if block else None)
