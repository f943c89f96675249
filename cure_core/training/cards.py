"""What `cure train-drafter` writes about a drafter: drafter.json (catalog.py) and the
training-stretches section of MODEL_CARD.md (between two markers; the rest of the card is prose a
person writes, and is kept as it is)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..catalog import CARD_JSON, TauRow
from ..files import atomic_write_json, atomic_write_text

CARD_MD = "MODEL_CARD.md"
BEGIN = "<!-- training stretches: written by cure train-drafter -->"
END = "<!-- end of training stretches -->"
EVAL_SOURCE = "cure train-drafter eval"


def stretches_markdown(stretches: list[dict]) -> str:
    rows = ["| stretch | steps | minutes | started | threads | stopped by |", "|---|---|---|---|---|---|"]
    for i, s in enumerate(stretches, 1):
        rows.append(f"| {i} | {s['start_step']}-{s['end_step']} | {s['minutes']:.1f} | {s['started']} | "
                    f"{s['threads']} | {s['stopped_by']} |")
    steps = sum(s["end_step"] - s["start_step"] for s in stretches)
    minutes = sum(s["minutes"] for s in stretches)
    rows.append(f"| total | {steps} | {minutes:.1f} | | | |")
    return "\n".join(rows)


def write_cards(out: Path, facts: dict, stretches: list[dict], eval_rows: list[TauRow]) -> None:
    """drafter.json = facts + training summary + tau rows (rows from earlier evals of this run are
    replaced, rows added by hand are kept); MODEL_CARD.md gets the stretches table."""
    out = Path(out)
    old_rows = []
    if (out / CARD_JSON).exists():
        old_rows = [r for r in json.loads((out / CARD_JSON).read_text()).get("tau", [])
                    if r.get("source") != EVAL_SOURCE]
    card = dict(facts, training={"steps": sum(s["end_step"] - s["start_step"] for s in stretches),
                                 "minutes": round(sum(s["minutes"] for s in stretches), 2),
                                 "stretches": stretches},
                tau=old_rows + [asdict(r) for r in eval_rows])
    atomic_write_json(out / CARD_JSON, card)
    section = f"{BEGIN}\n## Training stretches\n\n{stretches_markdown(stretches)}\n{END}"
    md = out / CARD_MD
    text = md.read_text() if md.exists() else f"# {facts['kind']} drafter for {facts['target']}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    atomic_write_text(md, text)
