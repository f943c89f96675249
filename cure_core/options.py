"""Every engine option, declared once (vLLM's EngineArgs pattern).

`EngineArgs` is the one owner of the options that `cure generate`, `cure chat`, `cure bench`, the
benchmark scripts and the Python API share: which models to load, how to decode, how to execute.
Each field carries its CLI flag and help text; the Typer commands (cure_cli/options.py) and the
argparse scripts (`EngineArgs.add_cli_args`) are generated from these fields, and `load()`
(cure_core/api.py) takes them as keywords. Defaults here are the CLI's defaults.

Resolution happens in two steps, each in one place:
  1. `cure_core.catalog.choose_models`: the embedded default target, its shipped drafter and its
     chain draft (which checkpoints to load for which strategies);
  2. `EngineArgs.decode_config(block_size)`: DecodeConfig.from_user plus "K = the drafter's trained
     block size unless given".
"""
from __future__ import annotations

import argparse
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Sequence

from .config import ConfigError, DecodeConfig, parse_auto_int

CPU_DRAFT_VOCAB = 16384       # --draft-vocab auto on a CPU: causal drafters propose ids below this (+ the context's)


def _opt(*flags: str, help: str, metavar: str | None = None, kind: type | None = None, default: Any = MISSING,
         bounds: tuple[int, int] | None = None):
    """A field with its CLI flags and help. `kind`: the value type on the command line (str for N|auto);
    `bounds`: the (lowest, highest) integer the command line takes."""
    meta = {"flags": flags, "help": help, "metavar": metavar, "kind": kind, "bounds": bounds}
    return field(default=default, metadata=meta)


@dataclass
class EngineArgs:
    # --- models ---
    target: str | None = _opt("--target", "-t", default=None, kind=str, help=(
        "Target model: HF id, local folder or embedded alias (see `cure models`). Default: the embedded default."))
    draft: str | None = _opt("--draft", "-d", default=None, kind=str, help=(
        "Block-parallel drafter (or an AR draft with --drafter ar): HF id, folder or alias. Default: the drafter "
        "shipped for the target, if any; where a target's chain draft served cure better (e.g. qwen-coder-1.5b), "
        "cure repairs that chain (--ar-draft) instead."))
    drafter: str = _opt("--drafter", default="auto", help="Drafter kind: auto (from the checkpoint's config), pard, dflash, ar.")
    mask_token_id: int | None = _opt("--mask-token-id", default=None, kind=int, help=(
        "PARD mask token id (default: the checkpoint's pard_token)."))
    ar_draft: str | None = _opt("--ar-draft", default=None, kind=str, help=(
        "Autoregressive draft model for 'sd', and for cure where it repairs chains (default: the target's chain "
        "draft, e.g. qwen-coder-0.5b for qwen-coder-1.5b; a PARD or AR --draft doubles as one)."))
    # --- decoding ---
    strategy: str = _opt("--strategy", "-s", default="cure", help="ar | sd | parallel | cure | ddtree")
    max_new_tokens: int = _opt("--max-new-tokens", "-n", default=256, help="Tokens to generate at most.")
    temperature: float = _opt("--temperature", default=0.0, help="0 = greedy (identical to ar); > 0 samples losslessly.")
    seed: int = _opt("--seed", default=0, bounds=(0, 2 ** 64 - 1),   # what torch.Generator.manual_seed takes
                     help="Sampling seed (temperature > 0), 0 to 2**64-1.")
    k: int | None = _opt("--k", default=None, kind=int, help=(
        "Block size K: the root plus K-1 drafted tokens. Default: the drafter's trained block size, else 16."))
    tau_margin: float = _opt("--tau-margin", default=1.0, help="Paper tree: the UFP gate, a draft top1-top2 log-prob margin below this.")
    b_max: int = _opt("--b-max", default=5, help="Paper tree: repair branches at the most uncertain UFP.")
    cure_tree: str = _opt("--cure-tree", default="best-first", help=(
        "cure's tree: best-first (nodes by joint draft log-prob, the subtrees under the best substitutions "
        "re-drafted conditioned on them) | paper (branch 0 + repair branches at UFPs, as the paper)."))
    lookup: int = _opt("--lookup", default=10, help=(
        "Best-first cure: also graft up to N tokens copied from the text so far (what followed the latest earlier "
        "occurrence of its last tokens, as prompt-lookup decoding drafts) into the tree, scored by how often such "
        "tokens were accepted. 0 = off. Never changes the output."))
    v_max: str = _opt("--v-max", default="auto", metavar="N|auto", help=(
        "Tree node budget V_max, or auto: measure the target's verification cost curve once and pick, block by "
        "block, the budget that maximises expected tokens/s (budget 0, no draft, included)."))
    # --- execution: speed only, never the output of a given dtype ---
    kv_cache: str = _opt("--kv-cache", default="static", help=(
        "static: preallocated K/V rows compacted in place | dynamic: transformers' DynamicCache. Never changes "
        "the output."))
    compile: bool = _opt("--compile", default=False, help=(
        "torch.compile the target forward over padded static shapes (CUDA graphs on a GPU), and a DFlash "
        "drafter's block passes; the first blocks compile. Under --dtype auto the target then runs float32."))
    kernels: str = _opt("--kernels", default="auto", help=(
        "CPU matmuls: packed = oneDNN packs every weight once at load, so verifying N nodes costs far less than "
        "N one-token steps | eager = torch's default | auto = packed where it applies (CPU, float32, or bfloat16 "
        "where oneDNN has bfloat16 kernels, int8; not --compile). Never changes the output of a given --dtype; "
        "under --dtype auto, eager makes the target float32."))
    draft_vocab: str = _opt("--draft-vocab", default="auto", metavar="N|auto", help=(
        "Causal drafters (PARD, AR, --ar-draft) propose only token ids < N plus the prompt's and output's, so "
        "their head costs a fraction of the full vocabulary's. 0 = the whole vocabulary; auto = 16384 on a CPU, "
        "0 elsewhere (a GPU's head is cheap). DFlash drafters use the vocabulary saved in their checkpoint. "
        "Never changes the output."))
    device: str = _opt("--device", default="cpu", help="cpu, cuda, cuda:1, mps ...")
    dtype: str = _opt("--dtype", default="auto", help=(
        "The target's dtype: float32, float16, bfloat16, int8 (CPU: int8 weights, each input row quantized on "
        "its own; packed kernels), or auto: on a CPU with kernels that pack, int8 where fbgemm has AVX512-VNNI, else "
        "bfloat16 where oneDNN runs it natively (AVX512-BF16, AMX), else float32; float32 off the CPU. Every "
        "strategy equals ar token for token in the same dtype; a bfloat16 target is exact so on packed CPU "
        "kernels only (rows probed for the row counts that give them the same bits); elsewhere it can flip "
        "near-tied argmaxes. Pass float32 for the checkpoint's own numbers."))
    draft_dtype: str = _opt("--draft-dtype", default="auto", help=(
        "The drafters' own networks (PARD, AR, --ar-draft, DFlash's layers): float32, float16, bfloat16, "
        "int8 (CPU, packed kernels: int8 weights for passes of up to 16 rows, such as chain steps), or "
        "auto: for causal drafters (PARD, AR) on a CPU, int8 where torch has fbgemm's int8 matmuls (always under "
        "an int8 target), else bfloat16 where oneDNN has bfloat16 kernels; else --dtype (a DFlash drafter under an int8 "
        "target: bfloat16 where oneDNN has bfloat16 kernels, else float32). Only proposals change, "
        "the target verifies every token. Never changes the output."))
    device_map: str | None = _opt("--device-map", default=None, kind=str, help=(
        "Passed to accelerate (e.g. auto) for targets larger than one device."))
    # --- prompt encoding ---
    chat: bool | None = _opt("--chat/--raw", default=None, kind=bool, help=(
        "Wrap prompts in the chat template (default when the tokenizer has one; bench: raw for completion-style "
        "tasks) or send raw text."))
    thinking: bool | None = _opt("--thinking/--no-thinking", default=None, kind=bool, help=(
        "Qwen3-style templates: enable_thinking on or off. Default: what the drafter declares (config or model "
        "card); else off for a DFlash drafter (the published ones are non-thinking); else the template's default."))

    # ---- resolution (each rule once) ----

    def decode_config(self, block_size: int | None = None, **changes) -> DecodeConfig:
        """The DecodeConfig these options decode with. Rule: K is the drafter's trained block size
        (`block_size`, from the Drafter protocol) unless `k` is given, else 16."""
        k = self.k if self.k is not None else block_size
        return DecodeConfig.from_user(strategy=self.strategy, k=k, v_max=self.v_max, b_max=self.b_max,
                                      max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                      seed=self.seed, tau_margin=self.tau_margin, kv_cache=self.kv_cache,
                                      compile=self.compile, cure_tree=self.cure_tree, lookup=self.lookup,
                                      **changes)

    def draft_vocab_ids(self) -> int:
        """`draft_vocab` as a number of ids. Rule: auto restricts causal drafters' heads on a CPU only, where
        the head is a large part of a small draft model's step; on a GPU it costs little and the ids it could
        no longer draft would only cost acceptance."""
        n = parse_auto_int(self.draft_vocab, "draft_vocab")
        if n is None:
            return CPU_DRAFT_VOCAB if self.device == "cpu" and not self.device_map else 0
        if n < 0:
            raise ConfigError(f"`draft_vocab` takes a number of ids (0: the whole vocabulary) or auto, "
                              f"got {self.draft_vocab!r}")
        return n


    def target_dtype(self) -> str:
        """`dtype` by name, auto resolved. Rule: on a CPU, with kernels that pack, auto is the dtype whose
        one-row step streams the fewest bytes among those this CPU multiplies natively: int8 where fbgemm
        multiplies full 8-bit activations (AVX512-VNNI), else bfloat16 where oneDNN runs bfloat16 matmuls, else
        float32; float32 off the CPU. Every one of them equals ar in its dtype token for token (int8 rows are
        quantized one by one; bfloat16 rows are made not to depend on their pass: cpu_kernels.row_invariant).
        Why: the measured cost curves (benchmarks/results/SUMMARY.md) put int8 below bfloat16 and bfloat16
        below float32 at the row counts the budget tuner picks, on both embedded targets."""
        if self.dtype != "auto":
            return self.dtype
        from .cpu_kernels import REDUCE_RANGE, bf16_kernels, int8_kernels
        if self.device != "cpu" or self.device_map or self.load_kernels() == "eager":
            return "float32"
        if int8_kernels() and not REDUCE_RANGE:
            return "int8"
        return "bfloat16" if bf16_kernels() else "float32"

    def load_kernels(self) -> str:
        """`kernels` for loading. Rule: torch.compile cannot trace packed layers (inductor packs on its own),
        so `compile` turns auto into eager and refuses packed."""
        if self.compile and self.kernels == "packed":
            raise ConfigError("`kernels` packed does not combine with `compile` (inductor packs weights itself); "
                              "use auto or eager")
        return "eager" if self.compile and self.kernels == "auto" else self.kernels

    def with_(self, **changes) -> "EngineArgs":
        return EngineArgs(**{**asdict(self), **changes})

    # ---- command lines ----

    @staticmethod
    def flags() -> dict[str, str]:
        """field name -> its main CLI flag (errors from the core name fields; the CLI shows flags)."""
        return {f.name: f.metadata["flags"][0].split("/")[0] for f in fields(EngineArgs)}

    @staticmethod
    def switches() -> dict[str, tuple[str, str]]:
        """field name -> (on flag, off flag) of the --x/--no-x pairs."""
        return {f.name: tuple(f.metadata["flags"][0].split("/")) for f in fields(EngineArgs)
                if "/" in f.metadata["flags"][0]}

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, exclude: Sequence[str] = (), only: Sequence[str] | None = None,
                     **defaults) -> None:
        """The same options on an argparse parser (benchmark scripts): all of them, or those in `only`;
        never those in `exclude`; `defaults` override ours."""
        for f in fields(EngineArgs):
            if f.name in exclude or (only is not None and f.name not in only):
                continue
            meta, default = f.metadata, defaults.get(f.name, f.default)
            names = meta["flags"]
            if "/" in names[0]:                              # --chat/--raw: a pair of switches
                on, off = names[0].split("/")
                group = parser.add_mutually_exclusive_group()
                group.add_argument(on, dest=f.name, action="store_const", const=True, default=default, help=meta["help"])
                group.add_argument(off, dest=f.name, action="store_const", const=False, default=default)
            elif f.type in (bool, "bool"):
                parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                    help=meta["help"])
            else:
                kind = meta["kind"] or type(f.default)
                parser.add_argument(*names, dest=f.name, type=kind, default=default, metavar=meta["metavar"],
                                    help=meta["help"])

    @staticmethod
    def from_cli_args(ns: argparse.Namespace) -> "EngineArgs":
        return EngineArgs(**{f.name: getattr(ns, f.name) for f in fields(EngineArgs) if hasattr(ns, f.name)})


def parse_list(text: str | None) -> list[str]:
    """A comma list of names: 'a, b,,a' -> ['a', 'b'] (order kept, duplicates dropped)."""
    out: list[str] = []
    for part in (text or "").split(","):
        part = part.strip().lower()
        if part and part not in out:
            out.append(part)
    return out
