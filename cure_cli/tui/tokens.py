"""Token ids -> readable text, for tree cells (one token, escaped) and streamed answers (incremental).

Works with any tokenizer: byte-level BPE (GPT-2 / Qwen / the tiny byte tokenizer) and SentencePiece
byte fallback (`<0xNN>`) map tokens to their exact bytes, so a multi-byte character split across
tokens is shown once complete, and bytes that are not valid UTF-8 show as `\\xNN` instead of `?`.
With no tokenizer at all (a trace opened without its model) tokens show as their ids: `<154>`.
"""
from __future__ import annotations

import codecs
import re
import unicodedata
from typing import Iterable

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode table (byte-level BPE token strings -> bytes)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def clean_text(text: str) -> str:
    """Answer text safe to paint in a terminal: newlines and tabs kept, other control chars escaped."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in "\n\t" or unicodedata.category(ch) != "Cc":
            out.append(ch)
        else:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
    return "".join(out)


def escape_token(text: str) -> str:
    """One token as a tree cell: newline/tab/control chars escaped, spaces made visible."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch == " ":
            out.append("␣")
        elif 0xDC80 <= ord(ch) <= 0xDCFF:            # a byte that is not UTF-8 (surrogateescape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out) or "∅"


class TokenText:
    """Readable text for token ids under one tokenizer (or none)."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self._bytes: dict[int, bytes | None] = {}
        self._labels: dict[int, str] = {}
        self.special_ids: set[int] = set()
        self._mode = "ids"
        if tokenizer is None:
            return
        self.special_ids = set(getattr(tokenizer, "all_special_ids", None) or [])
        for tid, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(added, "special", False):
                self.special_ids.add(int(tid))
        self._byte_dec = _byte_decoder()
        try:
            probe = "".join(tokenizer.convert_ids_to_tokens(tokenizer.encode(" a\n", add_special_tokens=False)))
        except Exception:  # noqa: BLE001 - any odd tokenizer: fall back to decode()
            probe = ""
        if "Ġ" in probe or "Ċ" in probe:
            self._mode = "bytelevel"
        else:
            self._mode = "sentencepiece" if "▁" in probe else "decode"

    @property
    def has_tokenizer(self) -> bool:
        return self.tokenizer is not None

    def special_name(self, tid: int) -> str | None:
        if tid not in self.special_ids or self.tokenizer is None:
            return None
        return str(self.tokenizer.convert_ids_to_tokens(tid))

    def token_bytes(self, tid: int) -> bytes | None:
        """The exact bytes of one token; None for specials, unknown ids, or no tokenizer."""
        tid = int(tid)
        if tid in self._bytes:
            return self._bytes[tid]
        out: bytes | None = None
        tok = self.tokenizer
        if tok is not None and tid not in self.special_ids:
            try:
                piece = tok.convert_ids_to_tokens(tid)
            except Exception:  # noqa: BLE001
                piece = None
            if isinstance(piece, str):
                m = _BYTE_FALLBACK.fullmatch(piece)
                if m:
                    out = bytes([int(m.group(1), 16)])
                elif self._mode == "bytelevel" and all(c in self._byte_dec for c in piece):
                    out = bytes(self._byte_dec[c] for c in piece)
                elif self._mode == "sentencepiece":
                    out = piece.replace("▁", " ").encode("utf-8")
                else:
                    try:
                        out = tok.decode([tid]).encode("utf-8")
                    except Exception:  # noqa: BLE001
                        out = None
        self._bytes[tid] = out
        return out

    def label(self, tid: int, width: int | None = None) -> str:
        """One token as a short readable cell: `␣the`, `\\n`, `\\x9a`, `<|im_end|>`, `<154>` (no tokenizer)."""
        tid = int(tid)
        text = self._labels.get(tid)
        if text is None:
            special = self.special_name(tid)
            data = self.token_bytes(tid)
            if special is not None:
                text = special
            elif data is None:
                text = f"<{tid}>"
            else:
                text = escape_token(data.decode("utf-8", errors="surrogateescape"))
            self._labels[tid] = text
        if width is not None and len(text) > width:
            text = text[: max(1, width - 1)] + "…"
        return text

    def stream(self) -> "PieceStream":
        return PieceStream(self)

    def decode(self, ids: Iterable[int]) -> str:
        """Whole text (specials dropped) — what goes back into the chat history."""
        ids = [int(t) for t in ids]
        if self.tokenizer is None:
            return "".join(f"<{t}>" for t in ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def display(self, ids: Iterable[int]) -> str:
        s = self.stream()
        return "".join(s.push(t) for t in ids) + s.flush()


class PieceStream:
    """Incremental display text: push(token) -> the text that token completes (maybe empty while a
    multi-byte character is still incomplete; invalid bytes come out as `\\xNN`)."""

    def __init__(self, tokens: TokenText):
        self.tokens = tokens
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def push(self, tid: int) -> str:
        tid = int(tid)
        if not self.tokens.has_tokenizer:
            return f"<{tid}>"
        if tid in self.tokens.special_ids:
            return self.flush()
        data = self.tokens.token_bytes(tid)
        if data is None:
            return self.flush() + f"<{tid}>"
        return clean_text(self._dec.decode(data))

    def flush(self) -> str:
        return clean_text(self._dec.decode(b"", final=True))
