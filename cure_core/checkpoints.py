"""Checkpoints by name: an embedded alias, a local folder or a Hugging Face id in the local cache.

`load_model` and `load_tokenizer` load them (offline, with one clear ModelLoadError for a bad name); an
adapted drafter's folder loads as its base with the trained delta merged in (`load_adapted`).
`draft_folder_config` reads a draft checkpoint's folder and config.json without loading it (the thinking
default, a DFlash checkpoint's detection, vLLM's export check), and `config_kind` says which drafter a
config declares. models.py builds pairs from what these return.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .drafters.adapted import AdaptedDrafter, apply_adapter, is_adapted_checkpoint, read_adapter
from .drafters.dflash import is_dflash_config
from .embedded import EmbeddedModelError, resolve_model_path
from .errors import ModelLoadError
from .progress import phase

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def torch_dtype(name: str, what: str = "dtype") -> torch.dtype:
    """A dtype name (float32, fp16, bfloat16 ...) -> torch dtype; an unknown name is one clear error."""
    if name not in DTYPES:
        raise ModelLoadError(f"unknown {what} {name!r}; choose one of float32, float16, bfloat16")
    return DTYPES[name]


def resolve(name: str) -> str:
    """An embedded alias (see `cure models`) becomes its cached local folder; anything else is kept."""
    try:
        return str(resolve_model_path(name))
    except EmbeddedModelError as e:
        raise ModelLoadError(str(e)) from None


def load_model(name: str, device: str = "cpu", dtype: str = "float32", device_map: str | None = None):
    from transformers import AutoConfig, AutoModelForCausalLM
    path = resolve(name)
    if is_adapted_checkpoint(path):                  # a trained delta over a base model (drafters/adapted.py)
        ad = load_adapted(path, device, dtype)
        return ad.model.eval(), ad.base_path
    torch_type = torch_dtype(dtype)
    looks_like_path = path.startswith((".", "/", "~")) or path.count("/") > 1
    if not Path(path).exists() and looks_like_path:
        raise ModelLoadError(f"model folder not found: {path}")
    try:
        AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception:  # noqa: BLE001 - transformers raises several kinds here
        raise ModelLoadError(
            f"unknown model {name!r}: not a local folder, not an embedded alias (see `cure models`), and not in "
            f"the local Hugging Face cache (this machine loads offline)") from None
    kwargs = dict(dtype=torch_type, local_files_only=True)
    if device_map:
        kwargs["device_map"] = device_map          # accelerate spreads a large target over devices
    with phase(f"loading {name} ({dtype}, {device_map or device})"):
        try:
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        except Exception as e:  # noqa: BLE001
            raise ModelLoadError(f"could not load {name!r}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        if not device_map:
            try:
                model = model.to(device)
            except (RuntimeError, AssertionError) as e:
                raise ModelLoadError(f"cannot move {name!r} to device {device!r}: {str(e).splitlines()[0]}") from None
    return model.eval(), path


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str, required: bool = True):
    """The checkpoint's tokenizer; with required=False, None when a local folder ships none."""
    from transformers import AutoTokenizer
    if not required and Path(path).is_dir() and not any((Path(path) / f).exists() for f in TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001
        if required:
            raise ModelLoadError(f"no usable tokenizer in {path}: {str(e).splitlines()[0]}") from None
        return None


def check_tokenizers_match(target_tok, draft_tok, draft_name: str) -> None:
    """Draft token ids must mean the same text as the target's (a shared tokenizer)."""
    if draft_tok is None:
        return
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    diff = [t for t, i in dv.items() if tv.get(t) != i]
    if diff:
        ex = diff[0]
        raise ModelLoadError(
            f"tokenizer mismatch: {draft_name!r} maps {len(diff)} tokens differently from the target "
            f"(e.g. {ex!r} -> {dv[ex]} vs {tv.get(ex)}); the draft must share the target's tokenizer")


def load_adapted(folder: str | Path, device: str = "cpu", dtype: str = "float32") -> AdaptedDrafter:
    """Base model + trained delta (drafters/adapted.py) -> the ready drafter model and its mask token."""
    wanted = torch_dtype(dtype)                     # checked before anything loads
    ad, tensors = read_adapter(folder)
    # Rule: the delta is merged into float32 weights, then cast once: merged in bfloat16 it would be rounded
    # twice (the base's weight, then the sum), and a LoRA delta is small against the weight it changes.
    model, base_path = load_model(str(ad["base"]), device, "float32")
    return apply_adapter(model, base_path, folder, ad, tensors, wanted)


def config_kind(cfg) -> str:
    """dflash | pard | ar from a checkpoint's config (a transformers config or its raw JSON dict): a
    DFlash one declares a DFlash architecture; a PARD one names its mask token (pard_token); anything
    else drafts autoregressively. The rule `--drafter auto` and `cure export-vllm` apply."""
    if is_dflash_config(cfg):
        return "dflash"
    pard = cfg.get("pard_token") if isinstance(cfg, dict) else getattr(cfg, "pard_token", None)
    return "pard" if pard is not None else "ar"


def draft_folder_config(name: str) -> tuple[str, dict | None]:
    """(local folder, parsed config.json) of a draft checkpoint, or (resolved name, None) when it cannot
    be read here (load_model then reports why)."""
    path = resolve(name)
    folder = Path(path).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download
            folder = Path(snapshot_download(path, local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the local cache: load_model gives the clear error
            return path, None
    try:
        return str(folder), json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return path, None
