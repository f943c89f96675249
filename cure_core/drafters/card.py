"""A drafter's machine-readable card: `drafter.json` beside its MODEL_CARD.md.

`cure train-drafter` writes it (kind, block size, draft vocabulary, every training stretch, the tau its
final eval measured); measured rows from `cure bench` runs are added to `tau` by hand, with the command
in `source`. `cure models` reads it, so no tool ever parses the card's prose.

    {"target": "qwen-coder-1.5b", "kind": "pard", "base": "qwen-coder-0.5b", "block_size": 8,
     "draft_vocab": null, "layers": null,
     "training": {"steps": 1200, "minutes": 95.3, "stretches": [{"start_step": 0, ...}, ...]},
     "tau": [{"prompts": "humaneval 21-40", "strategy": "cure", "k": 8, "tau": 3.1, "source": "..."}]}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

CARD_JSON = "drafter.json"


@dataclass
class TauRow:
    prompts: str                # which held-out prompts, e.g. "humaneval 21-40 (raw)"
    strategy: str               # parallel | cure | ddtree | sd
    k: int
    tau: float
    source: str = ""            # the command or results file that measured it


@dataclass
class DrafterCard:
    alias: str                  # the folder name under assets/drafters: the target alias it drafts for
    target: str
    kind: str                   # dflash | pard
    block_size: int | None
    draft_vocab: int | None     # ids a proposal ranks (None: the whole vocabulary)
    base: str | None = None     # adapted drafters: the base model the delta applies to
    layers: int | None = None
    steps: int | None = None
    minutes: float | None = None
    tau: list[TauRow] = field(default_factory=list)


def read_card(folder: str | Path) -> DrafterCard | None:
    """The card of a drafter folder, or None when it has no drafter.json."""
    folder = Path(folder)
    try:
        d = json.loads((folder / CARD_JSON).read_text())
    except (OSError, ValueError):
        return None
    tr = d.get("training") or {}
    return DrafterCard(alias=folder.name, target=str(d.get("target", folder.name)), kind=str(d.get("kind", "?")),
                       block_size=d.get("block_size"), draft_vocab=d.get("draft_vocab"), base=d.get("base"),
                       layers=d.get("layers"), steps=tr.get("steps"), minutes=tr.get("minutes"),
                       tau=[TauRow(**r) for r in d.get("tau", [])])


def drafter_cards(root: str | Path) -> list[DrafterCard]:
    """Every drafter folder under `root` (assets/drafters) that carries a card, by alias."""
    root = Path(root)
    if not root.is_dir():
        return []
    cards = (read_card(f) for f in sorted(root.iterdir()) if f.is_dir())
    return [c for c in cards if c is not None]
