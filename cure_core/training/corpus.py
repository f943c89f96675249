"""Training text for a drafter: CPython's standard library or files (the target's own answers: distill.py).

A corpus is a list of `Doc`s (name, text) in a deterministic order; `split_docs` holds out a seeded
fraction of documents for evaluation, and `chunk_docs` tokenizes documents into fixed-length chunks
(every chunk starts a fresh context at position 0, as the drafter sees a prompt).
"""
from __future__ import annotations

import ast
import hashlib
import json
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
    """Text files, or every file under a folder (sorted); a self-distilled corpus `.jsonl` (written by
    distill.py) gives its documents."""
    docs = []
    for p in map(Path, paths):
        if p.is_file() and p.suffix == ".jsonl":
            docs.extend(corpus_docs(p))
            continue
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            files = [p]
        else:
            raise FileNotFoundError(f"corpus file not found: {p}")
        docs.extend(Doc(str(f), _read(f)) for f in files)
    return [d for d in docs if d.text.strip()]


def read_corpus(path: str | Path) -> tuple[dict | None, list[dict]]:
    """(meta or None, records in file order) of a corpus jsonl."""
    meta, recs = None, []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if "meta" in rec:
            meta = rec["meta"]
        else:
            recs.append(rec)
    return meta, recs


def corpus_docs(path: str | Path) -> list[Doc]:
    """The documents of a corpus jsonl (name = its index), in prompt order."""
    _, recs = read_corpus(path)
    return [Doc(f"{Path(path).name}/{r.get('i', k)}", r["text"]) for k, r in enumerate(recs) if r.get("text")]


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
