"""Training text for a drafter: CPython's standard library, the target's own continuations, or files.

A corpus is a list of `Doc`s (name, text) in a deterministic order; `split_docs` holds out a seeded
fraction of documents for evaluation, and `chunk_docs` tokenizes documents into fixed-length chunks
(every chunk starts a fresh context at position 0, as the drafter sees a prompt).
"""
from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__",
             "turtledemo", "ensurepip", "pydoc_data"}
MAX_FILE_CHARS = 200_000


@dataclass(frozen=True)
class Doc:
    name: str
    text: str


def stdlib_files() -> list[Path]:
    """The standard library's .py files on this machine (sorted; tests and vendored code skipped)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts[:-1]) or p.name.startswith("test_"):
            continue
        files.append(p)
    return files


def _read(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8", errors="ignore")[:MAX_FILE_CHARS]
    except OSError:
        return ""


def stdlib_docs() -> list[Doc]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = [Doc(str(p.relative_to(root)), _read(p)) for p in stdlib_files()]
    return [d for d in docs if d.text.strip()]


def file_docs(paths: Sequence[str | Path]) -> list[Doc]:
    """Text files, or every file under a folder (sorted)."""
    docs = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            files = [p]
        else:
            raise FileNotFoundError(f"corpus file not found: {p}")
        docs.extend(Doc(str(f), _read(f)) for f in files)
    return [d for d in docs if d.text.strip()]


def signature_prompts(docs: Sequence[Doc], limit: int, seed: int = 0) -> list[str]:
    """Code prompts from function definitions in Python sources: the `def` line(s) and docstring,
    the way a HumanEval prompt looks. Seeded sample of `limit`."""
    prompts = []
    for d in docs:
        try:
            tree = ast.parse(d.text)
        except (SyntaxError, ValueError):
            continue
        lines = d.text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
                continue
            first = node.body[0]
            has_doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                and isinstance(first.value.value, str)
            if not has_doc or len(node.body) < 2:
                continue
            start = node.lineno - 1 - len(node.decorator_list)
            text = "".join(lines[start: first.end_lineno])
            if 40 <= len(text) <= 1500:
                prompts.append(text if text.endswith("\n") else text + "\n")
    random.Random(seed).shuffle(prompts)
    return prompts[:limit]


def split_docs(docs: Sequence[Doc], heldout_frac: float, seed: int) -> tuple[list[Doc], list[Doc]]:
    """Seeded document-level split -> (train, heldout); both keep the corpus order."""
    idx = list(range(len(docs)))
    random.Random(seed).shuffle(idx)
    n_held = max(1, int(round(len(docs) * heldout_frac))) if len(docs) > 1 and heldout_frac > 0 else 0
    held = set(idx[:n_held])
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def chunk_docs(docs: Sequence[Doc], encode: Callable[[str], list[int]], seq_len: int, min_len: int,
               max_tokens: int | None = None, seed: int = 0) -> list[list[int]]:
    """Tokenize documents (seeded order) into chunks of at most seq_len tokens, dropping chunks shorter
    than min_len; stop once max_tokens are collected."""
    order = list(range(len(docs)))
    random.Random(seed + 1).shuffle(order)
    chunks, total = [], 0
    for i in order:
        ids = encode(docs[i].text)
        for s in range(0, len(ids), seq_len):
            c = ids[s: s + seq_len]
            if len(c) < min_len:
                continue
            if max_tokens is not None and total + len(c) > max_tokens:
                c = c[: max_tokens - total]
                if len(c) >= min_len:
                    chunks.append(c)
                return chunks
            chunks.append(c)
            total += len(c)
    return chunks


def fingerprint(chunks: Sequence[Sequence[int]]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(len(c).to_bytes(4, "little"))
        h.update(b"".join(int(t).to_bytes(4, "little") for t in c))
    return h.hexdigest()[:16]


def self_distill_docs(model, tokenizer, prompts: Sequence[str], new_tokens: int, progress=None,
                      batch: int = 16) -> list[Doc]:
    """The target's own greedy continuations of code prompts (prompt + continuation = one document).

    Prompts run `batch` at a time, left-padded, through HF generate: a decode step over 16 rows costs
    little more than over one on a memory-bound CPU or GPU (Qwen2.5-0.5B, 2 cores: ~1.5x), so the
    corpus comes ~10x faster. Padding may round a row differently from running it alone; that only
    changes which text is trained on, never what is verified at decode time."""
    import torch

    from ..models import eos_ids
    docs = []
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = set(eos_ids(model, tokenizer))
    for s in range(0, len(prompts), batch):
        part = [tokenizer.encode(p, add_special_tokens=False) for p in prompts[s: s + batch]]
        width = max(len(ids) for ids in part)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in part], device=dev)          # [B, T] left-padded
        attn = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in part], device=dev)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad)
        for j, x in enumerate(part):
            cont = out[j, width:].tolist()
            cut = next((k + 1 for k, t in enumerate(cont) if t in eos), len(cont))   # keep the first EOS only
            docs.append(Doc(f"distill/{s + j}", tokenizer.decode(x + cont[:cut], skip_special_tokens=True)))
        if progress is not None:
            progress(len(part))
    return docs

