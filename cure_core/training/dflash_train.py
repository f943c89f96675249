"""Training a DFlash drafter on cached target features.

Initialisation (DFlash/EAGLE style): each draft layer starts as a copy of the target's LAST decoder
layer; `fc` routes the feature slot of decoder layer L-2 (that layer's input) through unchanged and
`hidden_norm` is the last layer's input_layernorm, so at step 0 the context K/V are the target's own
last-layer K/V. Targets without per-head q/k norms (Qwen2) get q_norm/k_norm weights calibrated to the
typical per-head RMS, so the normed projections keep their scale. The target's embedding and lm_head
stay frozen (they are not part of the drafter).

Training example (as DFlash trains): a chunk's features form the context; random anchors a give blocks
[token_a, mask x (B-1)] at positions a..a+B-1, each attending to context rows < a and, bidirectionally,
to its own block. Block row i >= 1 predicts the token at a+i: the target's greedy token (argmax at
a+i-1, self-distillation) or the corpus token. Loss weight exp(-(i-1)/gamma) per offset.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..drafters.dflash import DFlashModel
from .features import FeatureSet
from ..files import atomic_save_safetensors, atomic_write_json


def draft_config_dict(target_config, layer_ids, n_layers: int, block_size: int, mask_token_id: int,
                      attention_bias: bool) -> dict:
    tc = target_config
    h = tc.hidden_size
    rope = dict(getattr(tc, "rope_parameters", None) or {})
    theta = rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0))
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": attention_bias,
        "attention_dropout": 0.0, "block_size": block_size,
        "dflash_config": {"mask_token_id": int(mask_token_id), "target_layer_ids": [int(i) for i in layer_ids]},
        "head_dim": getattr(tc, "head_dim", None) or h // tc.num_attention_heads, "hidden_act": "silu",
        "hidden_size": h, "intermediate_size": tc.intermediate_size,
        "layer_types": ["full_attention"] * n_layers,
        "max_position_embeddings": int(getattr(tc, "max_position_embeddings", 32768)),
        "num_attention_heads": tc.num_attention_heads, "num_hidden_layers": n_layers,
        "num_key_value_heads": tc.num_key_value_heads, "num_target_layers": tc.num_hidden_layers,
        "target_hidden_size": h, "rms_norm_eps": float(tc.rms_norm_eps), "rope_theta": float(theta),
        "rope_parameters": {"rope_theta": float(theta), "rope_type": "default"},
        "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": tc.vocab_size,
        "dtype": "float16",
    }


def build_model(config_dict: dict, target_config) -> DFlashModel:
    from transformers import Qwen3Config
    cfg = Qwen3Config.from_dict(config_dict)
    return DFlashModel(cfg, len(config_dict["dflash_config"]["target_layer_ids"]), target_config.hidden_size)


@torch.no_grad()
def init_from_target(model: DFlashModel, target, layer_ids, fs: FeatureSet | None = None) -> None:
    """Copy the target's last decoder layer into every draft layer (see module doc)."""
    tl = target.model.layers[-1]
    ta = tl.self_attn
    n_t = len(target.model.layers)
    h = target.config.hidden_size
    for layer in model.layers:
        a = layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            src, dst = getattr(ta, name), getattr(a, name)
            dst.weight.copy_(src.weight)
            if dst.bias is not None:
                dst.bias.copy_(src.bias if src.bias is not None else torch.zeros_like(dst.bias))
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(layer.mlp, name).weight.copy_(getattr(tl.mlp, name).weight)
        layer.input_layernorm.weight.copy_(tl.input_layernorm.weight)
        layer.post_attention_layernorm.weight.copy_(tl.post_attention_layernorm.weight)
        if hasattr(ta, "q_norm") and hasattr(ta, "k_norm"):
            a.q_norm.weight.copy_(ta.q_norm.weight)
            a.k_norm.weight.copy_(ta.k_norm.weight)
        else:
            qs, ks = _qk_rms(ta, tl, fs, layer_ids, n_t, a.head_dim)
            a.q_norm.weight.fill_(qs)
            a.k_norm.weight.fill_(ks)
    model.fc.weight.zero_()
    slot = list(layer_ids).index(n_t - 2) if (n_t - 2) in layer_ids else len(layer_ids) - 1
    model.fc.weight[:, slot * h:(slot + 1) * h].copy_(torch.eye(h))
    model.hidden_norm.weight.copy_(tl.input_layernorm.weight)
    model.norm.weight.copy_(target.model.norm.weight)


# The config fields a drafter must share with the one being built for its weights to mean the same thing
# (block_size may differ: no weight depends on it).
INIT_MUST_MATCH = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "attention_bias", "vocab_size")


class DrafterInitError(ValueError):
    """A --dflash-init drafter that cannot start this training (one line: what differs)."""


def read_init_drafter(folder, config_dict: dict) -> dict:
    """The weights of a trained DFlash drafter (a folder in the published layout) that a further version
    starts from instead of the target's last layer; read and checked before any feature is computed.

    Rule: its layers, sizes, target layers and mask token must equal the ones this training builds
    (block_size may differ: no weight depends on it); draft_vocab is not a weight (the new run writes
    its own from its labels)."""
    import json
    from pathlib import Path
    from safetensors.torch import load_file
    folder = Path(folder)
    try:
        theirs = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise DrafterInitError(f"--dflash-init {folder}: no readable config.json ({type(e).__name__})") from None
    if not isinstance(theirs.get("dflash_config"), dict):
        raise DrafterInitError(f"--dflash-init {folder}: not a DFlash drafter (no dflash_config in config.json)")
    for key in INIT_MUST_MATCH:
        if theirs.get(key) != config_dict.get(key):
            raise DrafterInitError(f"--dflash-init {folder}: {key} is {theirs.get(key)}, this training builds "
                                   f"{config_dict.get(key)}")
    for key in ("target_layer_ids", "mask_token_id"):
        if theirs["dflash_config"].get(key) != config_dict["dflash_config"][key]:
            raise DrafterInitError(f"--dflash-init {folder}: {key} is {theirs['dflash_config'].get(key)}, this "
                                   f"training builds {config_dict['dflash_config'][key]}")
    try:
        state = load_file(str(folder / "model.safetensors"))
    except Exception as e:                  # safetensors raises its own error types on a bad file
        raise DrafterInitError(f"--dflash-init {folder}: cannot read model.safetensors ({type(e).__name__})") from None
    state.pop("draft_vocab", None)
    return state


@torch.no_grad()
def init_from_state(model: DFlashModel, state: dict) -> None:
    """Copy `read_init_drafter`'s weights into a freshly built model: every weight it has, same shapes."""
    own = {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or extra:
        raise DrafterInitError(f"--dflash-init: weights differ (missing {missing[:3]}, unexpected {extra[:3]})")
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise DrafterInitError(f"--dflash-init: {k} is {tuple(state[k].shape)}, expected {tuple(v.shape)}")
        v.copy_(state[k].to(v.dtype))


def _qk_rms(ta, tl, fs, layer_ids, n_t, head_dim) -> tuple[float, float]:
    """Mean per-head RMS of the target's last-layer q/k projections on cached features (1.0 without)."""
    if fs is None or not len(fs) or (n_t - 2) not in layer_ids:
        return 1.0, 1.0
    h = tl.input_layernorm.weight.shape[0]
    slot = list(layer_ids).index(n_t - 2)
    x = torch.cat([f[:, slot * h:(slot + 1) * h] for f in fs.features[:4]]).float()[:2048]
    dt = tl.input_layernorm.weight.dtype
    x = tl.input_layernorm(x.to(dt))
    rms = lambda y: float(y.float().view(y.shape[0], -1, head_dim).pow(2).mean(-1).sqrt().mean())  # noqa: E731
    return rms(ta.q_proj(x)), rms(ta.k_proj(x))


def sample_anchors(length: int, n: int, gen: torch.Generator) -> list[int]:
    """Up to n distinct anchors in [1, length-2] (at least one context row and one target token)."""
    hi = length - 2
    if hi < 1:
        return []
    perm = torch.randperm(hi, generator=gen)[:n] + 1
    return sorted(perm.tolist())


def block_hidden(model: DFlashModel, embed, feats: torch.Tensor, tokens: torch.Tensor, anchors: list[int],
                 block: int, mask_id: int) -> torch.Tensor:
    """Final-normed hidden [len(anchors), block, H] of blocks [token_a, mask x (block-1)] over one chunk's
    context features (row r < a visible to anchor a's block)."""
    dev = next(model.parameters()).device
    dt = next(model.parameters()).dtype
    L = feats.shape[0]
    nA = len(anchors)
    ctx_kv = model.context_kv(feats.to(dev, dt), torch.arange(L, device=dev))
    a = torch.tensor(anchors, device=dev)
    ids = torch.full((nA, block), mask_id, dtype=torch.long, device=dev)
    ids[:, 0] = tokens.to(dev)[a]
    pos = (a[:, None] + torch.arange(block, device=dev)[None]).reshape(-1)
    seg = torch.arange(nA, device=dev).repeat_interleave(block)
    ctx_ok = torch.arange(L, device=dev)[None, :] < a.repeat_interleave(block)[:, None]
    mask = torch.cat([ctx_ok, seg[:, None] == seg[None, :]], dim=1)
    emb = embed(ids.reshape(-1)).to(dt)
    hid = model(emb, pos, ctx_kv, mask)
    return hid.view(nA, block, -1)


def block_labels(fs: FeatureSet, c: int, anchors: list[int], block: int, labels: str) -> torch.Tensor:
    """[nA, block] labels for block rows (row 0 and rows past the chunk end = -100)."""
    src = fs.argmax[c] if labels == "target" else fs.tokens[c]
    shift = 1 if labels == "target" else 0       # argmax[t] is the target's token at t+1
    L = fs.tokens[c].shape[0]
    out = torch.full((len(anchors), block), -100, dtype=torch.long)
    for k, a in enumerate(anchors):
        for i in range(1, block):
            t = a + i
            if t < L:
                out[k, i] = src[t - shift]
    return out


def offset_weights(block: int, gamma: float) -> torch.Tensor:
    w = torch.tensor([0.0] + [math.exp(-(i - 1) / gamma) if gamma > 0 else 1.0 for i in range(1, block)])
    return w


def loss_step(model, embed, head_w: torch.Tensor, fs: FeatureSet, chunk_ids: list[int], anchors_per_chunk: int,
              block: int, mask_id: int, labels: str, vocab_subset: torch.Tensor | None, gamma: float,
              gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    """Weighted CE over a batch of chunks; returns (loss, stats: per-offset top-1 accuracy counts)."""
    dev = head_w.device
    w = offset_weights(block, gamma).to(dev)
    total, wsum = 0.0, 0.0
    hits = torch.zeros(block)
    cnt = torch.zeros(block)
    for c in chunk_ids:
        anchors = sample_anchors(fs.tokens[c].shape[0], anchors_per_chunk, gen)
        if not anchors:
            continue
        hid = block_hidden(model, embed, fs.features[c], fs.tokens[c], anchors, block, mask_id)
        lab = block_labels(fs, c, anchors, block, labels).to(dev)
        lab[lab == mask_id] = -100                      # a mask is never a draft: no label
        if vocab_subset is not None:
            sub = torch.unique(torch.cat([vocab_subset, lab[lab >= 0]]))
            remap = torch.full((head_w.shape[0],), -100, dtype=torch.long, device=dev)
            remap[sub] = torch.arange(sub.numel(), device=dev)
            tgt = torch.where(lab >= 0, remap[lab.clamp(min=0)], lab)
            logits = hid.to(head_w.dtype) @ head_w[sub].T
        else:
            tgt = lab
            logits = hid.to(head_w.dtype) @ head_w.T
            logits[..., mask_id] = float("-inf")
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none",
                             ignore_index=-100).view(tgt.shape)
        valid = (tgt >= 0).float()
        ww = valid * w[None]
        total = total + (ce * ww).sum()
        wsum += float(ww.sum())
        with torch.no_grad():
            pred = logits.argmax(-1)
            hits += ((pred == tgt) & (tgt >= 0)).float().sum(0).cpu()
            cnt += valid.sum(0).cpu()
    loss = total / max(wsum, 1e-9)
    return loss, {"hits": hits, "count": cnt}


def save_dflash(folder, model: DFlashModel, config_dict: dict, dtype=torch.float16,
                draft_vocab: torch.Tensor | None = None) -> None:
    """The published layout: config.json + model.safetensors (unprefixed names, no embedding/lm_head),
    plus the optional int64 `draft_vocab` tensor the loader turns into a DraftVocab."""
    state = {k: v.detach().to("cpu", dtype) for k, v in model.state_dict().items() if "rotary_emb" not in k}
    if draft_vocab is not None:
        state["draft_vocab"] = draft_vocab.detach().to("cpu", torch.int64).contiguous()
    atomic_save_safetensors(f"{folder}/model.safetensors", state)
    atomic_write_json(f"{folder}/config.json", dict(config_dict, dtype=str(dtype).replace("torch.", "")))
