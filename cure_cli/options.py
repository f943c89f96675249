"""The engine flags on Typer commands, generated from cure_core.options.EngineArgs (declared there once).

    @engine_options(exclude=("strategy",))
    def bench(dataset: ..., *, args: EngineArgs) -> None: ...

The decorator gives the command one keyword-only parameter per EngineArgs field (flag, help and
default from the field) and hands the command the filled-in `EngineArgs` as `args`.
"""
from __future__ import annotations

import functools
import inspect
import re
from dataclasses import fields
from typing import Annotated, Optional

import typer

from cure_core.options import EngineArgs

_KINDS = {"int": int, "float": float, "str": str, "bool": bool}


def _annotation(f) -> object:
    meta = f.metadata
    kind = meta["kind"] or _KINDS.get(str(f.type).split(" ")[0], str)
    optional = "None" in str(f.type)
    lo, hi = meta["bounds"] or (None, None)
    option = typer.Option(*meta["flags"], help=meta["help"], metavar=meta["metavar"], show_default=True,
                          min=lo, max=hi)
    return Annotated[Optional[kind] if optional else kind, option]


def engine_option(name: str) -> object:
    """One EngineArgs field as a Typer annotation, for a command that takes that option alone."""
    return _annotation(EngineArgs.__dataclass_fields__[name])


def engine_options(exclude: tuple[str, ...] = (), only: tuple[str, ...] | None = None, **defaults):
    """Add every EngineArgs field (those in `only`, if given; never those in `exclude`) to a command as an
    option; `defaults` override ours."""
    def wrap(command):
        own = inspect.signature(command, eval_str=True)
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values() if p.name != "args"]
        taken = {p.name for p in params}
        engine = [f for f in fields(EngineArgs) if f.name not in exclude and f.name not in taken
                  and (only is None or f.name in only)]
        for f in engine:
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                            default=defaults.get(f.name, f.default), annotation=_annotation(f)))
        names = {f.name for f in engine}

        @functools.wraps(command)
        def run(**kwargs):
            values = {n: kwargs.pop(n) for n in list(kwargs) if n in names}
            return command(**kwargs, args=EngineArgs(**{**defaults, **values}))
        run.__signature__ = own.replace(parameters=params)
        return run
    return wrap


def with_flags(message: str) -> str:
    """A core error names config fields in backticks (`v_max`, `chat`=False); show the CLI's flags."""
    flags = EngineArgs.flags()
    switches = EngineArgs.switches()

    def sub(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        if name in switches and value in ("True", "False"):
            return switches[name][0 if value == "True" else 1]     # `chat`=False -> --raw
        if name not in flags:
            return m.group(0)                       # not an engine option: leave it as written
        return flags[name] if value is None else f"{flags[name]} {value}"
    return re.sub(r"`([a-z_]+)`(?:=(\w+))?", sub, message)
