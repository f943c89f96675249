"""The `cure` command: one Typer app, one module per command."""
from __future__ import annotations

import typer

from .generate import generate
from .models_cmd import models

app = typer.Typer(
    name="cure",
    help="CURE: lossless block-parallel speculative decoding with local uncertainty repair.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(generate)
app.command()(models)

if __name__ == "__main__":
    app()
