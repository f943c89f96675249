"""A flat forward for an int8 drafter's short passes (chain steps, re-draft rows), and for every pass of an
int8 target (`--dtype int8`): gpt-fast style.

Why: under `--draft-dtype int8` a chain step is one row through the drafter's int8 matmuls, and
transformers' forward of its bfloat16 network casts every int8 matmul's float32 output back (about 400
casts a step for the 0.5B) and adds its modules' per-call work, about as much time again as the matmuls.
This forward runs the same weights with a float32 residual stream, so an int8 matmul's float32 output is
used as it is; q/k/v and gate/up are each one int8 matmul (their rows concatenated: the same int8 values
and scales, and the same input, so the same sums). Only K/V (written to the cache, which the network's own
long passes share) and the decoder's output are cast to the network's dtype.

Memory: the fused q/k/v and gate/up weights are a second int8 copy of those layers (about 65% of the
decoder's int8 bytes; ~0.23 GB for the 0.5B). The layers keep theirs: transformers' forward over the same
model object (HF assisted generation in benchmarks/peers.py, passes with hidden states) still runs them.

Rule: speed only. A drafter's rows change by rounding (float32 norms and rotary instead of bfloat16), never
a verified token: the target verifies every one. Passes of more than INT8_MAX_ROWS rows (a prefill) and
anything this forward does not cover run transformers' forward, on the same cache.

An int8 target (every linear a RowInt8Linear: `exact`) runs here for every pass, of any row count, hidden
states included, with each input row quantized on its own and attention.exact_attention: the rule that a
tree's rows equal an `ar` step's (lossless in int8) holds within this one forward. Its fused weights are
the layers' RowInt8Linear int8 values stacked, with their biases added after the row scale, as those layers
add them; transformers' forward of the same model stays available (its rows agree with this one's within
rounding, bitwise on tests/test_int8_target.py's tiny model).

Covers Llama-style decoders (`model_type` llama, qwen2, qwen3: Qwen3's per-head q/k norms too): RMSNorm,
rotary positions, grouped K/V heads, a SiLU-gated MLP, full attention in every layer, every linear but the
head an Int8Linear (a drafter), or every one a RowInt8Linear (a target).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import exact_attention
from .cpu_kernels import INT8_MAX_ROWS, REDUCE_RANGE, Int8Linear, RowInt8Linear, row_int8_matmul

FAMILIES = ("llama", "qwen2", "qwen3")


def unsupported(model: nn.Module) -> str | None:
    """Why `Int8Decoder` cannot run `model` (a causal LM), or None when it can."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in FAMILIES:
        return f"model_type {getattr(cfg, 'model_type', None)!r} is not one of {', '.join(FAMILIES)}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "sliding-window layers"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return "no decoder layers at model.model.layers"
    linears = [x for layer in layers for x in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                                                  layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                                                  layer.mlp.down_proj)]
    if not (all(isinstance(x, Int8Linear) for x in linears) or all(isinstance(x, RowInt8Linear) for x in linears)):
        return "its layers are not all Int8Linear (draft dtype int8) nor all RowInt8Linear (dtype int8)"
    return None


def _fuse(linears: list) -> tuple[torch.ScriptObject, torch.Tensor | None]:
    """(one fbgemm int8 weight with the given layers' output rows stacked: their int8 values and per-row
    scales as they are, no re-rounding; the stacked float32 bias a RowInt8Linear adds after its row scale,
    or None: an Int8Linear's bias is packed with its weight)."""
    bias = None                                            # what RowInt8Linears add after their row scale
    if isinstance(linears[0], RowInt8Linear) and any(x.bias is not None for x in linears):
        bias = torch.cat([x.bias.detach().float() if x.bias is not None else torch.zeros(x.out_features)
                          for x in linears])
    if len(linears) == 1:                                  # nothing to stack: the layer's own weight
        return linears[0].int8, bias
    qs, biases = zip(*(torch.ops.quantized.linear_unpack(x.int8) for x in linears))   # (a RowInt8Linear's: None)
    ints = torch.cat([q.int_repr() for q in qs])                                    # [sum out, in] int8
    scales = torch.cat([q.q_per_channel_scales() for q in qs])                      # [sum out] float64
    zeros = torch.cat([q.q_per_channel_zero_points() for q in qs])                  # [sum out]
    q = torch._make_per_channel_quantized_tensor(ints, scales, zeros, 0)
    packed_bias = None
    if any(b is not None for b in biases):
        packed_bias = torch.cat([b if b is not None else ints.new_zeros(len(q_), dtype=torch.float32)
                                 for b, q_ in zip(biases, qs)])
    return torch.ops.quantized.linear_prepack(q, packed_bias), bias


class _Layer:
    """One decoder layer's fused int8 weights and float32 norm weights."""

    def __init__(self, layer: nn.Module):
        a, m = layer.self_attn, layer.mlp
        self.qkv = _fuse([a.q_proj, a.k_proj, a.v_proj])       # [in] -> [q | k | v]
        self.o = _fuse([a.o_proj])
        self.gate_up = _fuse([m.gate_proj, m.up_proj])         # [in] -> [gate | up]
        self.down = _fuse([m.down_proj])
        self.norm1 = layer.input_layernorm.weight.detach().float()            # [H]
        self.norm2 = layer.post_attention_layernorm.weight.detach().float()   # [H]
        self.eps1 = layer.input_layernorm.variance_epsilon
        self.eps2 = layer.post_attention_layernorm.variance_epsilon
        self.scaling = a.scaling
        # Qwen3: RMSNorm over each head's q and k before the rotary (weights [d] each): [hq + hkv, d] stacked
        self.qk_norm = None
        if getattr(a, "q_norm", None) is not None:
            hq, hkv = a.config.num_attention_heads, a.config.num_key_value_heads
            self.qk_norm = torch.cat([a.q_norm.weight.detach().float().expand(hq, -1),
                                      a.k_norm.weight.detach().float().expand(hkv, -1)])
            self.qk_eps = a.q_norm.variance_epsilon


class Int8Decoder:
    """forward(ids [1, N], mask [1, 1, N, W] bool, positions [1, N], cache, hidden_layers) -> ([N, H] decoder
    output in the network's dtype, [N, len(hidden_layers) H] hidden states or None); K/V rows written to
    `cache` as transformers' forward would. An int8 drafter's model (Int8Linear): passes of up to
    INT8_MAX_ROWS rows. An int8 target's (RowInt8Linear, `exact`): every pass, its prefill and hidden states
    included, with exact_attention: a target runs one forward for every row count, so a tree's rows are an
    `ar` step's (attention.exact_attention, cpu_kernels.RowInt8Linear)."""

    def __init__(self, model: nn.Module):
        if why := unsupported(model):
            raise ValueError(f"Int8Decoder: {why}")
        cfg, dec = model.config, model.model
        self.embed = dec.embed_tokens
        self.rotary = dec.rotary_emb
        self.dtype = self.embed.weight.dtype                   # the network's (K/V cache, output)
        self.layers = [_Layer(layer) for layer in dec.layers]
        self.norm = dec.norm.weight.detach().float()
        self.eps = dec.norm.variance_epsilon
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.inter = int(cfg.intermediate_size)
        self.exact = isinstance(dec.layers[0].self_attn.q_proj, RowInt8Linear)

    def _lin(self, x: torch.Tensor, weight: tuple) -> torch.Tensor:
        packed, bias = weight
        if self.exact:
            return row_int8_matmul(x, packed, bias)
        return torch.ops.quantized.linear_dynamic(x, packed, REDUCE_RANGE)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
        """q [1, hq, N, d], k/v [1, hkv, T, d] -> [N, hq d]."""
        n = q.shape[2]
        if self.exact:
            return exact_attention(None, q, k, v, mask, scaling=scale)[0][0].reshape(n, -1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        return o[0].transpose(0, 1).reshape(n, -1)

    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, w.shape, w, eps)                            # w x / sqrt(mean(x^2) + eps), one op

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache,
                hidden_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = ids.shape[1]
        if n > INT8_MAX_ROWS and not self.exact:
            raise ValueError(f"Int8Decoder runs passes of up to {INT8_MAX_ROWS} rows, got {n}")
        hq, hkv, d = self.heads, self.kv_heads, self.head_dim
        x = self.embed(ids)[0].float()                                    # [N, H] float32 from here on
        cos, sin = self.rotary(x, positions)                              # [1, N, d] float32
        cos, sin = cos[0, :, None], sin[0, :, None]                       # [N, 1, d]
        half = d // 2
        states = [x]                                                      # transformers' hidden_states: the
        for i, layer in enumerate(self.layers):                           # embeddings, then each layer's input
            if i:
                states.append(x)
            h = self._rms(x, layer.norm1, layer.eps1)
            qk, v = self._lin(h, layer.qkv).split([(hq + hkv) * d, hkv * d], -1)   # [N, (hq+hkv) d], [N, hkv d]
            qk = qk.view(n, hq + hkv, d)
            if layer.qk_norm is not None:
                qk = F.rms_norm(qk, (d,), None, layer.qk_eps) * layer.qk_norm
            # rotary positions on q and k at once: t cos + rotate_half(t) sin
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin
            qk = qk.to(self.dtype).transpose(0, 1)[None]                  # [1, hq+hkv, N, d]
            k, v = cache.update(qk[:, hq:], v.to(self.dtype).view(n, hkv, d).transpose(0, 1)[None], i)   # [1, hkv, T, d]
            o = self._attend(qk[:, :hq], k, v, mask, layer.scaling)      # [N, hq d]
            x = x + self._lin(o.float(), layer.o)
            gate, up = self._lin(self._rms(x, layer.norm2, layer.eps2), layer.gate_up).split(self.inter, -1)
            x = x + self._lin(F.silu(gate) * up, layer.down)
        out = self._rms(x, self.norm, self.eps).to(self.dtype)           # [N, H]
        states.append(out)                                                # the last one is normed, as theirs
        hidden = torch.cat([states[i].to(self.dtype) for i in hidden_layers], -1) if hidden_layers else None
        return out, hidden

    __call__ = forward
