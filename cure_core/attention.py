"""Attention for the models CachedLM runs: transformers' sdpa, except for masked multi-row forwards on CPU.

For a model with grouped K/V heads (Qwen2.5: 14 query heads over 2 K/V heads), transformers' sdpa, given a
mask and more than one query row, copies every K/V head once per query head (`repeat_kv`) over the whole
cache before attending. Every tree forward is such a call: the target's verify, and each step of a chain
drafter drafting several rows (cure's re-drafts). On CPU, torch's sdpa attends grouped heads itself
(`enable_gqa`) with a mask, with the same result; the copies cost more than the attention past a few
hundred cached rows (benchmarks/attention.py measures both). On other
devices, with no mask, or for one query row (transformers packs those), this is transformers' function
unchanged.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "cure_sdpa"


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, Hq, q, D], key/value [B, Hkv, T, D], attention_mask [B, 1, q, T] -> ([B, q, Hq, D], None)."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    # Rule: only a masked multi-row forward on CPU, where transformers would copy K/V; the rest as it does.
    if (not grouped or query.device.type != "cpu" or attention_mask is None or query.shape[2] == 1
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
            or kwargs.get("output_attentions", False) or key.shape[-1] != value.shape[-1]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None                       # [B, q, Hq, D]


AttentionInterface.register(NAME, grouped_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)          # masks built as for sdpa (HF generate on the same model)

EXACT = "cure_exact"


def exact_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention whose rows do not depend on the other rows of the pass: an int8 target's (`--dtype int8`).

    query [B, Hq, q, D], key/value [B, Hkv, T, D], attention_mask [B, 1, q, T] (bool, or additive) ->
    ([B, q, Hq, D], None). Why: sdpa takes another kernel for one query row than for a tree's N, and sums over
    another number of (masked) keys, so a row's output moves by float32 rounding with the pass's shape. In
    float32 that stays a rounding; in front of RowInt8Linear's input grid it can move a value across a
    quantization step, and the verify of a tree then disagrees with `ar`. Rule: the scores, softmax and
    weighted sum run in float64, where the products of float32 values are exact and a change of summation
    order moves a sum by ~1e-16 relative, far below float32's rounding; the result is rounded to float32
    once. Cost: a few hundred cached rows x 64 dims per head, small next to the int8 matmuls."""
    b, hq, q, d = query.shape
    hkv, t = key.shape[1], key.shape[2]
    g = hq // hkv                                                        # query heads per K/V head
    scale = scaling if scaling is not None else d ** -0.5
    qs = query.double().reshape(b, hkv, g * q, d)                        # [B, Hkv, g*q, D]
    scores = (qs @ key.double().transpose(-1, -2)) * scale               # [B, Hkv, g*q, T]
    scores = scores.view(b, hkv, g, q, t)
    if attention_mask is None and q > 1 and is_causal is not False:
        # no mask: causal, as sdpa's is_causal (transformers leaves out a mask that is plainly causal),
        # the q rows being the last q of the T keys
        attention_mask = torch.ones(q, t, dtype=torch.bool, device=query.device).tril(t - q)[None, None]
    if attention_mask is not None:
        m = attention_mask[:, :, None, :, -t:]                           # [B, 1, 1, q, T]
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.double()
    probs = torch.softmax(scores, dim=-1).view(b, hkv, g * q, t)
    out = (probs @ value.double()).view(b, hq, q, d)                     # [B, Hq, q, D]
    return out.to(query.dtype).transpose(1, 2).contiguous(), None       # [B, q, Hq, D]


AttentionInterface.register(EXACT, exact_attention)
AttentionMaskInterface.register(EXACT, sdpa_mask)


def use_exact_attention(model: torch.nn.Module) -> None:
    """Switch a model to `exact_attention` (an int8 target; `use_grouped_attention` then leaves it)."""
    model.set_attn_implementation(EXACT)


def use_grouped_attention(model: torch.nn.Module) -> None:
    """Switch a model that runs transformers' sdpa to `grouped_sdpa` (other implementations stay)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)


@contextmanager
def stock_sdpa(models: Iterable[torch.nn.Module | None]) -> Iterator[None]:
    """Within: the given models that run `grouped_sdpa` run transformers' sdpa (benchmarks compare the two,
    and run transformers' own loops as transformers ships them)."""
    switched = [m for m in models if m is not None and getattr(m.config, "_attn_implementation", None) == NAME]
    for m in switched:
        m.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        for m in switched:
            m.set_attn_implementation(NAME)
