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
app.command()(__import__("cure_cli.bench_cmd", fromlist=["bench"]).bench)
app.command()(__import__("cure_cli.analyze_cmd", fromlist=["analyze"]).analyze)
app.command("chat")(__import__("cure_cli.chat_cmd", fromlist=["chat"]).chat)
app.command("inspect")(__import__("cure_cli.inspect_cmd", fromlist=["inspect"]).inspect)

if __name__ == "__main__":
    app()
