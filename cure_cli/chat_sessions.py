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
import secrets
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
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(d, dict) or "id" not in d:
                raise ValueError("not a saved chat")
            if int(d.get("schema", 0)) > SCHEMA:
                raise SessionError(f"{path} was saved by a newer cure (chat schema {d['schema']}): upgrade to open it")
            return ChatSession(id=str(d["id"]), dir=path.parent, created=d.get("created", ""),
                               updated=d.get("updated", ""), models=dict(d.get("models") or {}),
                               engine=dict(d.get("engine") or {}), settings=dict(d.get("settings") or {}),
                               thinking=d.get("thinking"), turns=[TurnRecord(**t) for t in d.get("turns") or []],
                               messages=list(d.get("messages") or []))
        except SessionError:
            raise
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise SessionError(f"cannot read the saved chat {path}: {type(e).__name__}: {e}") from None


def list_sessions(folder: Path | None = None) -> list[ChatSession]:
    """Every readable saved chat, the most recently updated first (unreadable files are skipped)."""
    folder = folder or sessions_dir()
    out = []
    for p in folder.glob("*.json") if folder.is_dir() else ():
        try:
            out.append(ChatSession.load(p))
        except SessionError:
            continue
    return sorted(out, key=lambda s: (s.updated, s.id), reverse=True)


def find_session(ref: str | None, folder: Path | None = None) -> ChatSession:
    """A saved chat by ID or the start of one; None: the latest."""
    folder = folder or sessions_dir()
    sessions = list_sessions(folder)
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
    if not st:
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
