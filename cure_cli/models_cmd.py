"""`cure models`: the embedded aliases, whether each is installed and cached, sizes, licences; and the
drafters that ship for them (assets/drafters/<target alias>/, read from each drafter.json)."""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cure_core.catalog import DEFAULT_TARGET, DRAFTERS, EMBEDDED_MODELS, DrafterCard, drafter_cards
from cure_core.embedded import MARKER, cache_path, ensure_cached, model_status

from .common import err_console, friendly_errors


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n else "-"


def _tau(card: DrafterCard) -> str:
    """Measured tau per prompt set, the best strategy each (as the card records it)."""
    best: dict[str, tuple[float, str, int]] = {}
    for r in card.tau:
        if r.prompts not in best or r.tau > best[r.prompts][0]:
            best[r.prompts] = (r.tau, r.strategy, r.k)
    return "; ".join(f"{t:.2f} {s} K={k} ({p})" for p, (t, s, k) in best.items()) or "-"


def _kind(card: DrafterCard) -> str:
    return card.kind + (f" (adapted {card.base})" if card.base else "")


def _drafter_row(card: DrafterCard) -> dict:
    return {"alias": card.alias, "target": card.target, "kind": card.kind, "base": card.base,
            "block_size": card.block_size, "draft_vocab": card.draft_vocab, "path": str(DRAFTERS / card.alias),
            "tau": [asdict(r) for r in card.tau]}


@friendly_errors
def models(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: the models and the drafters.")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Check every cached model's files against the full sha256 its marker records (reads every byte; a plain load only checks sizes and sampled hashes); a cache that fails is rebuilt from its GGUF parts.")] = False,
) -> None:
    """List the embedded model aliases usable as --target/--draft, and the drafters shipped for them, offline."""
    if verify:
        verify_caches()
    rows = [model_status(alias) for alias in EMBEDDED_MODELS]
    cards = drafter_cards(DRAFTERS)
    if as_json:
        print(json.dumps({"models": [{"alias": s.alias, "model": s.hf_name, "installed": s.installed,
                                      "cached": s.cached, "gguf_bytes": s.gguf_size, "cache_bytes": s.cache_size,
                                      "cache_path": str(s.cache_path), "licence": EMBEDDED_MODELS[s.alias].licence,
                                      "install": s.pip_hint} for s in rows],
                          "drafters": [_drafter_row(c) for c in cards]}))
        return
    table = Table(title="Embedded models (use the alias as --target / --draft; * = default target)")
    table.add_column("alias", no_wrap=True)
    table.add_column("model")
    for col in ("installed", "cached", "GGUF", "cache"):
        table.add_column(col, no_wrap=True)
    for s in rows:
        alias = s.alias + (" *" if s.alias == DEFAULT_TARGET else "")
        table.add_row(alias, s.hf_name, "yes" if s.installed else "no", "yes" if s.cached else "no",
                      _mb(s.gguf_size), _mb(s.cache_size))
    console = Console()
    console.print(table)
    for s in rows:
        console.print(f"[dim]{s.alias}: {EMBEDDED_MODELS[s.alias].licence}[/]", highlight=False)
    for s in rows:
        if not s.installed:
            console.print(f"[dim]{s.alias}: {s.pip_hint}[/]", highlight=False)
    if cards:
        drafters = Table(title="Shipped drafters (the default block drafter of the target alias they are named for)")
        for col in ("alias", "kind", "block", "draft vocab", "measured tau (model card)"):
            drafters.add_column(col, no_wrap=col != "measured tau (model card)")
        for c in cards:
            drafters.add_row(c.alias, _kind(c), str(c.block_size or "-"),
                             f"{c.draft_vocab:,}" if c.draft_vocab else "all", _tau(c))
        console.print(drafters)


def verify_caches() -> None:
    """Full check of every built cache; one line per cache on stderr (rebuilt ones say why)."""
    for alias in EMBEDDED_MODELS:
        folder = cache_path(alias)
        if not (folder / MARKER).exists():
            continue
        notes: list[str] = []
        ensure_cached(alias, full_check=True, notice=notes.append)
        for note in notes:
            err_console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
        state = "rebuilt" if notes else "verified"
        err_console.print(f"{alias}: {state} ({folder})", highlight=False, soft_wrap=True)
