"""What the benchmark scripts share: the common flags, the JSON report's write and the end of `main()`.

A script declares only its own flags; the shared ones come from here, so each means the same everywhere:

    --threads N     torch threads (checked >= 1; `set_threads` applies it)
    --json OUT      where the report goes (its folder is made before the run and checked writable;
                    written whole or not at all); `--out` is the same flag, as the timing scripts named it
    --tiny          in-process tiny random models (a smoke run)
    --sets, --limit the prompt sets (`cure_tasks.load_set` specs) and the prompts per set

`entry(main)` is every script's `__main__` tail: bad input (a CureError) prints one line and exits 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from cure_core.errors import CureError
from cure_core.files import atomic_write_json


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An ArgumentParser headed by the script's docstring, its layout kept."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_threads(ap: argparse.ArgumentParser, default: int | None = None) -> None:
    ap.add_argument("--threads", type=int, default=default,
                    help="torch threads" + (f" (default {default})" if default is not None else " (default: torch's)"))


def add_json(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", "--out", dest="json", default=None, metavar="OUT.json",
                    help="write the report here (its folder is made; written whole or not at all)")


def add_tiny(ap: argparse.ArgumentParser, help: str = "in-process tiny random models (a smoke run)") -> None:
    ap.add_argument("--tiny", action="store_true", help=help)


def add_sets(ap: argparse.ArgumentParser, default: str, limit: int = 20) -> None:
    ap.add_argument("--sets", default=default,
                    help="comma list: humaneval, gsm8k, mbpp, lcb-lite, TASK@N (skip its first N: held-out ranges, "
                         "e.g. humaneval@20), or a prompts .jsonl file (cure bench --prompts format)")
    ap.add_argument("--limit", type=int, default=limit, help="prompts per set")


def timing_parser(doc: str | None) -> argparse.ArgumentParser:
    """The flags a one-model timing script shares (cpu_kernels.py, prefill.py): --tiny, --reps, --threads,
    --json and the target."""
    from cure_core.options import EngineArgs
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    add_tiny(ap, help="a tiny random model built in-process")
    ap.add_argument("--reps", type=int, default=5)
    add_threads(ap)
    add_json(ap)
    EngineArgs.add_cli_args(ap, only=("target",))
    return ap


def check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The shared flags' own checks, as `ap.error` (one line, exit 2): --threads and --limit >= 1, and the
    --json path writable before the run (an hour of generations must not end in a failed write)."""
    if getattr(args, "threads", None) is not None and args.threads < 1:
        ap.error("--threads must be >= 1")
    if getattr(args, "limit", None) is not None and args.limit < 1:
        ap.error("--limit must be >= 1")
    if getattr(args, "json", None):
        out = Path(args.json)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            ap.error(f"--json {args.json}: cannot make its folder ({e.strerror})")
        if out.is_dir() or not os.access(out.parent, os.W_OK):
            ap.error(f"--json {args.json}: not a writable file path")
    return args


def set_threads(threads: int | None) -> int:
    """Apply --threads (None: torch's default) and return the count torch runs with."""
    import torch
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages (None where the OS has none): every report records the box's load."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def write_json(path: str | os.PathLike | None, report, indent: int = 2, say: Callable[[str], None] | None = print):
    """The report at `path`, whole or not at all (cure_core/files.py); nothing without a path. Returns it."""
    if path:
        atomic_write_json(path, report, indent=indent)
        if say is not None:
            say(f"wrote {path}")
    return report


def entry(main: Callable[[], object]) -> None:
    """A script's `__main__` tail: run `main()`; bad input (CureError) is one line on stderr and exit 2."""
    try:
        main()
    except CureError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
