"""Saved chats: every `cure chat` conversation, kept as it goes, resumable and exportable.

One JSON file per conversation under the user data directory (platformdirs; $CURE_DATA overrides it):

    <data>/chats/<id>.json    turns (prompt, answer, strategy, config, status, per-turn stats, comparisons),
                              the history as sent, settings, thinking, models, the trace path
    <data>/chats/<id>.jsonl   the session's trace (every block, for `cure inspect`)

Rule: both are written whole, to a temporary file renamed into place (os.replace), after every turn; so a
crash loses at most the turn in progress and a reader never sees half a file.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from cure_core.block import Block
from cure_core.errors import CureError
from cure_core.files import atomic_write_text
from cure_core.metrics import summarize

SCHEMA = 1
DATA_ENV = "CURE_DATA"
# The EngineArgs fields that name the models: a resumed chat loads the same ones unless told otherwise.
MODEL_FIELDS = ("target", "draft", "drafter", "mask_token_id", "ar_draft", "chat", "thinking")


class SessionError(CureError, ValueError):
    """A saved chat that cannot be found or read."""


def sessions_dir() -> Path:
    """Where chats are saved: $CURE_DATA/chats, else the platform's user data directory."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env) / "chats"
    import platformdirs
    return Path(platformdirs.user_data_dir("cure")) / "chats"


def new_id() -> str:
    """Sortable by start time, unique across two chats started in the same second."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def turn_stats(blocks: Sequence[Block]) -> dict:
    """Per-turn numbers kept with the chat (the Stats panel's, and the Markdown export's)."""
    s = summarize(blocks)
    first = blocks[0].timings if blocks else None
    return {"tokens": s.new_tokens, "blocks": s.blocks, "tau": round(s.tau, 4),
            "tokens_per_s": round(s.tokens_per_s, 3), "mean_tree_size": round(s.mean_tree_size, 3),
            "prefill_ms": round(s.prefill_ms, 3), "prefill_tokens": first.prefill_tokens if first else 0,
            "reused_tokens": first.reused_tokens if first else 0}


@dataclass
class TurnRecord:
    prompt: str
    answer: str
    strategy: str
    config: dict                          # DecodeConfig.to_dict() the turn ran with
    status: str                           # done | stopped | error
    stats: dict = field(default_factory=dict)          # turn_stats()
    generation: int | None = None         # its generation in the session trace (None: no blocks)
    compare: list[dict] = field(default_factory=list)  # re-runs with other strategies: strategy, stats, identical
    edited: bool = False                  # replaced by an edited prompt (no longer in the history)
    error: str | None = None


@dataclass
class ChatSession:
    id: str
    dir: Path
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    updated: str = ""
    models: dict = field(default_factory=dict)      # trace header names: target / draft / ar_draft
    engine: dict = field(default_factory=dict)      # MODEL_FIELDS of the EngineArgs it was opened with
    settings: dict = field(default_factory=dict)    # the DecodeConfig in effect (the next turn's)
    thinking: bool | None = None
    turns: list[TurnRecord] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)   # the history as the model sees it

    @property
    def path(self) -> Path:
        return self.dir / f"{self.id}.json"

    @property
    def trace_path(self) -> Path:
        return self.dir / f"{self.id}.jsonl"

    @property
    def title(self) -> str:
        first = next((t.prompt for t in self.turns if not t.edited), self.turns[0].prompt if self.turns else "")
        line = " ".join(first.split())
        return line if len(line) <= 60 else line[:59] + "…"

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "id": self.id, "created": self.created, "updated": self.updated,
                "models": self.models, "engine": self.engine, "settings": self.settings, "thinking": self.thinking,
                "trace": str(self.trace_path) if self.trace_path.exists() else None,
                "turns": [asdict(t) for t in self.turns], "messages": self.messages}

    def save(self) -> Path:
        self.updated = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return atomic_write_text(self.path, json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n")

    @staticmethod
    def load(path: Path) -> "ChatSession":
        """The chat saved at ``path``; SessionError (one line) unless every field has its saved type."""
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except RecursionError:
            raise SessionError(f"cannot read the saved chat {path}: JSON nested too deeply") from None
        except (OSError, ValueError) as e:
            raise SessionError(f"cannot read the saved chat {path}: {type(e).__name__}: {e}") from None
        try:
            return ChatSession._from_dict(d, path)
        except (ValueError, TypeError) as e:
            raise SessionError(f"cannot read the saved chat {path}: {e}") from None

    @staticmethod
    def _from_dict(d, path: Path) -> "ChatSession":
        if not isinstance(d, dict) or "id" not in d:
            raise ValueError("not a saved chat")
        schema = d.get("schema", 0)
        if type(schema) is not int:
            raise ValueError(f"its schema is not an integer: {_show(schema)}")
        if schema > SCHEMA:
            raise SessionError(f"{path} was saved by a newer cure (chat schema {schema}): upgrade to open it")
        # Rule: the ID names the files the chat is saved to on resume, so it is a plain file name.
        cid = _typed(d["id"], str, "id")
        if not _ID_RE.fullmatch(cid):
            raise ValueError(f"its id is not a plain name: {_show(cid)}")
        engine = _typed(d.get("engine") or {}, dict, "engine")
        if not all(v is None or type(v) in (str, int, float, bool) for v in engine.values()):
            raise ValueError("'engine' holds a value that is not plain text, a number or a bool")
        return ChatSession(
            id=cid, dir=path.parent, created=_typed(d.get("created", ""), str, "created"),
            updated=_typed(d.get("updated", ""), str, "updated"),
            models=_typed(d.get("models") or {}, dict, "models"), engine=engine,
            settings=_typed(d.get("settings") or {}, dict, "settings"),
            thinking=_typed(d.get("thinking"), (bool, type(None)), "thinking"),
            turns=[_turn(t, i) for i, t in enumerate(_typed(d.get("turns") or [], list, "turns"))],
            messages=[_typed(m, dict, "a message") for m in _typed(d.get("messages") or [], list, "messages")])


_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_TURN_TYPES = {"prompt": str, "answer": str, "strategy": str, "config": dict, "status": str, "stats": dict,
               "generation": (int, type(None)), "compare": list, "edited": bool, "error": (str, type(None))}


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _typed(value, kind, what: str):
    """``value`` if its type is exactly ``kind`` (or one of them; a bool is not an int), else ValueError."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if type(value) not in kinds:
        raise ValueError(f"{what!r} is not a {' or '.join(k.__name__ for k in kinds)}: {_show(value)}")
    return value


def _stats(value, what: str) -> dict:
    stats = _typed(value, dict, what)
    if not all(type(v) in (int, float) for v in stats.values()):
        raise ValueError(f"{what!r} holds a value that is not a number")
    return stats


def _turn(t, i: int) -> TurnRecord:
    where = f"turn {i}"
    _typed(t, dict, where)
    unknown = set(t) - set(_TURN_TYPES)
    if unknown:
        raise ValueError(f"{where} has unknown fields {sorted(unknown)[:3]}")
    fields = {k: _typed(v, _TURN_TYPES[k], f"{where} {k}") for k, v in t.items()}
    if "stats" in fields:
        _stats(fields["stats"], f"{where} stats")
    for c in fields.get("compare", []):
        _typed(c, dict, f"{where} compare")
        _typed(c.get("strategy"), str, f"{where} compare strategy")
        _stats(c.get("stats") or {}, f"{where} compare stats")
    return TurnRecord(**fields)


def list_sessions(folder: Path | None = None, *, warn=None) -> list[ChatSession]:
    """Every readable saved chat, the most recently updated first. A file that cannot be read is skipped
    with one line (``warn(path, why)``; default: a warning line to stderr), so one bad file never hides the
    others."""
    folder = folder or sessions_dir()
    warn = warn or (lambda path, why: print(f"warning: skipped a saved chat: {why}", file=sys.stderr))
    out = []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            out.append(ChatSession.load(p))
        except SessionError as e:
            warn(p, str(e))
    return sorted(out, key=lambda s: (s.updated, s.id), reverse=True)


def find_session(ref: str | None, folder: Path | None = None) -> ChatSession:
    """A saved chat by ID or the start of one; None: the latest (of the readable ones). A file that cannot
    be read is named only when ``ref`` names it (its one line is the error)."""
    folder = folder or sessions_dir()
    unreadable: dict[str, str] = {}
    sessions = list_sessions(folder, warn=lambda path, why: unreadable.__setitem__(path.stem, why))
    if ref is not None and not any(s.id.startswith(ref) for s in sessions):
        named = [why for stem, why in unreadable.items() if stem.startswith(ref)]
        if len(named) == 1:
            raise SessionError(named[0])
    if not sessions:
        raise SessionError(f"no saved chats in {folder}")
    if ref is None:
        return sessions[0]
    exact = [s for s in sessions if s.id == ref]
    found = exact or [s for s in sessions if s.id.startswith(ref)]
    if not found:
        raise SessionError(f"no saved chat {ref!r} (see `cure chat --list`)")
    if len(found) > 1:
        raise SessionError(f"{ref!r} names {len(found)} saved chats ({', '.join(s.id for s in found[:3])}…): "
                           f"give more of the ID")
    return found[0]


def _stats_line(strategy: str, st: dict) -> str:
    if not all(k in st for k in ("tau", "tokens_per_s", "tokens", "mean_tree_size", "prefill_ms",
                                 "prefill_tokens", "reused_tokens")):
        return strategy
    return (f"{strategy} · τ {st['tau']:.2f} · {st['tokens_per_s']:.1f} tok/s · {st['tokens']} tokens · "
            f"mean tree {st['mean_tree_size']:.1f} · prefill {st['prefill_ms']:.0f} ms "
            f"({st['prefill_tokens']} new, {st['reused_tokens']} cached)")


def closed_fences(text: str) -> str:
    """An answer cut at its token limit can end inside a ``` code block: close it, so the next heading of
    the export is not swallowed by the block."""
    fences = sum(1 for line in text.splitlines() if line.lstrip().startswith(("```", "~~~")))
    return text + ("\n```" if fences % 2 else "")


def to_markdown(session: ChatSession) -> str:
    """The conversation as Markdown: every turn with its strategy, tau and tok/s, and its comparisons."""
    models = session.models
    pair = (models.get("target") or "?") + (f" ← {models['draft']}" if models.get("draft") else "")
    thinking = {True: "on", False: "off", None: "the template's default"}[session.thinking]
    lines = [f"# cure chat {session.id}", "",
             f"- models: {pair}", f"- thinking: {thinking}", f"- started: {session.created}", ""]
    for n, t in enumerate(session.turns, start=1):
        mark = " (edited away)" if t.edited else ""
        lines += [f"## Turn {n}{mark}", "", f"*{_stats_line(t.strategy, t.stats)}*"
                  + (f" · {t.status}" if t.status != "done" else ""), "", "**You:**", "", t.prompt, "",
                  "**cure:**", "", closed_fences(t.answer) or "*(no answer)*", ""]
        if t.error:
            lines += [f"> error: {t.error}", ""]
        for c in t.compare:
            same = "identical output" if c.get("identical") else "different output"
            lines += [f"> compared: *{_stats_line(c['strategy'], c.get('stats') or {})}* · {same}", ""]
    return "\n".join(lines).rstrip() + "\n"
