"""PARD adaptation of a base causal LM (`--kind pard --pard-init adapt --pard-base ALIAS`).

The base (e.g. the embedded qwen-coder-0.5b drafting for qwen-coder-1.5b, same tokenizer) stays
frozen. What trains: LoRA factors on every attention and MLP projection (W + alpha/r * B @ A, with B
starting at zero, so step 0 is the base itself) and the mask token's input embedding. The loss is
pard_train's: the ordinary next-token loss on real tokens plus, for masks appended after random
anchors, the token k places ahead. The saved drafter is that delta alone (drafters/adapted.py).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..drafters.adapted import ADAPTER_FILE, ADAPTER_KEY, ARCHITECTURE
from ..files import atomic_save_safetensors, atomic_write_json

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """y = base(x) + scale * (x @ A.T) @ B.T; the base linear stays frozen."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        # A: Kaiming-uniform like nn.Linear's own init; B: zeros, so the adapter starts as a no-op.
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T * self.scale


def attach(model: nn.Module, rank: int, alpha: float, mask_token_id: int) -> nn.Module:
    """Freeze `model`, wrap its LORA_TARGETS linears with LoRA and give it a trainable mask embedding
    (`cure_mask_embedding`, starting from the mask token's row) that replaces the mask's input rows."""
    for p in model.parameters():
        p.requires_grad_(False)
    for name, mod in list(model.named_modules()):
        for child, lin in list(mod.named_children()):
            if child in LORA_TARGETS and isinstance(lin, nn.Linear):
                setattr(mod, child, LoRALinear(lin, rank, alpha))
    emb = model.get_input_embeddings()
    model.cure_mask_embedding = nn.Parameter(emb.weight[mask_token_id].detach().clone().float())

    def use_mask_embedding(module, args, out):
        ids = args[0]
        return torch.where((ids == mask_token_id)[..., None], model.cure_mask_embedding.to(out.dtype), out)

    emb.register_forward_hook(use_mask_embedding)
    return model


def init_from_adapter(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Start `attach`'s adapter from a saved one (`--adapter-init`, read by drafters.adapted.read_adapter): its
    LoRA factors and mask embedding, each checked against the slot it fills (ValueError if one does not fit)."""
    slots = {f"{name}.{part}": getattr(mod, part) for name, mod in model.named_modules()
             if isinstance(mod, LoRALinear) for part in ("lora_A", "lora_B")}
    slots["mask_embedding"] = model.cure_mask_embedding
    if set(slots) != set(tensors):
        raise ValueError(f"the adapter's tensors are not this run's LoRA layout ({len(tensors)} against {len(slots)})")
    with torch.no_grad():
        for name, p in slots.items():
            if tuple(tensors[name].shape) != tuple(p.shape):
                raise ValueError(f"adapter {name}: shape {tuple(tensors[name].shape)}, this run's {tuple(p.shape)}")
            p.copy_(tensors[name].to(p.dtype))


def adapter_tensors(model: nn.Module, dtype=torch.float16) -> dict[str, torch.Tensor]:
    """The delta to ship: every LoRA pair under its base module's name, and the mask embedding."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, LoRALinear):
            # named by the wrapped linear's path, which is its path in the unwrapped base model too
            out[f"{name}.lora_A"] = mod.lora_A.detach().to("cpu", dtype).contiguous()
            out[f"{name}.lora_B"] = mod.lora_B.detach().to("cpu", dtype).contiguous()
    out["mask_embedding"] = model.cure_mask_embedding.detach().to("cpu", dtype).contiguous()
    return out


def save_adapter(folder, model: nn.Module, base: str, mask_token_id: int, rank: int, alpha: float,
                 block_size: int, dtype=torch.float16) -> None:
    atomic_save_safetensors(f"{folder}/{ADAPTER_FILE}", adapter_tensors(model, dtype))
    atomic_write_json(f"{folder}/config.json", {
        "architectures": [ARCHITECTURE],
        ADAPTER_KEY: {"kind": "pard", "base": base, "mask_token_id": int(mask_token_id), "rank": int(rank),
                      "alpha": float(alpha), "block_size": int(block_size),
                      "targets": list(LORA_TARGETS), "dtype": str(dtype).replace("torch.", "")}})
