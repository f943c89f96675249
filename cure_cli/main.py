"""The `cure` command: one Typer app, one module per command."""
from __future__ import annotations

import typer

from .analyze_cmd import analyze
from .bench_cmd import bench
from .chat_cmd import chat
from .export_cmd import export_vllm
from .generate import generate
from .inspect_cmd import inspect
from .models_cmd import models
from .train_cmd import train_drafter

app = typer.Typer(
    name="cure",
    help="CURE: lossless block-parallel speculative decoding with local uncertainty repair.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(generate)
app.command()(chat)
app.command()(bench)
app.command()(inspect)
app.command()(analyze)
app.command()(models)
app.command("train-drafter")(train_drafter)
app.command("export-vllm")(export_vllm)

if __name__ == "__main__":
    app()
