"""Error types the CLI turns into one clear line (no traceback)."""


class CureError(Exception):
    """Base for every error caused by the user's input or environment, not by a bug."""


class ModelLoadError(CureError):
    """Unknown model, unreadable checkpoint, tokenizer/vocabulary mismatch."""


class TraceError(CureError):
    """A missing, corrupt, truncated or newer-schema trace file."""
