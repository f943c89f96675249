"""Our drafters in vLLM: write a drafter folder that vLLM's speculative decoding loads as is.

Only one kind has a vLLM equivalent today: a DFlash drafter (ours, from `cure train-drafter --kind
dflash`, or a published one) is vLLM's built-in `{"method": "dflash"}`. vLLM drafts the same block
as our engine, [anchor, mask x (K-1)], with the same conditioning (target hidden states after
`dflash_config.target_layer_ids`, the target's embedding and lm_head), so `num_speculative_tokens`
is the drafter's trained block size minus one.

What the export changes (each is listed in the result's notes):
  - The draft head. Our drafter never proposes its mask token, nor ids past the tokenizer, and a
    checkpoint's `draft_vocab` limits it further to a ranked id list plus the running context's ids
    (drafters/vocab.py). vLLM's dflash method drafts over every row of the head it has, so, given the
    target (`--target`, default: the `target` named in the drafter's drafter.json), the export writes
    the drafter its own head: the target's output rows for the ids ours may propose, with vLLM's
    `d2t` offsets mapping them back to target ids (`draft_vocab_size` in the config). The context's
    extra ids cannot be expressed (the map is fixed per checkpoint): a token only they would have
    drafted is not drafted in vLLM. Without a target the drafter shares the target's whole head and
    vLLM may propose the mask token (never accepted, only slower).
  - `output_multiplier` becomes vLLM's `logit_scale`; the ids and block size our loader would default
    are written out explicitly, so vLLM reads what our engine uses.
  - embed_tokens / lm_head weights in the checkpoint are dropped: our loader ignores them too (the
    target's are used); vLLM would otherwise treat them as the drafter's own.
Settings vLLM has no equivalent for (input_embedding_scale != 1, final_logit_softcapping) refuse.

Rule: nothing half-written (files.replacing_folder). The folder is built under a temporary name next to OUT
and renamed into place once complete; a failure removes the temporary folder.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .checkpoints import config_kind, load_model, load_tokenizer, resolve
from .drafters.adapted import is_adapted_checkpoint
from .drafters.dflash import (DEFAULT_BLOCK_SIZE, DFlashModel, dflash_config_get, check_dflash_config, read_dflash_weights,
                              default_target_layer_ids, read_config)
from .errors import CureError, ModelLoadError
from .files import replacing_folder

# drafter kind -> what serves it in vLLM
VLLM_KINDS = {"dflash": "vLLM's built-in DFlash speculative method ({\"method\": \"dflash\"})"}
ARCHITECTURE = "DFlashDraftModel"
EXPORT_NOTE_FILE = "cure_export.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "special_tokens_map.json", "chat_template.jinja")
EXPORT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Our config keys that vLLM does not read, dropped from the exported config.
_OURS_ONLY = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping", "causal")


class ExportError(CureError):
    """A drafter that cannot be exported for vLLM, or an output folder that cannot be written."""


@dataclass
class ExportResult:
    out: Path
    kind: str
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    dtype: str
    notes: list[str] = field(default_factory=list)
    head: str | None = None                       # the target whose output rows make the draft head, if any
    draft_vocab: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_speculative_tokens(self) -> int:
        """K - 1: vLLM drafts [anchor, mask x num_speculative_tokens], our trained block."""
        return self.block_size - 1

    def speculative_config(self, model: str | None = None) -> dict:
        return {"method": "dflash", "model": str(model or self.out),
                "num_speculative_tokens": self.num_speculative_tokens}

    def serve_command(self, target: str = "TARGET") -> str:
        return f"vllm serve {target} --speculative-config '{json.dumps(self.speculative_config())}'"


def drafter_kind(folder: Path) -> str:
    """dflash | pard | pard-adapted | ar, from the checkpoint's config (the same rules as loading)."""
    if is_adapted_checkpoint(folder):
        return "pard-adapted"
    return config_kind(read_config(folder))


_WHY_NOT = {
    "pard": "a PARD drafter has no tested vLLM equivalent (vLLM's draft_model method has a parallel_drafting "
            "switch, not checked against our PARD drafters)",
    "pard-adapted": "an adapted PARD drafter (a LoRA delta over its base) has no vLLM equivalent",
    "ar": "an autoregressive draft model needs no export: vLLM's draft_model method loads a causal LM from its "
          "own folder",
}


def refusal(kind: str) -> str:
    """One line: why `kind` is not exported, and which kinds are."""
    why = _WHY_NOT.get(kind, f"a {kind} drafter has no vLLM equivalent")
    return (f"{why}; cure export-vllm exports these drafter kinds: {', '.join(VLLM_KINDS)} "
            f"(train one with `cure train-drafter --kind dflash`)")


def _resolve_folder(drafter: str) -> Path:
    try:
        path = Path(resolve(drafter)).expanduser()
    except ModelLoadError as e:
        raise ExportError(str(e)) from None
    if not path.is_dir():
        raise ExportError(f"drafter folder not found: {drafter}")
    if not (path / "config.json").exists():
        raise ExportError(f"{path} has no config.json: not a drafter checkpoint")
    return path


def _expected_shapes(raw: dict, n_ids: int, target_hidden: int) -> dict[str, tuple[int, ...]]:
    """The state-dict layout our loader accepts for this config, built on the meta device (no memory)."""
    from transformers import Qwen3Config
    try:
        config = Qwen3Config.from_dict(raw)
    except Exception as e:  # noqa: BLE001 - transformers validates with several exception types
        raise ExportError(f"the DFlash config is not a valid Qwen3 config ({str(e).strip().splitlines()[-1:]})") from None
    with torch.device("meta"):
        model = DFlashModel(config, n_ids, target_hidden)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if "rotary_emb" not in k}


def plan_dflash(path: Path, dtype: str | None = None) -> tuple[dict, dict[str, torch.Tensor], ExportResult]:
    """(vLLM config, tensors, result) for a DFlash checkpoint folder; nothing written."""
    raw = read_config(path)
    try:
        check_dflash_config(raw)
    except ModelLoadError as e:
        raise ExportError(str(e)) from None
    for name, neutral in (("input_embedding_scale", 1.0), ("final_logit_softcapping", None)):
        value = dflash_config_get(raw, name)
        if value is not None and value != neutral:
            raise ExportError(f"this DFlash checkpoint sets {name}={value}, which vLLM's dflash method has no "
                              f"equivalent for")
    layer_types = raw.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types) or dflash_config_get(raw, "causal"):
        raise ExportError("this DFlash checkpoint uses sliding-window or causal draft layers; only the "
                          "non-causal full-attention layout is exported (the one our engine runs)")
    n_layers = int(raw["num_hidden_layers"])
    ids = dflash_config_get(raw, "target_layer_ids")
    if ids is None:
        n_target = dflash_config_get(raw, "num_target_layers")
        if n_target is None:
            raise ExportError("the DFlash config names neither target_layer_ids nor num_target_layers: the "
                              "target layers it reads cannot be written out")
        ids = default_target_layer_ids(int(n_target), n_layers)
    ids = [int(i) for i in ids]
    mask_id = dflash_config_get(raw, "mask_token_id")
    if mask_id is None:
        raise ExportError("the DFlash config names no mask_token_id (dflash_config.mask_token_id)")
    block_size = int(dflash_config_get(raw, "block_size", DEFAULT_BLOCK_SIZE))
    target_hidden = int(dflash_config_get(raw, "target_hidden_size", raw.get("hidden_size")))

    try:
        state = read_dflash_weights(path)
    except ModelLoadError as e:
        raise ExportError(str(e)) from None
    notes = []
    draft_vocab = state.pop("draft_vocab", None)
    shared = sorted(k for k in state if k.startswith(("embed_tokens.", "lm_head.")))
    for k in shared:
        del state[k]
    if shared:
        notes.append(f"{', '.join(shared)} dropped: the target's embedding and lm_head are used, as in our engine")
    expected = _expected_shapes(raw, len(ids), target_hidden)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ExportError(f"{path} does not match the DFlash layout: missing {missing[:4]}, "
                          f"unexpected {unexpected[:4]}")
    bad = [k for k, v in state.items() if tuple(v.shape) != expected[k]]
    if bad:
        raise ExportError(f"DFlash weight {bad[0]} has shape {tuple(state[bad[0]].shape)}, expected {expected[bad[0]]}")

    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}; choose one of {', '.join(EXPORT_DTYPES)}")
    if dtype is not None:
        state = {k: v.to(EXPORT_DTYPES[dtype]) for k, v in state.items()}
    out_dtype = dtype or str(next(iter(state.values())).dtype).replace("torch.", "")

    cfg = {k: v for k, v in raw.items() if k not in _OURS_ONLY}
    sub = {k: v for k, v in dict(raw.get("dflash_config") or {}).items() if k not in _OURS_ONLY}
    sub.update({"mask_token_id": int(mask_id), "target_layer_ids": ids})
    cfg.update({"architectures": [ARCHITECTURE], "model_type": "qwen3", "dflash_config": sub,
                "block_size": block_size, "target_hidden_size": target_hidden, "dtype": out_dtype})
    multiplier = dflash_config_get(raw, "output_multiplier")
    if multiplier is not None and float(multiplier) != 1.0:
        cfg["logit_scale"] = float(multiplier)
        notes.append(f"output_multiplier {multiplier} written as vLLM's logit_scale")
    result = ExportResult(out=path, kind="dflash", block_size=block_size, target_layer_ids=ids,
                          mask_token_id=int(mask_id), dtype=out_dtype, notes=notes)
    result.draft_vocab = draft_vocab
    return cfg, state, result


def default_target(folder: Path) -> str | None:
    """The target a shipped or trained drafter names in its drafter.json, if any."""
    try:
        card = json.loads((folder / "drafter.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    target = card.get("target") if isinstance(card, dict) else None
    return target if isinstance(target, str) and target else None


def add_draft_head(cfg: dict, state: dict[str, torch.Tensor], result: ExportResult, target: str,
                   dtype: str | None = None) -> None:
    """Give the exported drafter its own head: the target's output rows for the ids our drafter may propose
    (the checkpoint's draft_vocab, else every tokenizer id), never the mask, with vLLM's d2t offsets."""
    from .drafters.vocab import DraftVocab
    try:
        model, path = load_model(target)
    except ModelLoadError as e:
        raise ExportError(f"--target: {e}") from None
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ExportError(f"the target {target!r} has an lm_head bias, which vLLM's draft head cannot carry")
    weight = head.weight.detach()
    if weight.shape[1] != int(cfg["hidden_size"]):
        raise ExportError(f"the target {target!r} has hidden size {weight.shape[1]}; the drafter expects "
                          f"{cfg['hidden_size']}")
    n_vocab = len(load_tokenizer(path))
    source = result.draft_vocab if result.draft_vocab is not None else torch.arange(n_vocab)
    try:
        ids = torch.tensor(DraftVocab(source.long(), result.mask_token_id, n_vocab).fixed, dtype=torch.long)
    except ModelLoadError as e:
        raise ExportError(str(e)) from None
    # Rule: the rows keep the target's precision (float32 as loaded here) unless --dtype says otherwise, so
    # a float32 vLLM run scores drafts with the same head values as our engine.
    rows = weight.index_select(0, ids)
    state["lm_head.weight"] = (rows.to(EXPORT_DTYPES[dtype]) if dtype else rows).contiguous()
    state["d2t"] = ids - torch.arange(ids.numel())
    cfg.update({"draft_vocab_size": int(ids.numel()), "vocab_size": int(weight.shape[0])})
    what = (f"the checkpoint's draft_vocab ({ids.numel()} ids)" if result.draft_vocab is not None
            else f"every tokenizer id but the mask ({ids.numel()} ids)")
    result.notes.append(f"draft head: {what} cut from {target}'s lm_head, with d2t offsets"
                        + ("; the context's extra ids ours also drafts cannot be added in vLLM"
                           if result.draft_vocab is not None else ""))
    result.head = str(target)


def export_vllm(drafter: str, out: str | Path, dtype: str | None = None, overwrite: bool = False,
                target: str | None = None, shared_head: bool = False) -> ExportResult:
    """Write `drafter` (a folder or embedded alias) as a vLLM drafter folder at `out`. `target` (default:
    the drafter's drafter.json `target`) gives the drafter its own draft head (see the module doc);
    `shared_head` skips that: the drafter uses the target's whole head in vLLM."""
    from safetensors.torch import save_file
    src = _resolve_folder(drafter)
    kind = drafter_kind(src)
    if kind not in VLLM_KINDS:
        raise ExportError(f"{drafter}: {refusal(kind)}")
    out = Path(out).expanduser()
    if out.resolve() == src.resolve():
        raise ExportError("OUT is the drafter's own folder; choose another folder")
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} already exists and is not empty; choose another folder or pass --overwrite")
    cfg, state, result = plan_dflash(src, dtype)
    result.out = out
    if shared_head and target:
        raise ExportError("--shared-head keeps the target's whole head: it takes no --target")
    target = None if shared_head else (target or default_target(src))
    if target is not None:
        add_draft_head(cfg, state, result, target, dtype)
    else:
        result.notes.append(("--shared-head" if shared_head else "no target given (--target)") + ": the drafter shares the target's whole lm_head in vLLM, "
                            "so it may propose its mask token, which ours never does"
                            + (f"; its draft_vocab ({result.draft_vocab.numel()} ids) is dropped"
                               if result.draft_vocab is not None else ""))
    try:
        with replacing_folder(out) as tmp:
            save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
                      metadata={"format": "pt"})
            os.chmod(tmp / "model.safetensors", 0o644)
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
            for name in TOKENIZER_FILES:
                if (src / name).is_file():
                    shutil.copy2(src / name, tmp / name)
            note = {"source": str(src), "kind": kind, "served_by": VLLM_KINDS[kind], "head_from": result.head,
                    "speculative_config": result.speculative_config(), "notes": result.notes}
            (tmp / EXPORT_NOTE_FILE).write_text(json.dumps(note, indent=2) + "\n")
    except OSError as e:
        raise ExportError(f"cannot write {out}: {e.strerror or e}") from None
    return result
