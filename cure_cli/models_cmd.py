"""`cure models`: the embedded aliases, whether each is installed and cached, sizes, licences."""
from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cure_core.embedded import DEFAULT_TARGET, EMBEDDED_MODELS, MARKER, cache_path, ensure_cached, model_status

from .common import err_console, friendly_errors


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n else "-"


@friendly_errors
def models(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Check every cached model's files against the full sha256 its marker records (reads every byte; a plain load only checks sizes and sampled hashes); a cache that fails is rebuilt from its GGUF parts.")] = False,
) -> None:
    """List the embedded model aliases usable as --target/--draft, offline."""
    if verify:
        verify_caches()
    rows = [model_status(alias) for alias in EMBEDDED_MODELS]
    if as_json:
        print(json.dumps([{"alias": s.alias, "model": s.hf_name, "installed": s.installed, "cached": s.cached,
                           "gguf_bytes": s.gguf_size, "cache_bytes": s.cache_size,
                           "cache_path": str(s.cache_path), "licence": EMBEDDED_MODELS[s.alias].licence,
                           "install": s.pip_hint} for s in rows]))
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
