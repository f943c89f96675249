"""From a training spec to cached target features: corpus -> chunks -> features (shared by both kinds)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import corpus as C
from .distill import distill
from .features import Donors, FeatureSet, extract
from .prompt_mix import prompt_mix


@dataclass
class DataSpec:
    corpus: list[str] = field(default_factory=lambda: ["stdlib"])   # stdlib | self-distill | FILE/DIR paths
    seq_len: int = 256
    max_tokens: int | None = 60_000          # training tokens to extract (None: all)
    heldout_frac: float = 0.05
    seed: int = 0
    distill_prompts: int = 64                # self-distill: how many prompts (prompt_mix.py)
    distill_tokens: int = 128                # self-distill: greedy tokens per prompt
    distill_mix: str = "code"                # self-distill: code (stdlib signatures) | mixed (prompt_mix.MIXES)
    distill_batch: int = 16                  # self-distill: prompts per generate() call


def default_layer_ids(n_layers: int) -> list[int]:
    """Three taps: a quarter, half way, and the input of the last decoder layer (whose weights
    initialise the draft layer, so that tap lets the drafter start from the target's own last step)."""
    return sorted({max(0, n_layers // 4), max(0, n_layers // 2), max(0, n_layers - 2)})


DISTILL_FILE = "self-distill.jsonl"


def build_docs(spec: DataSpec, model=None, tokenizer=None, progress_factory: Callable | None = None,
               corpus_dir: Path | None = None, target_name: str = "") -> tuple[list, list]:
    """-> (train docs, held-out docs). A self-distilled corpus is written to (and resumed from)
    corpus_dir/self-distill.jsonl, as text (distill.py); without corpus_dir it stays in memory."""
    train, held = [], []
    for src in spec.corpus:
        if src == "stdlib":
            docs = C.stdlib_docs()
        elif src == "self-distill":
            if model is None:
                raise ValueError("self-distill needs the target model")
            specs = prompt_mix(spec.distill_prompts, spec.distill_mix, seed=spec.seed)
            bar = progress_factory("self-distill prompts", len(specs)) if progress_factory else None
            path = Path(corpus_dir) / DISTILL_FILE if corpus_dir is not None else None
            meta = {"target": target_name, "mix": spec.distill_mix, "seed": spec.seed}
            docs = distill(model, tokenizer, specs, spec.distill_tokens, path, meta, batch=spec.distill_batch,
                           progress=bar)
        else:
            docs = C.file_docs([src])
        tr, he = C.split_docs(docs, spec.heldout_frac, spec.seed)
        train += tr
        held += he
    if not train:
        raise ValueError(f"the corpus {spec.corpus} has no training text")
    return train, held


def prepare_features(spec: DataSpec, model, tokenizer, target_name: str, layer_ids: list[int], folder: Path,
                     min_len: int, progress_factory=None, target_pass: bool = True,
                     features_from: Sequence[str | Path] = ()) -> tuple[FeatureSet, list, list[list[int]]]:
    """-> (features of the training chunks, held-out docs, training chunks). target_pass=False skips the
    target's forward over the chunks (nothing to cache: no layers, and the labels are the text).
    features_from: other runs' feature folders; chunks they hold are copied, not recomputed (features.py)."""
    train, held = build_docs(spec, model, tokenizer, progress_factory, corpus_dir=Path(folder).parent / "corpus",
                             target_name=target_name)
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)   # noqa: E731
    chunks = C.chunk_docs(train, enc, spec.seq_len, min_len, spec.max_tokens, seed=spec.seed)
    if not chunks:
        raise ValueError("the corpus gave no chunk long enough to train on")
    meta = {"target": target_name, "data": asdict(spec), "fingerprint": C.fingerprint(chunks)}
    total = sum(len(c) for c in chunks)
    progress = progress_factory("target features", total) if progress_factory else None
    if not target_pass:
        if progress is not None:
            progress(total)
        toks = [torch.tensor(c, dtype=torch.long) for c in chunks]
        # argmax is unused with text labels; the text stands in for it.
        return FeatureSet(toks, toks, [torch.zeros((len(c), 0), dtype=torch.float16) for c in chunks]), held, chunks
    donors = Donors(features_from, target_name, layer_ids) if features_from else None
    fs = extract(model, chunks, layer_ids, folder, meta, progress=progress, donors=donors)
    return fs, held, chunks
