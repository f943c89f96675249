"""Evaluating a trained drafter against its target on held-out prompts.

1. The target's greedy continuation of each prompt (the real engine, strategy ar).
2. Per-position acceptance: for every anchor in the continuation, the drafter drafts one block from the
   true context; offset j (1..4) counts as accepted when its top-1 token equals the target's greedy token
   there (top-1 agreement; a chain accepts offset j only if 1..j all agree, also reported).
3. tau (emitted tokens per target forward) with K=8 from the real engine, strategies parallel and
   cure; each output is checked against step 1 (lossless).
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..config import DecodeConfig
from ..engine import Engine, generate_ids
from ..metrics import summarize
from .dflash_train import block_hidden
from .features import target_forward
from .pard_train import pard_hidden

OFFSETS = 4


@torch.inference_mode()
def _offset_predictions(pair, kind: str, seq: list[int], start: int, block: int) -> dict[int, list[bool]]:
    """For anchors a = start..len(seq)-2: per offset j, whether the drafter's top-1 equals seq[a+j]."""
    d = pair.drafter
    anchors = list(range(start, len(seq) - 1))
    toks = torch.tensor(seq)
    ok: dict[int, list[bool]] = {j: [] for j in range(1, block)}
    if not anchors:
        return ok
    if kind == "dflash":
        _, feats = target_forward(pair.target, seq, d.target_layer_ids)
        if d.vocab is not None:                  # as at decode time: the prompt's ids join the draft vocabulary
            d.vocab.reset()
            d.vocab.add(seq[:start + 1])
        for s in range(0, len(anchors), 16):
            part = anchors[s: s + 16]
            hid = block_hidden(d.model, d.embed, feats, toks, part, block, d.mask_token_id)
            pred = d.to_target_ids(d._logits(hid.to(d.lm_head.weight.dtype)).argmax(-1)).cpu()   # [nA, block]
            for k, a in enumerate(part):
                for j in range(1, block):
                    if a + j < len(seq):
                        ok[j].append(bool(pred[k, j] == seq[a + j]))
    else:
        model = d.lm.model
        L = len(seq)
        for s in range(0, len(anchors), 16):
            part = anchors[s: s + 16]
            hid, _ = pard_hidden(model, toks, part, block, d.mask_token_id)
            logits = d._logits(model.lm_head(hid).float())
            pred = logits.argmax(-1).cpu()
            n_m = max(block - 2, 0)
            for k, a in enumerate(part):
                if a + 1 < L:
                    ok[1].append(bool(pred[a] == seq[a + 1]))
                for i in range(1, n_m + 1):
                    if a + 1 + i < L:
                        ok[i + 1].append(bool(pred[L + k * n_m + i - 1] == seq[a + 1 + i]))
    return ok


def evaluate(pair, kind: str, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64, k: int = 8,
             block: int = 8, progress=None, refs: Sequence[Sequence[int]] | None = None) -> dict:
    """`refs`: the target's greedy continuations of `prompts` when the caller has them already (another
    drafter's eval over the same target); computed here otherwise. Either way they come back as
    `references`, for the next drafter's eval."""
    per = {j: [] for j in range(1, block)}
    chain = {j: [] for j in range(1, block)}
    taus: dict[str, list] = {"parallel": [], "cure": []}
    lossless = True
    rows, references = [], []
    for i, p in enumerate(prompts):
        p = [int(t) for t in p]
        ref = ([int(t) for t in refs[i]] if refs is not None else
               generate_ids(pair, DecodeConfig.of(strategy="ar", max_new_tokens=max_new_tokens, k=k), p))
        references.append(ref)
        seq = p + ref
        ok = _offset_predictions(pair, kind, seq, len(p) - 1, block)
        for j in ok:
            per[j].extend(ok[j])
        for a in range(len(ok[1])):
            run = True
            for j in range(1, block):
                if a < len(ok[j]):
                    run = run and ok[j][a]
                    chain[j].append(run)
        row = {"prompt_tokens": len(p), "new_tokens": len(ref)}
        for strat in taus:
            blocks = list(Engine(pair, DecodeConfig.of(strategy=strat, k=k, max_new_tokens=max_new_tokens)).generate(p))
            out = [t for b in blocks for t in b.emitted]
            lossless = lossless and out == ref
            st = summarize(blocks)
            taus[strat].append((st.new_tokens, st.blocks))
            row[f"tau_{strat}"] = st.tau
        rows.append(row)
        if progress is not None:
            progress()
    rate = lambda xs: sum(xs) / len(xs) if xs else 0.0   # noqa: E731
    return {
        "prompts": len(prompts), "k": k, "max_new_tokens": max_new_tokens,
        "per_position_top1": {str(j): rate(per[j]) for j in range(1, min(block, OFFSETS + 1))},
        "per_position_chain": {str(j): rate(chain[j]) for j in range(1, min(block, OFFSETS + 1))},
        "positions": len(per[1]),
        "tau": {s: (sum(n for n, _ in v) / max(sum(b for _, b in v), 1)) for s, v in taus.items()},
        "lossless": lossless, "per_prompt": rows, "references": references,
    }
