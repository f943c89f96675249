"""Training a PARD-style drafter: a small causal LM with a mask token.

The model is the target shrunk to `layers` decoder layers (evenly spaced, first and last kept; the
embedding, final norm and lm_head copied) or a small model from scratch. Its config carries
`pard_token` (the mask id), so `--drafter auto` loads it as a PardDrafter.

Training (PARD's mixed mask spans, all in one forward per chunk): the chunk's real tokens are followed
by, for each random anchor a, masks m_1..m_{B-2} at positions a+1..a+B-2. Real tokens attend causally
to real tokens; anchor a's masks attend to real tokens 0..a and to the earlier masks of their own span.
Real token t predicts the token at t+1 (the ordinary LM loss) and mask m_i predicts the token at a+1+i.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .dflash_train import sample_anchors
from .features import FeatureSet


def shrink_target(target, layers: int, mask_token_id: int):
    cfg = copy.deepcopy(target.config)
    n = cfg.num_hidden_layers
    keep = sorted({int(round(i * (n - 1) / max(layers - 1, 1))) for i in range(layers)}) if layers > 1 else [n - 1]
    cfg.num_hidden_layers = len(keep)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in keep]
    cfg.pard_token = int(mask_token_id)
    model = type(target)(cfg)
    sd = target.state_dict()
    new = {}
    for k, v in sd.items():
        if k.startswith("model.layers."):
            i = int(k.split(".")[2])
            if i in keep:
                new[k.replace(f"model.layers.{i}.", f"model.layers.{keep.index(i)}.", 1)] = v.clone()
        else:
            new[k] = v.clone()
    model.load_state_dict(new, strict=False)
    return model.float().train()


def scratch_model(target, layers: int, hidden: int, mask_token_id: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    tc = target.config
    heads = max(1, hidden // 64)
    cfg = Qwen3Config(vocab_size=tc.vocab_size, hidden_size=hidden, intermediate_size=hidden * 3,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                      head_dim=hidden // heads, max_position_embeddings=int(getattr(tc, "max_position_embeddings", 4096)),
                      tie_word_embeddings=True, eos_token_id=tc.eos_token_id, bos_token_id=getattr(tc, "bos_token_id", None),
                      pad_token_id=getattr(tc, "pad_token_id", None))
    cfg.pard_token = int(mask_token_id)
    return Qwen3ForCausalLM(cfg).float().train()


def pard_batch(tokens: torch.Tensor, anchors: list[int], block: int, mask_id: int):
    """-> (ids [N], positions [N], bool mask [N, N], label index: per row the chunk position whose token
    it predicts, or -1)."""
    L = tokens.shape[0]
    n_m = max(block - 2, 0)
    ids = [int(t) for t in tokens]
    pos = list(range(L))
    tgt = [t + 1 if t + 1 < L else -1 for t in range(L)]
    owner = [-1] * L
    for k, a in enumerate(anchors):
        for i in range(1, n_m + 1):
            ids.append(mask_id)
            pos.append(a + i)
            tgt.append(a + 1 + i if a + 1 + i < L else -1)
            owner.append(k)
    N = len(ids)
    pos_t = torch.tensor(pos)
    own = torch.tensor(owner)
    mask = torch.zeros((N, N), dtype=torch.bool)
    real_idx = torch.arange(L)
    # real rows: causal over real tokens
    mask[:L, :L] = real_idx[None, :] <= real_idx[:, None]
    if N > L:
        anc = torch.tensor(anchors)[own[L:]]                 # the anchor of each mask row
        mask[L:, :L] = real_idx[None, :] <= anc[:, None]
        same = own[L:, None] == own[None, L:]
        mask[L:, L:] = same & (pos_t[None, L:] <= pos_t[L:, None])
    return torch.tensor(ids), pos_t, mask, torch.tensor(tgt)


def pard_hidden(model, tokens: torch.Tensor, anchors: list[int], block: int, mask_id: int):
    dev = next(model.parameters()).device
    ids, pos, mask, tgt = pard_batch(tokens, anchors, block, mask_id)
    out = model.model(input_ids=ids[None].to(dev), position_ids=pos[None].to(dev),
                      attention_mask=mask[None, None].to(dev), use_cache=False)
    return out.last_hidden_state[0], tgt


def loss_step(model, fs: FeatureSet, chunk_ids: list[int], anchors_per_chunk: int, block: int, mask_id: int,
              labels: str, vocab_subset: torch.Tensor | None, gamma: float, gen: torch.Generator):
    head_w = model.get_output_embeddings().weight
    dev = head_w.device
    total, wsum = 0.0, 0.0
    hits = torch.zeros(block)
    cnt = torch.zeros(block)
    for c in chunk_ids:
        toks = fs.tokens[c]
        L = toks.shape[0]
        anchors = sample_anchors(L, anchors_per_chunk, gen)
        hid, tgt_pos = pard_hidden(model, toks, anchors, block, mask_id)
        # offset of each row: 1 for real rows (next token), i+1 for mask m_i
        off = torch.ones(len(tgt_pos), dtype=torch.long)
        off[L:] = torch.arange(2, block).repeat(len(anchors)) if block > 2 else off[L:]
        src = fs.argmax[c] if labels == "target" else toks
        shift = 1 if labels == "target" else 0
        lab = torch.where(tgt_pos >= 0, src[(tgt_pos - shift).clamp(min=0, max=L - 1)], torch.full_like(tgt_pos, -100))
        lab = lab.masked_fill(lab == mask_id, -100).to(dev)
        if vocab_subset is not None:
            sub = torch.unique(torch.cat([vocab_subset, lab[lab >= 0]]))
            remap = torch.full((head_w.shape[0],), -100, dtype=torch.long, device=dev)
            remap[sub] = torch.arange(sub.numel(), device=dev)
            tgt = torch.where(lab >= 0, remap[lab.clamp(min=0)], lab)
            logits = hid @ head_w[sub].T
        else:
            tgt = lab
            logits = hid @ head_w.T
        ce = F.cross_entropy(logits.float(), tgt, reduction="none", ignore_index=-100)
        w = torch.exp(-(off.float() - 1) / gamma).to(dev) if gamma > 0 else torch.ones(len(off), device=dev)
        valid = (tgt >= 0).float()
        total = total + (ce * w * valid).sum()
        wsum += float((w * valid).sum())
        with torch.no_grad():
            pred = logits.argmax(-1)
            ok = ((pred == tgt) & (tgt >= 0)).float().cpu()
            for j in range(1, block):
                sel = off == j
                hits[j] += ok[sel].sum()
                cnt[j] += valid.cpu()[sel].sum()
    return total / max(wsum, 1e-9), {"hits": hits, "count": cnt}
