"""Thinking mode: the `enable_thinking` switch of Qwen3-style chat templates, chosen once per load.

Why it matters: a drafter learns the target's outputs in one mode. The published DFlash-b16 drafters
were trained without thinking while Qwen3's template thinks by default; with the two mismatched,
users of the reference report acceptance falling from about 60% to 25% (z-lab/dflash issue 133).

Rules (`choose_thinking`, called by api.open_pair):
- the switch exists when the template's source names `enable_thinking` (`template_has_switch`);
- default: what the drafter declares (its config, else its model card); with no declaration, off for a
  DFlash drafter (the published ones are non-thinking), else None: the template's own default;
- one warning line when a choice contradicts the drafter's declaration (or the DFlash default), and
  when thinking is asked for but the template has no switch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .checkpoints import draft_folder_config

CONFIG_KEYS = ("enable_thinking", "thinking")     # looked up in dflash_config first, then at the top level
CARD_FILES = ("README.md", "MODEL_CARD.md")
_CARD_SWITCH = re.compile(r"enable_thinking\W{0,3}\s*[=:]\s*[\"']?(true|false)\b", re.IGNORECASE)
_CARD_OFF = re.compile(r"\bnon-thinking\b|\bwithout thinking\b|\bthinking (?:mode )?(?:disabled|off)\b", re.IGNORECASE)
_CARD_ON = re.compile(r"\b(?:trained|distilled) (?:on|with) thinking\b|\bthinking (?:mode )?enabled\b", re.IGNORECASE)


@dataclass(frozen=True)
class Declared:
    value: bool                   # the mode the drafter was trained in
    source: str                   # where that is said, for the warning ("its config (enable_thinking)")


def template_has_switch(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads `enable_thinking` (Qwen3 and its kin do)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):                  # named templates: any of them
        template = " ".join(str(t) for t in template.values())
    return bool(template) and "enable_thinking" in str(template)


def declared_in_config(config: dict | None) -> Declared | None:
    if not config:
        return None
    for where, section in (("dflash_config.", config.get("dflash_config") or {}), ("", config)):
        for key in CONFIG_KEYS:
            value = section.get(key) if isinstance(section, dict) else None
            if isinstance(value, bool):
                return Declared(value, f"its config ({where}{key}: {str(value).lower()})")
    return None


def declared_in_card(text: str | None) -> Declared | None:
    """The mode a model card states: explicit `enable_thinking=...` settings first, else wording such as
    "non-thinking"; None when it says nothing or both."""
    if not text:
        return None
    switches = {m.group(1).lower() == "true" for m in _CARD_SWITCH.finditer(text)}
    if len(switches) == 1:
        value = switches.pop()
        return Declared(value, f"its model card (enable_thinking={value})")
    if switches:
        return None
    off, on = bool(_CARD_OFF.search(text)), bool(_CARD_ON.search(text))
    if off != on:
        return Declared(on, "its model card (" + ("thinking" if on else "non-thinking") + ")")
    return None


def declared_thinking(folder: str | Path | None, config: dict | None) -> Declared | None:
    """What a drafter checkpoint declares: its config, else the model card in its folder (README.md on the
    Hub; MODEL_CARD.md for the drafters shipped under assets/)."""
    found = declared_in_config(config)
    if found is not None or folder is None:
        return found
    for name in CARD_FILES:
        try:
            return declared_in_card((Path(folder) / name).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return None


def choose_thinking(requested: bool | None, drafter_kind: str | None, declared: Declared | None,
                    has_switch: bool) -> tuple[bool | None, list[str]]:
    """(the thinking mode to encode prompts with: True / False / None = the template's default,
    warning lines naming config fields in backticks)."""
    warnings: list[str] = []
    if not has_switch:
        if requested:
            warnings.append("the chat template has no thinking switch (`enable_thinking`): `thinking` has no effect")
        return None, warnings
    expected = declared
    if expected is None and drafter_kind == "dflash":
        expected = Declared(False, "no declaration; the published DFlash drafters were trained without thinking")
    if requested is None:
        return (expected.value if expected is not None else None), warnings
    if expected is not None and requested != expected.value:
        mode = "on" if requested else "off"
        trained = "with" if expected.value else "without"
        warnings.append(f"thinking {mode} contradicts the drafter ({expected.source}: trained {trained} thinking): "
                        f"expect far lower acceptance; `thinking`={expected.value} matches it")
    return requested, warnings


def drafter_declaration(draft: str | None) -> Declared | None:
    """The declaration of a draft checkpoint given by name (alias, folder, HF id in the local cache)."""
    if not draft:
        return None
    folder, config = draft_folder_config(draft)
    return declared_thinking(folder if config is not None else None, config)

