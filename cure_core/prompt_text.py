"""Prompt text must be valid Unicode before it reaches a tokenizer.

A command-line argument that is not valid UTF-8 reaches Python with its bad bytes as lone surrogates
(PEP 383: byte 0xff becomes U+DCFF), and a JSON file can spell a lone surrogate too; a fast tokenizer
then fails deep inside with a TypeError. `check_text` turns that into one clear error first and returns
a `CheckedText`, which later steps (models.encode_prompt) take as checked: a prompt is checked once.
"""
from __future__ import annotations

from .errors import CureError


class PromptError(CureError):
    """The prompt cannot be tokenized as given (not valid UTF-8 text)."""


class CheckedText(str):
    """Text that `check_text` found to encode as UTF-8."""


def check_text(text: str, what: str = "the prompt") -> CheckedText:
    """``text`` as a CheckedText when it encodes as UTF-8 (already one: as it is); otherwise a PromptError
    naming the first bad character."""
    if isinstance(text, CheckedText):
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        # U+DC80..U+DCFF is how surrogateescape carries an undecodable byte (0x80..0xff).
        bad = f"byte 0x{ch - 0xDC00:02x}" if 0xDC80 <= ch <= 0xDCFF else f"a lone surrogate U+{ch:04X}"
        raise PromptError(f"{what} is not valid UTF-8 text ({bad} at character {e.start})") from None
    return CheckedText(text)
