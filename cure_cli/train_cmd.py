"""`cure train-drafter`: train a DFlash or PARD drafter for a target, checkpointed, then evaluate it."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .common import LoggedProgress, err_console, friendly_errors, quiet_transformers
from .options import engine_option

Device = engine_option("device")
Target = engine_option("target")

console = Console()


class Bars:
    """progress_factory for cure_core.training.run: one rich task per phase."""

    def __init__(self, progress: Progress):
        self.p = progress

    def __call__(self, name: str, total: int, initial: int = 0):
        task = self.p.add_task(name, total=total, completed=initial, info="")

        def advance(n: int = 1, loss: float | None = None, acc=None):
            info = ""
            if loss is not None:
                info = f"loss {loss:.3f}"
                if acc is not None and len(acc) > 1:
                    info += "  acc@1 " + f"{acc[1]:.2f}"
            self.p.update(task, advance=n, info=info)
        return advance


def print_eval(ev: dict) -> None:
    t = Table(title=f"drafter vs target on {ev['prompts']} held-out prompts ({ev['eval_set']}, "
                    f"{ev['positions']} positions)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for j, v in ev["per_position_top1"].items():
        t.add_row(f"top-1 agreement, offset {j}", f"{100 * v:.1f}%")
    for j, v in ev["per_position_chain"].items():
        t.add_row(f"chain acceptance, offset {j}", f"{100 * v:.1f}%")
    for s, v in ev["tau"].items():
        t.add_row(f"tau K={ev['k']} ({s})", f"{v:.3f}")
    t.add_row("lossless (== ar)", "yes" if ev["lossless"] else "NO")
    console.print(t)


@friendly_errors
def train_drafter(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (drafter, checkpoints, features, eval.json).")],
    target: Target = None,
    kind: Annotated[str, typer.Option("--kind", help="dflash (conditioned on target hidden states) | pard (small causal LM with a mask token).")] = "dflash",
    corpus: Annotated[Optional[list[str]], typer.Option("--corpus", help="stdlib | self-distill | a text file or folder; repeatable.")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = 1000,
    block_size: Annotated[int, typer.Option("--block-size", help="Training block: anchor + block_size-1 masks.")] = 16,
    layers: Annotated[int, typer.Option("--layers", help="Draft decoder layers.")] = 1,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (warmup, then cosine to 10%).")] = 3e-4,
    batch: Annotated[int, typer.Option("--batch", help="Corpus chunks per step.")] = 2,
    anchors: Annotated[int, typer.Option("--anchors", help="Random anchors (blocks) per chunk.")] = 16,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per corpus chunk.")] = 256,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Corpus tokens to extract features for (0 = all).")] = 60000,
    distill_prompts: Annotated[int, typer.Option("--distill-prompts", help="self-distill: how many prompts the target answers.")] = 64,
    distill_tokens: Annotated[int, typer.Option("--distill-tokens", help="self-distill: target greedy tokens per prompt.")] = 128,
    distill_mix: Annotated[str, typer.Option("--distill-mix", help="self-distill prompts: code (stdlib function signatures + docstrings) | mixed (also code in several languages, explanations, chat requests, math word problems).")] = "code",
    distill_batch: Annotated[int, typer.Option("--distill-batch", help="self-distill: prompts per batched generate() call.", min=1)] = 16,
    labels: Annotated[str, typer.Option("--labels", help="target: the target's greedy tokens (self-distillation); text: the corpus tokens.")] = "target",
    loss_vocab: Annotated[int, typer.Option("--loss-vocab", help="Softmax over the N most frequent label ids plus the batch's labels (0 = full vocabulary).")] = 16384,
    draft_vocab: Annotated[int, typer.Option("--draft-vocab", help="dflash: save N ids (training labels by frequency, then the lowest ids) as the drafter's draft vocabulary: its head runs over those and the prompt's ids only (0 = the whole vocabulary).")] = 16384,
    gamma: Annotated[float, typer.Option("--gamma", help="Offset i weighs exp(-(i-1)/gamma) in the loss; 0 = equal.")] = 4.0,
    target_layers: Annotated[Optional[str], typer.Option("--target-layers", help="dflash: comma-separated target decoder layers to condition on (default: L/4, L/2, L-2).")] = None,
    dflash_init: Annotated[Optional[Path], typer.Option("--dflash-init", help="dflash: start from this DFlash drafter's weights (same --layers and --target-layers; e.g. the shipped one, to train a further version on new data) instead of a copy of the target's last layer.")] = None,
    adapter_init: Annotated[Optional[Path], typer.Option("--adapter-init", help="pard adapt: start from this adapter's LoRA factors and mask embedding (same base, --lora-rank and --lora-alpha; e.g. the shipped one, to train on new data) instead of a no-op adapter. Names the base when --pard-base is left out.")] = None,
    pard_init: Annotated[str, typer.Option("--pard-init", help="pard: shrink (the target with --layers layers) | scratch | adapt (LoRA + a mask embedding on --pard-base; saves only that delta).")] = "shrink",
    pard_base: Annotated[Optional[str], typer.Option("--pard-base", help="pard adapt: the causal LM to adapt (an embedded alias or folder sharing the target's tokenizer).")] = None,
    lora_rank: Annotated[int, typer.Option("--lora-rank", help="pard adapt: LoRA rank on every attention and MLP projection.")] = 8,
    lora_alpha: Annotated[float, typer.Option("--lora-alpha", help="pard adapt: LoRA scale is alpha / rank.")] = 16.0,
    pard_train_embeddings: Annotated[bool, typer.Option("--pard-train-embeddings/--pard-freeze-embeddings", help="pard shrink: also train the copied embedding and lm_head (about 136M parameters for Qwen2.5: each step costs several times more on a CPU). Frozen by default, as DFlash keeps the target's.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the split, the init and every batch.")] = 0,
    features_from: Annotated[Optional[list[Path]], typer.Option("--features-from", help="dflash: another run's features folder (OUT/features; repeatable): chunks it holds are copied instead of run through the target again, e.g. the old corpora of a further version.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from OUT/checkpoint (features are reused).")] = False,
    device: Device = "cpu",
    threads: Annotated[int, typer.Option("--threads", help="CPU threads (torch.set_num_threads).")] = 2,
    eval_prompts: Annotated[int, typer.Option("--eval-prompts", help="Held-out prompts for the final eval (0 = skip).")] = 4,
    eval_set: Annotated[str, typer.Option("--eval-set", help="humaneval | heldout (the corpus's held-out documents).")] = "humaneval",
    eval_new_tokens: Annotated[int, typer.Option("--eval-new-tokens", help="Greedy tokens per eval prompt.")] = 64,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Steps between checkpoints.")] = 100,
    max_minutes: Annotated[Optional[float], typer.Option("--max-minutes", help="Stop training after this many minutes (then save and evaluate); --resume continues.")] = None,
    publish: Annotated[Optional[Path], typer.Option("--publish", help="Copy the trained drafter and its cards (drafter.json, MODEL_CARD.md) to this folder, e.g. assets/drafters/<target alias>.")] = None,
):
    """Train a block-parallel drafter for TARGET (DFlash or PARD), with checkpoints, --resume and an eval."""
    import torch

    from cure_core.training.prepare import DataSpec
    from cure_core.training.run import RunOptions, run
    from cure_core.training.trainer import TrainSpec
    quiet_transformers()
    torch.set_num_threads(max(1, threads))
    try:
        ids = [int(x) for x in target_layers.split(",")] if target_layers else None
    except ValueError:
        raise ValueError(f"--target-layers must be comma-separated integers, got {target_layers!r}") from None
    spec = TrainSpec(kind=kind, steps=steps, block_size=block_size, layers=layers, lr=lr, batch=batch,
                     anchors=anchors, labels=labels, loss_vocab=loss_vocab, draft_vocab=draft_vocab, gamma=gamma, seed=seed,
                     checkpoint_every=checkpoint_every, max_minutes=max_minutes)
    data = DataSpec(corpus=list(corpus or ["stdlib"]), seq_len=seq_len, max_tokens=max_tokens or None, seed=seed,
                    distill_prompts=distill_prompts, distill_tokens=distill_tokens, distill_mix=distill_mix,
                    distill_batch=distill_batch)
    eval_texts = None
    if eval_set == "humaneval" and eval_prompts > 0:
        from cure_tasks import humaneval                    # the packaged HumanEval prompts
        eval_texts = [p.prompt for p in humaneval.load(limit=eval_prompts)]
    from cure_core.catalog import DEFAULT_TARGET
    opts = RunOptions(target=target or DEFAULT_TARGET, out=out, train=spec, data=data, device=device, layer_ids=ids,
                      dflash_init=dflash_init, features_from=list(features_from or []), pard_init=pard_init, pard_base=pard_base, adapter_init=adapter_init, lora_rank=lora_rank, lora_alpha=lora_alpha,
                      pard_train_embeddings=pard_train_embeddings, resume=resume, eval_prompts=eval_prompts,
                      eval_set=eval_set, eval_new_tokens=eval_new_tokens, eval_texts=eval_texts, publish=publish)
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
    with LoggedProgress(*cols, console=err_console, transient=False) as progress:
        result = run(opts, Bars(progress), log=lambda m: progress.console.print(m, highlight=False))
    tr = result["train"]
    console.print(f"[bold]saved[/] {tr['kind']} drafter to {out}  ({tr['steps_done']} steps, "
                  f"loss {tr['first_loss']:.3f} -> {tr['final_loss']:.3f}, stopped by {tr['stopped_by']})",
                  highlight=False)
    if "eval" in result:
        print_eval(result["eval"])
