"""A self-distilled corpus: the target's own greedy answers to varied prompts, saved as text.

The corpus is one jsonl file: a header line `{"meta": {...}}` (target, prompt mix, counts, the
prompts' sha256), then one line per finished prompt `{"i": index, "kind": ..., "text": prompt + answer}`.
The text keeps the chat template's special tokens (`<|im_start|>` ...) and the answer's end token, so
tokenizing it again gives the ids the drafter sees at decode time.

Generation is resumable: the file is rewritten atomically after every batch, and a rerun with the same
meta continues after the last finished prompt (another meta is an error, never an overwrite). The text,
not features, is what a training run on another machine needs (`--corpus FILE.jsonl` or --resume).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Sequence

from ..files import atomic_write_text
from .corpus import Doc, corpus_docs, read_corpus
from .prompt_mix import PromptSpec


WINDOW_BATCHES = 4


class CorpusMismatch(ValueError):
    """An existing corpus file was generated with other settings."""


def encode_spec(tokenizer, spec: PromptSpec) -> list[int]:
    if spec.chat and getattr(tokenizer, "chat_template", None):
        from ..models import encode_prompt
        return encode_prompt(tokenizer, spec.text, chat=True)
    return tokenizer.encode(spec.text, add_special_tokens=False)


def prompts_sha(specs: Sequence[PromptSpec]) -> str:
    h = hashlib.sha256()
    for s in specs:
        h.update(json.dumps([s.kind, s.chat, s.text]).encode())
    return h.hexdigest()[:16]


def generate_batch(model, tokenizer, prompts: Sequence[list[int]], new_tokens: int) -> list[str]:
    """The model's greedy continuations of `prompts`, run together left-padded through HF generate;
    each text is prompt + continuation up to and including the first end token.

    A decode step over 16 rows costs little more than over one on a memory-bound CPU or GPU
    (Qwen2.5-0.5B, 2 cores: ~1.5x), so a batch is ~10x faster than one prompt at a time. Padding may
    round a row differently from running it alone; that only changes which text is trained on, never
    what is verified at decode time."""
    import torch

    from ..models import eos_ids
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = set(eos_ids(model, tokenizer))
    width = max(len(x) for x in prompts)
    ids = torch.tensor([[pad] * (width - len(x)) + list(x) for x in prompts], device=dev)    # [B, T] left-padded
    attn = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts], device=dev)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=pad)
    texts = []
    for j, x in enumerate(prompts):
        cont = out[j, width:].tolist()
        cut = next((k + 1 for k, t in enumerate(cont) if t in eos), len(cont))   # keep the first end token only
        texts.append(tokenizer.decode(list(x) + cont[:cut], skip_special_tokens=False))
    return texts


def distill(model, tokenizer, specs: Sequence[PromptSpec], new_tokens: int, path: str | Path | None, meta: dict,
            batch: int = 16, progress: Callable[[int], None] | None = None) -> list[Doc]:
    """Generate (or finish generating) the corpus file at `path` (None: keep it in memory); returns its
    documents.

    `meta` names what makes the text (target, mix, seed, ...); the prompt count, their sha256, the
    token budget and the batch size are added here. Progress counts prompts, resumed ones included."""
    path = Path(path) if path is not None else None
    meta = dict(meta, prompts=len(specs), prompts_sha=prompts_sha(specs), new_tokens=new_tokens, batch=batch)
    recs: list[dict] = []
    if path is not None and path.exists():
        old, recs = read_corpus(path)
        if old != meta:
            diff = sorted(k for k in set(meta) | set(old or {}) if (old or {}).get(k) != meta.get(k))
            raise CorpusMismatch(f"{path} was generated with other settings ({', '.join(diff)} differ); "
                                 f"delete it or write the corpus elsewhere")
    if progress is not None and recs:
        progress(len(recs))

    def save():
        if path is None:
            return
        lines = [json.dumps({"meta": meta})] + [json.dumps(r, ensure_ascii=False) for r in recs]
        atomic_write_text(path, "\n".join(lines) + "\n")

    # Rule: batches are fixed slices of the prompts ordered by window of WINDOW_BATCHES batches, then
    # token length, then index: rows of a batch need little padding, any prefix of the file mixes every
    # kind of prompt (the list is shuffled), and the file only ever holds whole batches, so a resumed
    # corpus equals an uninterrupted one.
    encoded = [encode_spec(tokenizer, p) for p in specs]
    window = batch * WINDOW_BATCHES
    order = sorted(range(len(specs)), key=lambda i: (i // window, len(encoded[i]), i))
    for s in range(len(recs), len(specs), batch):
        part = order[s: s + batch]
        texts = generate_batch(model, tokenizer, [encoded[i] for i in part], new_tokens)
        recs = recs[:s] + [{"i": i, "kind": specs[i].kind, "text": t} for i, t in zip(part, texts)]
        save()
        if progress is not None:
            progress(len(part))
    if path is None:
        return [Doc(f"distill/{r['i']}", r["text"]) for r in recs]
    if not path.exists():
        save()
    return corpus_docs(path)
