"""`cure export-vllm DRAFTER OUT`: a drafter folder that vLLM's speculative decoding loads as is."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import err_console, friendly_errors, quiet_transformers


@friendly_errors
def export_vllm(
    drafter: Annotated[str, typer.Argument(help="The drafter checkpoint: a folder (e.g. from `cure train-drafter`) or an embedded alias.")],
    out: Annotated[Path, typer.Argument(help="The folder to write (must not exist, or be empty, unless --overwrite).")],
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="The drafter's target (folder or alias): gives the export its own draft head over the ids our drafter may propose (never the mask). Default: the target named in the drafter's drafter.json.")] = None,
    shared_head: Annotated[bool, typer.Option("--shared-head", help="Write no draft head: the drafter shares the target's whole lm_head in vLLM (which may then propose the mask token).")] = False,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="Weights' dtype in OUT: float32, float16, bfloat16. Default: the checkpoint's.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT if it already holds files.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")] = False,
) -> None:
    """Export a drafter for vLLM: a DFlash drafter becomes a folder for vLLM's `dflash` speculative method.

    Serve it with: vllm serve TARGET --speculative-config '{"method": "dflash", "model": OUT,
    "num_speculative_tokens": K-1}' (K: the drafter's trained block size; the command prints the exact line).
    Drafter kinds with no vLLM equivalent (PARD, AR) are refused.
    """
    quiet_transformers()
    from cure_core.vllm_export import export_vllm as export

    result = export(drafter, out, dtype=dtype, overwrite=overwrite, target=target,
                    shared_head=shared_head)
    if as_json:
        print(json.dumps({"out": str(result.out), "kind": result.kind, "block_size": result.block_size,
                          "dtype": result.dtype, "target_layer_ids": result.target_layer_ids,
                          "mask_token_id": result.mask_token_id, "head_from": result.head,
                          "speculative_config": result.speculative_config(), "notes": result.notes}))
        return
    for note in result.notes:
        err_console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    print(f"wrote {result.out} ({result.kind}, block size {result.block_size}, {result.dtype})")
    print(f"serve: {result.serve_command()}")
