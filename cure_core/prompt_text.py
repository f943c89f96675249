"""Prompt text must be valid Unicode before it reaches a tokenizer.

A command-line argument that is not valid UTF-8 reaches Python with its bad bytes as lone surrogates
(PEP 383: byte 0xff becomes U+DCFF), and a JSON file can spell a lone surrogate too; a fast tokenizer
then fails deep inside with a TypeError. `check_text` turns that into one clear error first.
"""
from __future__ import annotations

from .errors import CureError


class PromptError(CureError):
    """The prompt cannot be tokenized as given (not valid UTF-8 text)."""


def check_text(text: str, what: str = "the prompt") -> str:
    """``text`` unchanged when it encodes as UTF-8; otherwise a PromptError naming the first bad character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        # U+DC80..U+DCFF is how surrogateescape carries an undecodable byte (0x80..0xff).
        bad = f"byte 0x{ch - 0xDC00:02x}" if 0xDC80 <= ch <= 0xDCFF else f"a lone surrogate U+{ch:04X}"
        raise PromptError(f"{what} is not valid UTF-8 text ({bad} at character {e.start})") from None
    return text
