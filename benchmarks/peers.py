"""cure against its peers: transformers' own decoding loops and cure's strategies, one process.

    python benchmarks/peers.py --target qwen-coder-1.5b --limit 20 --max-new-tokens 64 \\
        [--sets humaneval@20,gsm8k,benchmarks/prompts/chat20.jsonl] \\
        [--strategies ar,sd,parallel,cure,ddtree] [--hf generate,assisted,prompt-lookup] \\
        [--threads N] [--json OUT.json] [any engine flag of `cure generate`: --draft, --k, --v-max ...]
    python benchmarks/peers.py --tiny            # in-process tiny random models: a fast smoke run

Models open exactly as `cure generate` opens them (cure_core.api.open_pair, the EngineArgs flags
and defaults): the shipped drafter, K from the drafter, --v-max auto, --draft-vocab auto.

Methods, all greedy (temperature 0), all on the SAME target model object and the same prompts:
`--sets`, `--limit` prompts each (HumanEval raw completion style; GSM8K and
custom prompt files through the chat template, as `cure bench` encodes them). Summaries are per set
and over all of them, so a drafter that only knows code shows as such. Attention: cure's engine runs its
models with cure_core/attention.py's grouped sdpa, transformers' loops with transformers' sdpa (switched
back around each of their generations); `ddtree:attention=sdpa` runs a cure strategy with transformers'.
`cure:draft_dtype=bfloat16` runs a cure strategy over drafters loaded again in another dtype, and
`cure:draft=PATH` over another draft checkpoint (e.g. a trained drafter against the alias's default), over
the same target object (opened once per draft and dtype). `cure:dtype=int8` runs it over the target loaded
again in that dtype (one object per dtype); its output is checked against `ar:dtype=int8`, which must be listed. `sd:int8_decoder=off` runs an int8 drafter's
short passes through transformers' forward instead of cure_core/int8_decoder.py's (an A/B of the two).
`--kernels` (default auto: packed oneDNN
matmuls on a float32 CPU, see cure_core/cpu_kernels.py) applies to those shared model objects, so
transformers' loops run the same kernels as cure's; `--kernels eager` gives stock torch layers.

    hf_generate       transformers `model.generate()` greedy: the reference output
    hf_assisted       transformers assisted generation, `assistant_model=` the AR draft
                      (transformers' defaults: up to 20 draft tokens, adaptive confidence stop;
                      `--hf-assistant-tokens N` fixes N with the "constant" schedule)
    hf_prompt_lookup  transformers prompt-lookup decoding, `prompt_lookup_num_tokens=`
    cure_<strategy>   cure's engine: ar, sd, parallel, cure, ddtree (`--strategies`)

`sd` and HF assisted use the chain drafter (`--ar-draft`, the target's default chain draft, or a PARD
or AR `--draft`); parallel/cure/ddtree the block drafter (`--draft`, else the one shipped for the target,
else the chain draft), except that with no `--draft` cure repairs the chain draft's chains on a target
that cure_core/defaults.py's CURE_OVER_CHAIN names (the 1.5B pair): `cure:draft=PATH` runs it over a
block drafter there. Each cure method's settings record which it drafted with (`drafts`).

Order: models load once; one warm-up generation per method (short, on the first prompt); then
prompt-major interleaving (for each prompt, every method in turn) so machine drift and other
load on this shared box hit every method alike. Within a prompt the methods run in a balanced order
(`--order balanced`, the default: the rows of a Williams design, so over a cycle of prompts every
method runs in every position and right after every other method equally often); `--order fixed`
keeps the listed order, as every run before the option did.

Timing: prefill is EXCLUDED for everyone.
  * cure: the engine times the prefill (the prompt minus its last token) apart; decode time is the
    sum of every block's draft + tree + verify + commit time, over all n new tokens (the first
    block forwards the last prompt token and emits token 1).
  * transformers: `generate()` gives no per-step timings, so for every (prompt, method) we first
    time a `generate(max_new_tokens=1)` with the SAME arguments (assistant, lookup) on the same
    prompt: that is the prefill (one target forward over the prompt, emitting token 1, plus
    generate()'s fixed setup cost; the assistant drafts nothing when only one token is wanted).
    Then decode time = time(full generate) - time(1-token generate), over the n - 1 tokens after
    the first. A TextStreamer-style timestamp of the first token was not used: in assisted and
    prompt-lookup generation the first streamed chunk already includes a speculative step, so it
    would drop decode work (and its accepted tokens) together with the prefill. The subtraction
    is a difference of two wall times, so it carries the noise of both (small against a decode
    of tens of tokens; check `prefill_ms` in the JSON when a generation is very short).
  * Per-token cost is comparable: cure's n forwards make n tokens; transformers' n - 1 decode
    forwards make the n - 1 tokens after the first. The draft model's own prompt processing
    falls in decode time in both (cure: the first block's draft step; transformers: the first
    assisted step), as it does in any real decoding.
  tokens/s = decode tokens / decode seconds, summed over prompts; TPOT = its inverse in ms.
  Speed ratios divide tokens/s by cure `ar` and by `hf_generate` (same run, same machine).

Correctness: every method is lossless at temperature 0, so each output is compared token for
token with `hf_generate` (same eos set, `max_new_tokens`; sampling knobs and repetition penalty of
the checkpoint's generation_config overridden). In float32 they should all match; a mismatch is
reported with its first differing position (a near-tie in the logits flipped by a different
kernel/batch shape is the usual cause, not a lost token).

tau (acceptance length) = new tokens / target forwards; for transformers methods the target
forwards are counted with a forward hook (the prefill forward included, as it emits token 1).

Threads: `--threads N`, else 1 when the 1-minute load average exceeds the core count (the box is
shared), else every core. The choice and its reason are printed and written to the JSON.
"""
from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from cure_core.cpu_kernels import cpu_info  # noqa: E402
from cure_core.attention import stock_sdpa  # noqa: E402
from cure_core.options import EngineArgs, parse_list  # noqa: E402
from cure_core.metrics import ORDERS, run_order as order_of_runs  # noqa: E402

SCHEMA = "cure.peers/1"
HF_METHODS = {"generate": "hf_generate", "assisted": "hf_assisted", "prompt-lookup": "hf_prompt_lookup"}
REFERENCE = "hf_generate"
CURE_AR = "cure_ar"
BLOCK_STRATEGIES = ("parallel", "cure", "ddtree")
# Short code prompts for --tiny (the tiny models hold 512 positions; HumanEval prompts are longer in bytes).
TINY_PROMPTS = (
    ("tiny/0", "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"),
    ("tiny/1", "for i in range(10):\n    print(i)\nfor j in range(10):\n"),
    ("tiny/2", "class Stack:\n    def __init__(self):\n        self.items = []\n"),
    ("tiny/3", "import os\nimport sys\n\ndef main():\n    "),
)


# ---------------------------------------------------------------- environment

def choose_threads(requested: int | None) -> tuple[int, str]:
    """(threads, why): --threads wins; else 1 on a loaded box, else every core."""
    cores = os.cpu_count() or 1
    if requested is not None:                   # checked >= 1 by common.check
        return requested, "set with --threads"
    load = (common.load_average() or [0.0])[0]
    if load > cores:
        return 1, f"1-minute load average {load:.2f} > {cores} cores (shared box): 1 thread"
    return cores, f"1-minute load average {load:.2f} <= {cores} cores: all cores"


def environment(threads: int, why: str, device: str, dtype: str) -> dict:
    import transformers
    env = {
        "python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "threads_requested": threads,
        "threads_reason": why, "torch_interop_threads": torch.get_num_interop_threads(),
        "device": device, "dtype": dtype,
        "load_average_start": common.load_average(),
        **cpu_info(),
    }
    try:
        import rich
        from importlib.metadata import version
        env["rich"] = version("rich")
        del rich
    except Exception:  # noqa: BLE001 - informational only
        env["rich"] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        env["cuda_device"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
    return env


# ---------------------------------------------------------------- models and prompts

@dataclass
class Setup:
    pair: object                                 # cure_core.engine.ModelPair
    tokenizer: object
    prompts: list[tuple[str, str, list[int]]]    # (set, task_id, ids)
    models: dict
    config: object                               # the DecodeConfig the cure methods start from
    engine: object                               # the loaded pair's one Engine (tuners per config)
    reopen: object = None                        # (draft, draft dtype, dtype) -> an Engine over the pair opened with them
    notes: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    tmpdir: object = None                        # keeps --tiny's folder alive


def prompt_sets(args, loaded) -> list[tuple[str, str, list[int]]]:
    """(set, task_id, ids) for every --sets entry (cure_tasks.load_set: a task, task@N, or a prompts file),
    `--limit` prompts each; completion-style tasks raw, the rest through the chat template."""
    from cure_tasks import load_set, raw_by_default
    out = []
    for spec in parse_list(args.sets):
        name, task, problems = load_set(spec, args.limit)
        out += [(name, p.task_id, loaded.encode(p.prompt, chat=not raw_by_default(task))) for p in problems]
    return out


def load_setup(args) -> Setup:
    from cure_core.api import open_pair
    engine_args = EngineArgs.from_cli_args(args).with_(strategy="ar")
    tmp = None
    if args.tiny:
        from cure_core.tiny import save_tiny_pair
        tmp = tempfile.TemporaryDirectory(prefix="cure-peers-")
        tdir, ddir = save_tiny_pair(Path(tmp.name))      # the perturbed copy: PARD drafter and its chain
        engine_args = engine_args.with_(target=str(tdir), draft=str(ddir), drafter="pard")
    strategies = [strategy_variant(s)[0] for s in parse_list(args.strategies)]
    chain = ["sd"] if "assisted" in parse_list(args.hf) else []
    loaded = open_pair(engine_args, strategies=strategies + chain)
    pair = loaded.pair
    if args.tiny:
        prompts = [("tiny", tid, loaded.encode(text, chat=False)) for tid, text in TINY_PROMPTS[: args.limit]]
        models = {"target": "tiny (in-process, random)", "draft": "tiny perturbed copy (PARD)",
                  "ar_draft": "tiny perturbed copy (PARD as a chain)", "drafter": "pard"}
    else:
        prompts = prompt_sets(args, loaded)
        models = {"target": pair.names.get("target"), "draft": pair.names.get("draft"),
                  "ar_draft": pair.names.get("ar_draft") or (pair.names.get("draft") if pair.ar_drafter else None),
                  "drafter": loaded.drafter_kind}
    models["kernels"] = loaded.kernels                # every method runs these same model objects
    models["chain_strategies"] = sorted(pair.chain_strategies)   # the strategies that draft with ar_draft
    models["draft_vocab"] = loaded.draft_vocab
    models["draft_dtype"] = loaded.draft_dtype
    # the opened pair answers for its options' dtype (e.g. auto) and for the dtype that resolved to
    engines = {(engine_args.draft, d, t): loaded.engine for d in (engine_args.draft_dtype, loaded.draft_dtype)
               for t in (engine_args.dtype, engine_args.target_dtype())}
    targets = {engine_args.dtype: loaded, engine_args.target_dtype(): loaded}   # `dtype=int8` under auto's int8: one target

    def reopen(draft: str | None = None, draft_dtype: str | None = None, dtype: str | None = None):
        """The `draft=` / `draft_dtype=` / `dtype=` variants: the same options with another draft checkpoint,
        other drafter weights or another target dtype, opened once per (draft, draft dtype, dtype); one target
        object per dtype (`dtype=int8` loads the target again, quantized)."""
        draft = engine_args.draft if draft is None else draft
        draft_dtype = engine_args.draft_dtype if draft_dtype is None else draft_dtype
        dtype = engine_args.dtype if dtype is None else dtype
        if (draft, draft_dtype, dtype) not in engines:
            args_ = engine_args.with_(draft=draft, draft_dtype=draft_dtype, dtype=dtype)
            other = open_pair(args_, strategies=strategies + chain, target_of=targets.get(dtype))
            targets.setdefault(dtype, other)
            engines[(draft, draft_dtype, dtype)] = other.engine
        return engines[(draft, draft_dtype, dtype)]
    return Setup(pair=pair, tokenizer=loaded.tokenizer, prompts=prompts, models=models, config=loaded.config,
                 engine=loaded.engine, notes=list(loaded.notes), tmpdir=tmp, reopen=reopen)


# ---------------------------------------------------------------- one generation per method

class ForwardCounter:
    """Counts top-level forward calls of a module (target forwards inside HF generate)."""

    def __init__(self, module):
        self.n = 0
        module.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.n += 1


@dataclass
class Method:
    name: str
    kind: str                                    # "hf" | "cure"
    settings: dict
    run: Callable[[list[int], int], dict]        # (prompt ids, max_new_tokens) -> record


def _clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":
        def now():
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return now
    return time.perf_counter


def hf_method(name: str, model, extra: dict, eos: Sequence[int], pad: int | None, counter: ForwardCounter) -> Method:
    device = next(model.parameters()).device
    now = _clock(device)
    base = dict(do_sample=False, num_beams=1, repetition_penalty=1.0, no_repeat_ngram_size=0, min_new_tokens=0,
                eos_token_id=list(eos), pad_token_id=pad, use_cache=True)

    def generate(ids: list[int], max_new: int) -> tuple[list[int], float, int]:
        x = torch.tensor([ids], device=device)
        start_fwd = counter.n
        with torch.inference_mode():
            t0 = now()
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new,
                                 **base, **extra)
            t1 = now()
        return out[0, len(ids):].tolist(), (t1 - t0) * 1e3, counter.n - start_fwd

    def run(ids: list[int], max_new: int) -> dict:
        # transformers' loops run its own sdpa (cure's engine switched these models to grouped_sdpa)
        with stock_sdpa([model, extra.get("assistant_model")]):
            _, prefill_ms, _ = generate(ids, 1)      # prefill: the same call, one new token
            tokens, total_ms, forwards = generate(ids, max_new)
        decode_tokens = max(len(tokens) - 1, 0)
        decode_ms = max(total_ms - prefill_ms, 0.0)
        return {"tokens": tokens, "prefill_ms": prefill_ms, "total_ms": total_ms, "decode_ms": decode_ms,
                "decode_tokens": decode_tokens, "target_forwards": forwards}

    settings = {k: (v if not hasattr(v, "config") else "model") for k, v in extra.items()}
    return Method(name, "hf", settings, run)


def tuner_view(tuner) -> dict:
    """What the budget tuner believes before its next choice: per candidate budget E[a(V)], C_d(V) ms, E[V(T)]
    and the predicted tok/s; for a sequential drafter its cost line (c0, c1 ms) and the draft stop's
    calibration gamma."""
    view = {"candidates": {}}
    for v in tuner.candidates:
        rate = tuner.rate(v)
        view["candidates"][str(v)] = {"a": tuner.expected_accept(v), "cd_ms": tuner.drafting_ms(v),
                                      "size": tuner.expected_size(v), "tok_s": 1e3 * rate if rate else None}
    if tuner.steps is not None and tuner.costs:
        view["cost_line_ms"] = list(tuner.cost_line())
        view["gamma"] = tuner.calibration()
    return view


def block_records(blocks, cfg, views=None) -> list[dict]:
    """Per block: the budget the tuner chose and why, what it drafted, what it cost, and whether a draft stop
    ended its chain before the budget's positions and the room max_new_tokens left did (`stopped`; the
    engine's other bound, the context's end, is not modelled: these prompts are far from it;
    `chain_accepted`: the chain's tokens the target accepted, so a stopped chain accepted whole shows a
    stop that came too early). `views`: the tuner's view before each block's choice (--trace-tuner)."""
    from cure_core.strategies import drafted_steps
    out, new = [], 0
    for i, b in enumerate(blocks):
        budget = b.meta.get("v_max")
        steps = drafted_steps(cfg, budget) if cfg.auto_budget and budget is not None else cfg.depth
        room = min(cfg.depth, cfg.max_new_tokens - new - 1)
        rec = {"budget": budget, "tuning": b.meta.get("tuning"), "tree": len(b.nodes), "drafted": len(b.draft),
               "draft_stop": b.meta.get("draft_stop"), "alt_floor": b.meta.get("alt_floor"),
               "accepted": len(b.accepted),
               "chain_accepted": b.branch0_accepted,
               "stopped": "draft_stop" in b.meta and len(b.draft) < min(steps, room),
               "draft_ms": round(b.timings.draft_ms, 2), "verify_ms": round(b.timings.verify_ms, 2)}
        if views is not None:
            rec["tuner"] = views[i]
        out.append(rec)
        new += len(b.emitted)
    return out


def pair_models(pair) -> list:
    """The HF models a pair runs: the target and each drafter's own model."""
    drafters = [pair.drafter, pair.ar_drafter]
    return [pair.target] + [getattr(d, "model", None) for d in drafters if d is not None]


@contextlib.contextmanager
def without_int8_decoder(pair, off: bool):
    """Within (when `off`): the pair's int8 drafters run every pass through transformers' forward, not
    Int8Decoder (the variant `int8_decoder=off` A/Bs the two in one run)."""
    lms = [lm for d in (pair.drafter, pair.ar_drafter) if off and (lm := getattr(d, "lm", None)) is not None]
    kept = [lm.int8_decoder() for lm in lms]
    for lm in lms:
        lm.int8 = None
    try:
        yield
    finally:
        for lm, k in zip(lms, kept):
            lm.int8 = k


def cure_method(strategy: str, engine, cfg, trace: bool = False, attention: str = "grouped",
                draft_dtype: str | None = None, draft: str | None = None, int8_decoder: bool = True,
                dtype: str | None = None) -> Method:
    from cure_core.metrics import summarize

    def run(ids: list[int], max_new: int) -> dict:
        # the variant `attention=sdpa` runs transformers' own sdpa (stock_sdpa of no models changes nothing)
        with stock_sdpa(pair_models(engine.pair) if attention == "sdpa" else ()), \
                without_int8_decoder(engine.pair, not int8_decoder):
            return measured(ids, max_new)

    def measured(ids: list[int], max_new: int) -> dict:
        c = cfg.with_(max_new_tokens=max_new)
        tuner = engine.tuner_for(c) if trace else None
        views = [] if tuner is not None else None
        blocks = []
        t0 = time.perf_counter()
        gen = engine.generate(ids, c)
        while True:
            # the view is read between blocks, outside the engine's timings (decode_ms); the wall time has it
            if views is not None:
                views.append(tuner_view(tuner))
            b = next(gen, None)
            if b is None:
                break
            blocks.append(b)
        wall = (time.perf_counter() - t0) * 1e3
        s = summarize(blocks)
        return {"tokens": [t for b in blocks for t in b.emitted], "prefill_ms": s.prefill_ms,
                "total_ms": wall, "decode_ms": s.decode_ms, "decode_tokens": s.new_tokens,
                "target_forwards": s.blocks, "draft_ms": s.draft_ms, "tree_ms": s.tree_ms,
                "verify_ms": s.verify_ms, "commit_ms": s.commit_ms, "learn_ms": s.learn_ms, "mean_tree_size": s.mean_tree_size,
                "k": c.k, "v_max": c.v_max, "auto_budget": c.auto_budget,
                "blocks": block_records(blocks, c, views)}

    settings = {**cfg.to_dict(), "attention": attention,
                "drafts": "chain" if cfg.strategy in engine.pair.chain_strategies else "block"}
    if draft_dtype is not None:
        settings["draft_dtype"] = draft_dtype
    if draft is not None:
        settings["draft"] = str(draft)
    if not int8_decoder:
        settings["int8_decoder"] = "off"
    if dtype is not None:
        # another target: its output is checked against `ar` on that target, not against HF's float32 greedy
        settings["dtype"] = str(dtype)
        settings["reference"] = f"cure_ar:dtype={dtype}"
    return Method(f"cure_{strategy}", "cure", settings, run)


def budget_table(rows: list[dict]) -> dict:
    """A cure method's blocks by the budget they ran at (count, mean accepted and drafted, realised tok/s =
    (accepted + 1) / (draft + verify ms)), and its draft stops: chains stopped, and how many the target
    accepted whole."""
    blocks = [b for r in rows for b in r.get("blocks", ())]
    by: dict = {}
    for b in blocks:
        by.setdefault(b["budget"], []).append(b)
    def row(bs: list[dict]) -> dict:
        accepted = statistics.mean(b["accepted"] for b in bs)
        ms = statistics.mean(b["draft_ms"] + b["verify_ms"] for b in bs)
        return {"blocks": len(bs), "accepted": accepted, "drafted": statistics.mean(b["drafted"] for b in bs),
                "tok_s": 1e3 * (accepted + 1) / max(ms, 1e-9)}
    table = {str(v): row(bs) for v, bs in sorted(by.items(), key=lambda kv: -1 if kv[0] is None else kv[0])}
    stopped = [b for b in blocks if b.get("stopped")]
    return {"by_budget": table, "stopped_chains": len(stopped),
            "stopped_chains_accepted_whole": sum(1 for b in stopped if b["chain_accepted"] >= b["drafted"])}


def strategy_variant(spec: str) -> tuple[str, dict]:
    """'cure' -> ('cure', {}); 'cure:lookup=10:redrafts=3' -> ('cure', {'lookup': 10, 'redrafts': 3}): one
    strategy with DecodeConfig fields changed, so two settings of one strategy run interleaved in one run."""
    name, *rest = spec.split(":")
    changes = {}
    for item in rest:
        key, _, value = item.partition("=")
        try:
            changes[key] = int(value)
        except ValueError:
            try:
                changes[key] = float(value)
            except ValueError:
                changes[key] = value
    return name, changes


def build_methods(args, setup: Setup) -> list[Method]:
    from cure_core.config import ConfigError
    from cure_core.errors import ModelLoadError
    pair, tok = setup.pair, setup.tokenizer
    eos = list(pair.eos_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else None)
    counter = ForwardCounter(pair.target)
    methods: list[Method] = []
    hf = parse_list(args.hf)
    if "generate" not in hf:
        hf.insert(0, "generate")
        setup.notes.append("hf generate always runs: it is the reference output")
    for h in hf:
        if h not in HF_METHODS:
            raise SystemExit(f"unknown --hf method {h!r}; choose from {', '.join(HF_METHODS)}")
    for h in hf:
        name = HF_METHODS[h]
        if h == "generate":
            methods.append(hf_method(name, pair.target, {}, eos, pad, counter))
        elif h == "assisted":
            if pair.ar_drafter is None:
                setup.skipped.append({"method": name, "reason": "no chain draft model (--ar-draft)"})
                continue
            assistant = pair.ar_drafter.model
            if args.hf_assistant_tokens is not None:
                assistant.generation_config.num_assistant_tokens = args.hf_assistant_tokens
                assistant.generation_config.num_assistant_tokens_schedule = "constant"
            gc = assistant.generation_config
            m = hf_method(name, pair.target, {"assistant_model": assistant}, eos, pad, counter)
            m.settings["assistant_model"] = setup.models.get("ar_draft")
            defaults = gc._get_default_generation_params()
            for key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
                val = getattr(gc, key, None)
                m.settings[key] = val if val is not None else defaults.get(key)
            methods.append(m)
        else:
            methods.append(hf_method(name, pair.target, {"prompt_lookup_num_tokens": args.prompt_lookup_tokens,
                                                          "max_matching_ngram_size": args.prompt_lookup_ngram},
                                     eos, pad, counter))
    for spec in parse_list(args.strategies):
        s, changes = strategy_variant(spec)
        attention = changes.pop("attention", "grouped")
        draft_dtype = changes.pop("draft_dtype", None)
        draft = changes.pop("draft", None)
        dtype = changes.pop("dtype", None)
        int8_decoder = changes.pop("int8_decoder", "on")
        try:
            if attention not in ("grouped", "sdpa"):
                raise ConfigError(f"attention={attention}: choose grouped (cure's) or sdpa (transformers')")
            if int8_decoder not in ("on", "off"):
                raise ConfigError(f"int8_decoder={int8_decoder}: choose on (Int8Decoder) or off (transformers')")
            # neither set: the options' own (draft, dtype), i.e. the pair already opened
            engine = setup.reopen(None if draft is None else str(draft), None if draft_dtype is None else str(draft_dtype),
                                  None if dtype is None else str(dtype))
            engine.pair.drafter_for(s)
            methods.append(cure_method(spec, engine, setup.config.with_(strategy=s, **changes),
                                       trace=args.trace_tuner, attention=attention, draft_dtype=draft_dtype,
                                       draft=draft, int8_decoder=int8_decoder == "on", dtype=dtype))
        except (ConfigError, ModelLoadError, TypeError) as e:
            setup.skipped.append({"method": f"cure_{spec}", "reason": str(e)})
    names = {m.name for m in methods}
    for m in methods:
        if reference_of(m) not in names:
            raise SystemExit(f"{m.name} is checked against {m.settings['reference']}: add "
                             f"{m.settings['reference'].removeprefix('cure_')} to --strategies")
    for ref in sorted({m.settings["reference"] for m in methods if "reference" in m.settings}):
        setup.notes.append(f"'= HF greedy' of the {ref.partition(':')[2]} rows: equal to {ref}'s output (another target)")
    return methods


# ---------------------------------------------------------------- aggregation

def _rate(tokens: int, ms: float) -> float | None:
    return 1e3 * tokens / ms if ms > 0 and tokens > 0 else None


def reference_of(m: Method) -> str:
    """The method whose output `m`'s is checked against: HF greedy, or `ar` on another target (dtype=)."""
    return m.settings.get("reference", REFERENCE)


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_order(methods: Sequence[Method], prompt_index: int, order: str) -> list[Method]:
    """The methods in the order they run on one prompt: `cure bench`'s rule (cure_core.metrics.run_order: a
    Williams design, or under "fixed" the listed order every prompt, hf_generate first)."""
    return [methods[j] for j in order_of_runs(len(methods), prompt_index, order)]


def summarize_methods(methods: Sequence[Method], results: list[dict]) -> dict:
    out: dict[str, dict] = {}
    for m in methods:
        rows = [r for r in results if r["method"] == m.name]
        dt = sum(r["decode_tokens"] for r in rows)
        dms = sum(r["decode_ms"] for r in rows)
        new = sum(r["new_tokens"] for r in rows)
        fwd = sum(r["target_forwards"] for r in rows)
        tps = _rate(dt, dms)
        out[m.name] = {
            "kind": m.kind, "prompts": len(rows), "new_tokens": new, "decode_tokens": dt, "decode_ms": dms,
            "tokens_per_s": tps, "tpot_ms": 1e3 / tps if tps else None,
            "prefill_ms_mean": statistics.mean(r["prefill_ms"] for r in rows) if rows else None,
            "tau": new / fwd if fwd else None, "target_forwards": fwd,
            "matches_hf_greedy": sum(r["matches_hf_greedy"] for r in rows),
            "all_match_hf_greedy": all(r["matches_hf_greedy"] for r in rows),
        }
        if m.kind == "cure":
            out[m.name]["budgets"] = budget_table(rows)
    ceilings(out, results)
    for ref, key in ((CURE_AR, "speedup_vs_cure_ar"), (REFERENCE, "speedup_vs_hf_generate")):
        base = out.get(ref, {}).get("tokens_per_s")
        for name, s in out.items():
            s[key] = s["tokens_per_s"] / base if base and s["tokens_per_s"] else None
            # per-prompt ratios: the median is robust to one slow prompt
            ratios = []
            for r in results:
                if r["method"] != name:
                    continue
                b = next((x for x in results if x["method"] == ref and x["prompt_index"] == r["prompt_index"]), None)
                if b and b["tokens_per_s"] and r["tokens_per_s"]:
                    ratios.append(r["tokens_per_s"] / b["tokens_per_s"])
            s[key + "_per_prompt_median"] = statistics.median(ratios) if ratios else None
    return out


def ceilings(out: dict, results: list[dict]) -> None:
    """Each cure strategy's ceiling (cure_core.metrics.ceiling_speedup: tau x ar's time per token /
    its mean target verification time per block) and the share of that ceiling it achieved."""
    from cure_core.metrics import ceiling_speedup
    ar = out.get(CURE_AR)
    ar_tpot = ar["decode_ms"] / ar["decode_tokens"] if ar and ar["decode_tokens"] else None
    for name, s in out.items():
        rows = [r for r in results if r["method"] == name and "verify_ms" in r]
        fwd = sum(r["target_forwards"] for r in rows)
        verify = sum(r["verify_ms"] for r in rows) / fwd if fwd else None
        s["verify_ms_per_block"] = verify
        s["mean_tree_size"] = (sum(r["mean_tree_size"] * r["target_forwards"] for r in rows) / fwd) if fwd else None
        ceiling = ceiling_speedup(s["tau"] or 0.0, ar_tpot, verify) if rows and ar_tpot and verify else None
        achieved = s["tokens_per_s"] / ar["tokens_per_s"] if ceiling and ar["tokens_per_s"] and s["tokens_per_s"] else None
        s["ceiling_speedup"] = ceiling
        s["share_of_ceiling"] = achieved / ceiling if achieved else None


# ---------------------------------------------------------------- output

def render(console, summary: dict, n_prompts: int, title: str = "") -> None:
    from rich.table import Table

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    t = Table(title=f"peers{' ' + title if title else ''}: {n_prompts} prompt(s), greedy, prefill excluded")
    t.add_column("method", no_wrap=True)
    for col, just in ( ("decode tok", "right"), ("tok/s", "right"), ("TPOT ms", "right"),
                      ("prefill ms", "right"), ("tau", "right"), ("x cure ar", "right"), ("x HF gen", "right"),
                      ("ceiling", "right"), ("of ceiling", "right"), ("= HF greedy", "right")):
        t.add_column(col, justify=just)
    for name, s in summary.items():
        match = f"{s['matches_hf_greedy']}/{s['prompts']}"
        t.add_row(name, str(s["decode_tokens"]), f(s["tokens_per_s"], ".2f"), f(s["tpot_ms"], ".1f"),
                  f(s["prefill_ms_mean"], ".0f"), f(s["tau"], ".2f"), f(s["speedup_vs_cure_ar"], ".2f"),
                  f(s["speedup_vs_hf_generate"], ".2f"), f(s.get("ceiling_speedup"), ".2f"),
                  f(s.get("share_of_ceiling"), ".0%"),
                  match if s["all_match_hf_greedy"] else f"[red]{match}[/red]")
    console.print(t)


def _clean(obj):
    """JSON-safe: non-finite floats become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def parse_args(argv: Sequence[str] | None):
    ap = common.parser(__doc__)
    ap.add_argument("--strategies", default="ar,sd,parallel,cure,ddtree", help="comma list of cure strategies; 'cure:lookup=10' runs one with DecodeConfig fields changed, "
                    "'ddtree:attention=sdpa' with transformers' sdpa (K/V copies) instead of cure_core/attention.py's, "
                    "'cure:draft_dtype=bfloat16' over drafters loaded again in that dtype, 'cure:draft=PATH' over "
                    "another draft checkpoint")
    ap.add_argument("--hf", default="generate,assisted,prompt-lookup", help="transformers methods to run")
    common.add_sets(ap, default="humaneval")
    ap.add_argument("--hf-assistant-tokens", type=int, default=None,
                    help="fix HF assisted generation's draft length (constant schedule); default: HF's own")
    ap.add_argument("--prompt-lookup-tokens", type=int, default=10)
    ap.add_argument("--prompt-lookup-ngram", type=int, default=2)
    ap.add_argument("--warmup-tokens", type=int, default=8, help="tokens of each method's warm-up generation (0: none)")
    common.add_threads(ap)
    common.add_tiny(ap)
    ap.add_argument("--trace-tuner", action="store_true",
                    help="record, per block, the budget tuner's view before its choice (rates per candidate budget)")
    common.add_json(ap)
    ap.add_argument("--quiet", action="store_true", help="no per-generation progress lines")
    ap.add_argument("--order", choices=ORDERS, default="balanced",
                    help="methods' order within a prompt: balanced (a Williams design: each method in each "
                         "position and after each other method alike), or the listed order every prompt (as "
                         "runs before this option)")
    EngineArgs.add_cli_args(ap, exclude=("strategy", "temperature", "seed", "chat"), max_new_tokens=64)
    args = common.check(ap, ap.parse_args(argv))
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    from rich.console import Console
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 120))   # piped/captured: keep the table on one line per row
    threads, why = choose_threads(args.threads)
    torch.set_num_threads(threads)
    console.print(f"threads: {threads} ({why})")
    env = environment(threads, why, args.device, EngineArgs.from_cli_args(args).target_dtype())

    t_load = time.perf_counter()
    setup = load_setup(args)
    methods = build_methods(args, setup)
    load_s = time.perf_counter() - t_load
    for n in setup.notes:
        console.print(f"note: {n}")
    for s in setup.skipped:
        console.print(f"skipped {s['method']}: {s['reason']}")
    console.print(f"loaded in {load_s:.1f}s; {len(setup.prompts)} prompt(s); methods: "
                  + ", ".join(m.name for m in methods))

    # warm-up: one short generation per method on the first prompt. Assisted generation imports
    # sklearn lazily once it has enough draft statistics (its adaptive confidence threshold), which a
    # short warm-up may not reach: import it here so the import never lands inside a timed run.
    if any(m.name == "hf_assisted" for m in methods):
        try:
            import sklearn.metrics  # noqa: F401
        except ImportError:
            pass
    warm = min(args.warmup_tokens, args.max_new_tokens)
    if warm > 0:
        for m in methods:
            m.run(setup.prompts[0][2], warm)

    results: list[dict] = []
    total = len(setup.prompts) * len(methods)
    done = 0
    for pi, (set_name, tid, ids) in enumerate(setup.prompts):
        runs: dict[str, tuple[int, dict]] = {}
        for position, m in enumerate(run_order(methods, pi, args.order)):
            rec = runs[m.name] = (position, m.run(ids, args.max_new_tokens))
            done += 1
            if not args.quiet:
                tps = _rate(rec[1]["decode_tokens"], rec[1]["decode_ms"])
                console.print(f"[{done}/{total}] {tid} {m.name}: {len(rec[1]['tokens'])} tok, "
                              f"{'-' if tps is None else f'{tps:.2f}'} tok/s")
        # compared once every method has run: the reference need not run first
        for m in methods:                                # results in the methods' listed order
            position, rec = runs[m.name]
            ref = reference_of(m)
            mm = first_mismatch(rec["tokens"], runs[ref][1]["tokens"])
            tps = _rate(rec["decode_tokens"], rec["decode_ms"])
            results.append({"prompt_index": pi, "set": set_name, "task_id": tid, "method": m.name, "prompt_tokens": len(ids),
                            "new_tokens": len(rec["tokens"]), **rec, "tokens_per_s": tps,
                            "tpot_ms": 1e3 / tps if tps else None, "matches_hf_greedy": mm is None,
                            "first_mismatch": mm, "run_position": position})
            if mm is not None and not args.quiet:
                console.print(f"{tid} {m.name}: [red]differs from {ref} at token {mm}[/red]")

    summary = summarize_methods(methods, results)
    sets = sorted({r["set"] for r in results}, key=[x[0] for x in setup.prompts].index)
    per_set = {name: summarize_methods(methods, [r for r in results if r["set"] == name]) for name in sets}
    for name in sets if len(sets) > 1 else ():
        render(console, per_set[name], sum(1 for x in setup.prompts if x[0] == name), title=name)
    render(console, summary, len(setup.prompts), title=" + ".join(sets))
    env["load_average_end"] = common.load_average()
    report = _clean({
        "schema": SCHEMA,
        "environment": env,
        "config": {"draft_vocab": setup.models["draft_vocab"], "tiny": args.tiny, "limit": args.limit,
                   "max_new_tokens": args.max_new_tokens, "k": setup.config.k,
                   "v_max": args.v_max, "strategies": parse_list(args.strategies), "hf": parse_list(args.hf),
                   "warmup_tokens": warm, "temperature": 0.0,
                   "prompt_encoding": "raw for completion tasks (humaneval, mbpp), else the chat template",
                   "sets": ["tiny built-in"] if args.tiny else parse_list(args.sets),
                   "engine": {k: v for k, v in vars(args).items() if k in EngineArgs.__dataclass_fields__}},
        "models": setup.models,
        "timing": {"prefill": "excluded; hf: time of generate(max_new_tokens=1) with the same arguments, "
                              "subtracted from the full generate, decode tokens = new - 1; cure: engine prefill "
                              "timing, decode tokens = new",
                   "order": "warm-up per method, then prompt-major interleaving"
                            + (", the methods' order balanced over prompts (Williams design)"
                               if args.order == "balanced" else
                               ", the methods in their listed order every prompt"), "load_s": load_s},
        "methods": [{"name": m.name, "kind": m.kind, "lossless": True, "settings": m.settings} for m in methods],
        "skipped": setup.skipped,
        "notes": setup.notes,
        "summary": summary,
        "summary_per_set": per_set,
        "results": results,
    })
    return finish(report, args.json, setup, console)


def finish(report: dict, path: str | None, setup, console) -> dict:
    """A run's end, here and in llamacpp.py: the report written whole (or not at all), the tiny models'
    folder removed."""
    common.write_json(path, report, say=console.print)
    if setup.tmpdir is not None:
        setup.tmpdir.cleanup()
    return report


if __name__ == "__main__":
    common.entry(main)
