"""Verification cost curve and per-block engine overhead at realistic model shapes (for a GPU).

No weights can reach the GPU machines, so the target is RANDOMLY INITIALISED from a real config
(Qwen3-8B's shape by default) and the drafters are a small random causal LM used PARD-style and a
DFlash drafter initialised as training starts it. Random models accept almost nothing, which does
not matter here: this measures time (and, with --lossless, correctness on tiny models), not acceptance.
Results of the H200 runs and their commands: benchmarks/results/SUMMARY.md, section GPU.

    python benchmarks/gpu_costs.py --device cuda --lossless 10 --compile --out gpu_costs.json
    python benchmarks/gpu_costs.py --device cuda --stages cost --compile   # eager vs CUDA-graph curves only
    python benchmarks/gpu_costs.py --shape tiny --device cpu               # smoke run (the test does this)

1. Cost curve: one target forward over [root + V chain] on a context of --ctx tokens, for every
   V in --sizes and every KV layout (dynamic = transformers' DynamicCache, static = preallocated
   rows; with --compile also static shapes + torch.compile, CUDA graphs on a GPU). Median of
   --reps runs after warm-up runs (which compile, for the compiled layout).
2. Overhead: block wall time minus the time inside model forwards (synchronised), per drafter
   (PARD-style causal, DFlash), strategy and budget, on the static layout: what the engine costs
   beyond the models. One row runs `--v-max auto` and records the budgets the tuner chose.
3. With --lossless N: every strategy (and the compiled, dynamic-KV and auto-budget paths) against
   `ar` on N prompts with tiny float32 models ON THIS DEVICE: the GPU's kernels differ from the CPU's.
4. The tuner's own cost curve (budget.measure_cost_curve, what `--v-max auto` measures at start-up).
5. e2e (SYNTHETIC): tokens/s, tau and per-block host overhead per strategy (ar, parallel, ddtree, cure
   best-first and paper, fixed budgets and `--v-max auto`) with the synthetic benchmark drafter
   (synthetic_drafter.py): proposals drawn to agree with the target's greedy output at a per-depth rate
   (default: a chain tau of 6.5 at K=16, the published DFlash-8B regime), beside the random DFlash
   drafter whose forwards it runs for their cost, so that trees on random weights have realistic sizes.
   Eager, and compiled too with --compile. Every output must equal ar's. Labelled SYNTHETIC in the JSON
   (`e2e_synthetic`) and the printout: it is not a real drafter's acceptance.

    python benchmarks/gpu_costs.py --device cuda --stages e2e --compile --compile-sizes 1,16,64 --out e2e.json

Stages run in that order: lossless, cost curves (eager layouts), tuner curve, overhead, e2e eager,
compiled curve, e2e compiled; the JSON is rewritten after each, and stages that would start after --deadline seconds are
skipped (recorded as such), so a lease that runs short still returns what was measured.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cure_core.budget import measure_cost_curve
from cure_core.config import STRATEGIES, DecodeConfig
from cure_core.drafters.dflash import STATIC_BLOCKS, default_target_layer_ids
from cure_core.engine import Engine, ModelPair, generate_ids
from cure_core.models import build_pair
from cure_core.lm import PAD_SIZES, CachedLM, padded_size
from cure_core.tiny import BYTE_VOCAB, MASK_ID, perturbed_copy, tiny_config, tiny_target
from cure_core.training.dflash_train import build_model, draft_config_dict, init_from_target

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from synthetic_drafter import Profile, SyntheticDrafter, expected_tau, profile_for_tau  # noqa: E402

# Real configs' shapes (random weights). Each draft is a 2-layer model sharing the vocabulary.
SHAPES = {
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936),
}
DRAFT = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16,
             num_key_value_heads=8, head_dim=64)
DFLASH_LAYERS = 5                  # z-lab's Qwen3-8B-DFlash-b16 has 5 draft layers over 5 target layers


def synced_now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Clock:
    """Seconds inside the forwards of some modules; synchronises the device at each outermost edge
    (nested watched modules, e.g. the target's head called by a DFlash drafter, count once). Its
    hooks are removed (`close`) before the compiled curve: inside a compiled forward they would break
    the graph."""

    def __init__(self, device: torch.device, *modules):
        self.device, self.total, self._t, self._depth = device, 0.0, 0.0, 0
        self._hooks: list = []
        self._wrapped: list = []                   # (object, attribute, original callable)
        self.watch(*modules)

    def watch(self, *modules) -> None:
        for m in modules:
            self._hooks.append(m.register_forward_pre_hook(lambda *_: self._edge(True)))
            self._hooks.append(m.register_forward_hook(lambda *_: self._edge(False)))

    def wrap(self, obj, name: str) -> None:
        """Count the time inside `obj.name(...)` (a callable attribute) too: for what a hook cannot watch
        (a compiled forward, whose hooks would break its graph) and the drafter's own methods."""
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            self._edge(True)
            try:
                return fn(*args, **kwargs)
            finally:
                self._edge(False)
        setattr(obj, name, timed)
        self._wrapped.append((obj, name, fn))

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for obj, name, fn in reversed(self._wrapped):
            setattr(obj, name, fn)
        self._wrapped = []

    def now(self) -> float:
        return synced_now(self.device)

    def _edge(self, start: bool) -> None:
        self._depth += 1 if start else -1
        if self._depth == (1 if start else 0):           # outermost edge only
            t = self.now()
            if start:
                self._t = t
            else:
                self.total += t - self._t


def build(shape: str, device: torch.device, dtype: torch.dtype):
    """(target, draft, mask id): random models of the named shape."""
    if shape == "tiny":
        torch.manual_seed(0)
        target = Qwen3ForCausalLM(tiny_config()).eval()
        return target.to(device), perturbed_copy(target, 0.3).to(device), MASK_ID
    common = dict(max_position_embeddings=40960, rope_theta=1_000_000.0, tie_word_embeddings=False,
                  attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        target = Qwen3ForCausalLM(Qwen3Config(**SHAPES[shape], **common)).to(dtype).eval()
        draft = Qwen3ForCausalLM(Qwen3Config(**DRAFT, vocab_size=SHAPES[shape]["vocab_size"], **common)).to(dtype).eval()
    return target, draft, SHAPES[shape]["vocab_size"] - 1


def dflash_network(target, mask_id: int, block_size: int = 16, n_layers: int = DFLASH_LAYERS):
    """A DFlash network initialised as training starts it (every draft layer a copy of the target's
    last layer): the real drafter's shapes and forward; build_pair gives it the target's embedding and head."""
    n_target = int(target.config.num_hidden_layers)
    n_layers = min(n_layers, n_target)
    layer_ids = default_target_layer_ids(n_target, n_layers)
    p = next(target.parameters())
    cfg = draft_config_dict(target.config, layer_ids, n_layers, block_size, mask_id, attention_bias=False)
    with torch.device(p.device):
        model = build_model(cfg, target.config).to(p.dtype)
    init_from_target(model, target, layer_ids)
    return model.eval()


# Prompts for the lossless check (bytes: the tiny models' vocabulary), of varied lengths.
PROMPTS = [b"def fibonacci(n):\n    ", b"import os\n", b"x", b"class Stack:\n    def push(self, item):\n",
           b"for i in range(10):\n    print(i * i)\n", b"SELECT name FROM users WHERE", b"The quick brown fox",
           b"    return [a + b for a, b in zip(xs, ys)]\n\ndef main():", b"{", b"# sort a list\n"]

# Configurations the lossless check runs: (label, DecodeConfig overrides); each strategy at several
# shapes, plus the execution paths (dynamic KV, compiled static shapes, auto budget).
LOSSLESS_CONFIGS = [
    *[(f"{s}-k{k}", dict(strategy=s, k=k, v_max=max(k - 1, 24), tau_margin=3.0, max_ufps=2))
      for s in STRATEGIES[1:] for k in (4, 8)],
    ("cure-k16-paper", dict(strategy="cure", k=16, v_max=64)),
    ("ddtree-k16-v64", dict(strategy="ddtree", k=16, v_max=64)),
    ("cure-dynamic-kv", dict(strategy="cure", k=6, v_max=20, tau_margin=3.0, kv_cache="dynamic")),
    ("cure-auto-budget", dict(strategy="cure", k=8, v_max=32, auto_budget=True)),
    ("cure-compiled", dict(strategy="cure", k=5, v_max=12, tau_margin=3.0, compile=True)),
]


def lossless(device: torch.device, n_prompts: int, new_tokens: int = 24, only: tuple[str, ...] = ()) -> dict:
    """Every configuration (or those labelled in `only`) against `ar` (dynamic KV) on tiny float32
    models on `device`; compiled runs use 3 prompts (each padded shape compiles once)."""
    target = tiny_target(seed=0)
    draft = perturbed_copy(target, noise=0.2, seed=1).to(device)
    target = target.to(device)
    pairs = {"pard": build_pair(target, draft, drafter="pard", mask_token_id=MASK_ID, vocab_size=BYTE_VOCAB)[0],
             "dflash": build_pair(target, dflash_network(target, MASK_ID, block_size=8, n_layers=2), ar_draft=draft,
                                  vocab_size=BYTE_VOCAB)[0]}
    prompts = [list(PROMPTS[i % len(PROMPTS)] * (1 + i // len(PROMPTS))) for i in range(n_prompts)]
    base = dict(max_new_tokens=new_tokens, stop_at_eos=False)
    rows, accepted = [], 0
    for drafter, pair in pairs.items():
        refs = [generate_ids(pair, DecodeConfig.of(strategy="ar", kv_cache="dynamic", **base), p) for p in prompts]
        for label, conf in LOSSLESS_CONFIGS:
            if only and label not in only:
                continue
            cfg = DecodeConfig.of(**base, **conf)
            use = prompts[:3] if cfg.execution.compile else prompts
            t0 = time.perf_counter()
            bad, tau, error = [], [], None
            try:
                for i, prompt in enumerate(use):
                    out, emitted = [], []
                    for block in Engine(pair, cfg).generate(prompt):
                        out.extend(block.emitted)
                        emitted.append(len(block.emitted))
                    if out != refs[i]:
                        bad.append(i)
                    tau.append(sum(emitted) / max(len(emitted), 1))
            except Exception as e:                        # noqa: BLE001 -- one path failing is a result too
                error = f"{type(e).__name__}: {e}"
            accepted += len(tau) - len(bad)
            rows.append({"drafter": drafter, "config": label, "prompts": len(tau), "mismatched": bad,
                         "mean_tau": statistics.mean(tau) if tau else None, "error": error,
                         "seconds": time.perf_counter() - t0})
            print(f"lossless {drafter:6} {label:18} {len(tau) - len(bad)}/{len(tau)} equal ar"
                  + (f", tau {rows[-1]['mean_tau']:.2f}" if tau else "") + (f", ERROR {error}" if error else ""),
                  flush=True)
    return {"new_tokens": new_tokens, "runs": rows, "equal": accepted,
            "total": sum(r["prompts"] for r in rows)}


@torch.inference_mode()
def cost_curve(target, layout: dict, sizes, ctx_len: int, reps: int, warm: int, late=lambda: False,
               profile_at=(), profiles: list | None = None) -> list[float]:
    """Median ms per size; stops early (fewer entries) once `late()` says the deadline has passed. Sizes in
    `profile_at` are also profiled (`profile_forward`) on the same cache, so no graph compiles twice (a new
    cache's buffers are new static addresses: a recompilation); their rows go to `profiles`."""
    vocab = int(target.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    lm = CachedLM(target, capacity=ctx_len + max(sizes) + 160, **layout)
    lm.prefill(torch.randint(0, vocab, (ctx_len,), generator=gen).tolist())
    out = []
    for v in sizes:
        if late():
            break
        toks = torch.randint(0, vocab, (v + 1,), generator=gen).tolist()
        runs = []
        for r in range(warm + reps):
            t0 = synced_now(lm.device)
            lm.forward(toks, [-1] + list(range(v))).logits.argmax(-1).tolist()
            if r >= warm:
                runs.append((synced_now(lm.device) - t0) * 1e3)
            lm.rollback()
        out.append(statistics.median(runs))
        if v in profile_at and profiles is not None:
            profiles.append({"layout": dict(layout), **profile_forward(lm, toks)})
    return out


@torch.inference_mode()
def profile_forward(lm: CachedLM, toks: list[int], reps: int = 3, top: int = 25) -> dict:
    """What one verify forward over [root + chain `toks`] on a warm cache is made of: torch.profiler over
    `reps` forwards, the `top` ops by self device time (CPU time on a CPU). The question it answers: where
    the compiled forward's time goes against the HBM roofline (#13: 9.0 ms measured, 3.4 ms for 16 GB of
    bf16 weights at 4.8 TB/s): the weight GEMMs, attention over the cache, or the rest."""
    from torch.profiler import ProfilerActivity, profile
    v = len(toks) - 1

    def once() -> None:
        lm.forward(toks, [-1] + list(range(v))).logits.argmax(-1).tolist()
        lm.rollback()
    cuda = lm.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = synced_now(lm.device)
    with profile(activities=acts) as prof:
        for _ in range(reps):
            once()
    wall = (synced_now(lm.device) - t0) / reps * 1e3
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: -getattr(e, key))
    total = sum(getattr(e, key) for e in events) / reps / 1e3
    rows = [{"op": e.key[:120], "ms_per_forward": getattr(e, key) / reps / 1e3, "calls_per_forward": e.count / reps}
            for e in events[:top]]
    return {"v": v, "wall_ms_profiled": wall, "self_time_ms_total": total, "clock": "device" if cuda else "cpu",
            "top": rows}


def overhead(pair, clock: Clock, cfg: DecodeConfig, prompt, blocks: int) -> dict:
    rows = []                                                # (overhead ms, block ms, tree size)
    while len(rows) < blocks:
        engine = Engine(pair, cfg)
        gen = engine.generate(prompt)
        while len(rows) < blocks:
            model0, t0 = clock.total, clock.now()
            try:
                block = next(gen)
            except StopIteration:
                break
            wall = clock.now() - t0
            if block.index > 0:                              # block 0 includes the prefill
                rows.append(((wall - (clock.total - model0)) * 1e3, wall * 1e3, block.tree_size))
        gen.close()
    oh = sorted(r[0] for r in rows)
    return {"strategy": cfg.strategy, "v_max": "auto" if cfg.auto_budget else cfg.v_max, "blocks": len(rows),
            "mean_V": statistics.mean(r[2] for r in rows), "tree_sizes": [r[2] for r in rows],
            "overhead_ms_median": statistics.median(oh),
            "overhead_ms_p90": oh[int(0.9 * (len(oh) - 1))], "block_ms_median": statistics.median(r[1] for r in rows)}


# End-to-end rows over the SYNTHETIC drafter (stage e2e): (label, DecodeConfig overrides), at the synthetic
# block size (--synthetic-k). Prompt lookup is off for cure: a random target repeats itself, which the
# lookup graft would exploit as no real model lets it.
E2E_RUNS = [("ar", dict(strategy="ar")), ("parallel", dict(strategy="parallel", v_max=15)),
            ("ddtree-v32", dict(strategy="ddtree", v_max=32)), ("ddtree-v64", dict(strategy="ddtree", v_max=64)),
            ("cure-v32", dict(strategy="cure", v_max=32)), ("cure-v64", dict(strategy="cure", v_max=64)),
            ("cure-auto", dict(strategy="cure", v_max=64, auto_budget=True)),
            ("cure-paper-v64", dict(strategy="cure", cure_tree="paper", v_max=64))]


def timed_target(clock: Clock, lm: CachedLM, done: set) -> None:
    """Count the time inside a target cache's forwards (compiled ones included) on `clock`, once per cache.
    Rule: where the cache's compiled and eager forwards are one function they stay one (CachedLM tells a
    prefill's eager forward by identity, to run the head over one row)."""
    if id(lm) in done:
        return
    done.add(id(lm))
    same = lm.run is lm.eager
    clock.wrap(lm, "eager")
    if same:
        lm.run = lm.eager
    else:
        clock.wrap(lm, "run")


def count_syncs(fn) -> tuple[object, dict[str, int]]:
    """Run fn() with CUDA's sync debug mode on warn: every operation that makes the host wait for the device
    (a device-to-host read: .tolist(), .item(), .cpu(); a pageable copy) warns from the line that called it.
    Returns (fn's result, {"file:line": count}) for the lines in this project (#13 item 4: one device-to-host
    read per block at most). Off a GPU nothing warns and the counts are empty."""
    import warnings
    sites: dict[str, int] = {}
    cuda = torch.cuda.is_available()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" in str(w.message):
            where = w.filename.split("/cure_core/")[-1] if "/cure_core/" in w.filename else w.filename.rsplit("/", 1)[-1]
            key = f"{where}:{w.lineno}"
            sites[key] = sites.get(key, 0) + 1
    return out, sites


def every_padded_size(lm: CachedLM, rows: int) -> None:
    """Run a compiled cache's forward once at every padded size up to `rows`, on the capacity the engine left
    it (its buffers are kept), so that no timed block compiles: the warm-up generation meets only the tree
    sizes its own blocks happened to verify."""
    vocab = int(lm.config.vocab_size)
    lm.reset(lm.capacity)
    lm.prefill(list(range(1, 9)))
    for n in PAD_SIZES:
        if n > padded_size(rows):
            break
        lm.forward([(7 * i) % vocab for i in range(n)], [-1] + list(range(n - 1)))
        lm.rollback()
    lm.reset(lm.capacity)


def e2e(target, drafter: SyntheticDrafter, clock: Clock, runs, prompts, new_tokens: int, k: int,
        compile: bool, late=lambda: False) -> list[dict]:
    """Tokens/s and per-block host overhead per strategy over the SYNTHETIC drafter (synthetic_drafter.py).
    Per prompt: `ar` first (its output is what the drafter is told to agree with, and the reference every
    other run must equal), then every other run in an order rotated per prompt; one untimed generation per
    run first (compilation, the tuner's curve). Decode time is every block after block 0 (which holds the
    prefill); host overhead is a block's wall time minus the time inside the target's and the drafter's
    forwards and the synthetic draws."""
    pair = ModelPair(target=target, drafter=drafter)
    engine = Engine(pair)
    base = dict(k=k, max_new_tokens=new_tokens, stop_at_eos=False, compile=compile, kv_cache="static")
    cfgs = {label: DecodeConfig.of(**base, **({"lookup": 0} if conf["strategy"] == "cure" else {}), **conf)
            for label, conf in runs}
    wrapped: set = set()
    stats = {label: {"tokens": 0, "seconds": 0.0, "blocks": 0, "tree": [], "overhead": [], "equal": 0, "prompts": 0}
             for label in cfgs}

    def run(label: str, prompt, record: bool) -> list[int]:
        cfg = cfgs[label]
        timed_target(clock, engine.target_for(cfg), wrapped)
        out, st = [], stats[label]
        gen = engine.generate(prompt, cfg)
        while True:
            model0, syn0, t0 = clock.total, drafter.seconds, clock.now()
            try:
                block = next(gen)
            except StopIteration:
                break
            wall = clock.now() - t0
            out.extend(block.emitted)
            if record and block.index > 0:                     # block 0 holds the prefill
                st["tokens"] += len(block.emitted)
                st["seconds"] += wall
                st["blocks"] += 1
                st["tree"].append(block.tree_size)
                st["overhead"].append((wall - (clock.total - model0) - (drafter.seconds - syn0)) * 1e3)
        return out

    labels = [label for label in cfgs if label != "ar"]
    if prompts:                                                # warm-up: compile every shape, learn the curve
        drafter.expect(list(prompts[0]) + run("ar", prompts[0], False))
        for label in labels:
            run(label, prompts[0], False)
        if compile:
            for label, cfg in cfgs.items():
                every_padded_size(engine.target_for(cfg), cfg.v_max + 1 if cfg.strategy != "ar" else 1)
            inner = drafter.inner
            if getattr(inner, "static", False):                # a DFlash drafter's static passes: every block count
                for count in STATIC_BLOCKS[:3]:                # a proposal and the re-draft pass may ask for
                    inner.forward_blocks([[inner.mask_token_id] * inner.block_size] * count)
    last = None                                                # the last timed prompt: the drafter expects its output
    for i, prompt in enumerate(prompts[1:]):
        if late():
            break
        ref = run("ar", prompt, True)
        stats["ar"]["prompts"] += 1
        stats["ar"]["equal"] += 1
        drafter.expect(list(prompt) + ref)
        last = prompt
        for label in labels[i % len(labels):] + labels[:i % len(labels)]:
            out = run(label, prompt, True)
            stats[label]["prompts"] += 1
            stats[label]["equal"] += out == ref
    # one more generation per run under CUDA's sync debug mode: the host's waits for the device, per block
    syncs = {}
    if last is not None and torch.cuda.is_available() and not late():
        for label in cfgs:
            n_blocks = [0]

            def one(label=label):
                for _ in engine.generate(last, cfgs[label]):
                    n_blocks[0] += 1
            _, sites = count_syncs(one)
            syncs[label] = {"per_block": sum(sites.values()) / max(n_blocks[0], 1), "sites": sites}
    ar_rate = stats["ar"]["tokens"] / stats["ar"]["seconds"] if stats["ar"]["seconds"] else None
    rows = []
    for label, st in stats.items():
        rate = st["tokens"] / st["seconds"] if st["seconds"] else None
        oh = sorted(st["overhead"])
        rows.append({"label": label, "strategy": cfgs[label].strategy, "cure_tree": cfgs[label].cure_tree,
                     "v_max": "auto" if cfgs[label].auto_budget else cfgs[label].v_max, "compiled": compile,
                     "prompts": st["prompts"], "equal_ar": st["equal"], "blocks": st["blocks"],
                     "tau": st["tokens"] / st["blocks"] if st["blocks"] else None, "tok_s": rate,
                     "speedup_vs_ar": rate / ar_rate if rate and ar_rate else None,
                     "mean_V": statistics.mean(st["tree"]) if st["tree"] else None,
                     "block_ms_mean": st["seconds"] / st["blocks"] * 1e3 if st["blocks"] else None,
                     "overhead_ms_median": statistics.median(oh) if oh else None,
                     "overhead_ms_p90": oh[int(0.9 * (len(oh) - 1))] if oh else None,
                     "syncs": syncs.get(label)})
        r = rows[-1]
        if r["tok_s"] is not None:
            print(f"e2e SYNTHETIC {label:15} {r['tok_s']:8.1f} tok/s ({r['speedup_vs_ar']:.2f}x ar), tau {r['tau']:.2f}, "
                  f"mean V {r['mean_V']:.1f}, overhead {r['overhead_ms_median']:.2f} ms/block, "
                  f"{r['equal_ar']}/{r['prompts']} equal ar"
                  + (f", {r['syncs']['per_block']:.1f} host syncs/block" if r["syncs"] else ""), flush=True)
    return rows


# Overhead rows: (drafter, strategy, v_max, DecodeConfig overrides). tau_margin=100 makes every
# position a UFP, so cure really grafts repairs (random drafts have no natural margins to gate on).
OVERHEAD_RUNS = [("pard", "parallel", 15, {}), ("pard", "cure", 32, {"tau_margin": 100.0}),
                 ("pard", "cure", 64, {"tau_margin": 100.0, "max_ufps": 3}), ("pard", "ddtree", 32, {}),
                 ("pard", "ddtree", 64, {}), ("dflash", "parallel", 15, {}),
                 ("dflash", "cure", 64, {"tau_margin": 100.0, "max_ufps": 3}), ("dflash", "ddtree", 64, {}),
                 ("dflash", "cure", 64, {"auto_budget": True})]


def main(argv=None) -> dict:
    ap = common.parser(__doc__)
    ap.add_argument("--shape", default="qwen3-8b", choices=["tiny", *SHAPES])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--sizes", default="1,2,4,8,16,24,32,48,64,96,128", help="tree sizes V (root excluded)")
    ap.add_argument("--ctx", type=int, default=1024, help="context tokens already in the cache")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also time static shapes + torch.compile")
    ap.add_argument("--compile-sizes", default=None, help="tree sizes for the compiled curve (default: --sizes); "
                    "every padded size is one compilation")
    ap.add_argument("--blocks", type=int, default=40, help="blocks per overhead measurement")
    ap.add_argument("--profile-sizes", default="", metavar="V,V",
                    help="with --compile: torch.profiler over the compiled verify forward at these tree sizes, "
                         "on the compiled curve's cache (among --compile-sizes; the top ops by device time: "
                         "`profile_compiled` in the JSON)")
    ap.add_argument("--lossless", type=int, default=0, metavar="N",
                    help="first check every strategy against ar on N prompts with tiny float32 models here")
    ap.add_argument("--lossless-only", default="", metavar="LABELS",
                    help="comma list of lossless configurations to run (default: all), e.g. cure-compiled")
    ap.add_argument("--stages", default="cost,tuner,overhead,e2e",
                    help="comma list of the 8B-shape stages to run: cost (eager curves), tuner, overhead, e2e "
                         "(tokens/s per strategy over the SYNTHETIC drafter; compiled too with --compile). "
                         "--lossless and --compile add theirs")
    ap.add_argument("--synthetic-tau", type=float, default=6.5,
                    help="e2e: the chain tau the SYNTHETIC drafter's constant per-depth agreement is solved for "
                         "(at --synthetic-k; 6.5 at 16 is the published DFlash-8B regime)")
    ap.add_argument("--synthetic-rates", default="", metavar="R1,R2,...",
                    help="e2e: per-depth agreement rates instead (depth 1 first; the last one repeats)")
    ap.add_argument("--synthetic-below-miss", type=float, default=1.0,
                    help="e2e: agreement multiplier for a block's rows below its first miss (1: a block-parallel "
                         "drafter's rows do not depend on the rows above)")
    ap.add_argument("--synthetic-k", type=int, default=16, help="e2e: the block size K")
    ap.add_argument("--synthetic-inner", default="dflash", choices=["dflash", "none"],
                    help="e2e: a real (random) drafter run beside the synthetic one for its cost, or none")
    ap.add_argument("--e2e-runs", default="", metavar="LABELS",
                    help=f"e2e: comma list of the runs to time (default all: {', '.join(l for l, _ in E2E_RUNS)}); "
                         "ar always runs (it is the reference)")
    ap.add_argument("--e2e-modes", default="eager,compiled", metavar="MODES",
                    help="e2e: eager, compiled (needs --compile) or both; compiled runs after the compiled curve")
    ap.add_argument("--e2e-prompts", type=int, default=4, help="e2e: random prompts (one more warms up)")
    ap.add_argument("--e2e-tokens", type=int, default=256, help="e2e: new tokens per generation")
    ap.add_argument("--e2e-prompt-len", type=int, default=128, help="e2e: prompt tokens")
    ap.add_argument("--deadline", type=float, default=None, metavar="S",
                    help="skip the stages that would start after S seconds (the JSON records them)")
    common.add_json(ap)
    args = common.check(ap, ap.parse_args(argv))
    t_start = time.perf_counter()
    device = torch.device(args.device)
    dtype = torch.float32 if args.shape == "tiny" else getattr(torch, args.dtype)
    sizes = [int(s) for s in args.sizes.split(",")]
    report = {"shape": args.shape, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "ctx": args.ctx, "sizes": sizes, "cost_ms": {}, "overhead": [], "skipped": [], "errors": {}}

    def late() -> bool:
        return args.deadline is not None and time.perf_counter() - t_start > args.deadline

    def save() -> None:
        report["seconds"] = time.perf_counter() - t_start
        common.write_json(args.json, report, say=None)

    def stage(name: str, fn) -> None:
        """Run one stage unless past the deadline; record its error instead of losing the others."""
        if late():
            report["skipped"].append(name)
            print(f"skipped {name}: past the {args.deadline:.0f} s deadline", flush=True)
            return
        try:
            fn()
        except Exception as e:                            # noqa: BLE001 -- a stage's failure is a result too
            report["errors"][name] = f"{type(e).__name__}: {e}"
            print(f"error in {name}: {type(e).__name__}: {e}", flush=True)
        save()

    stages = set(args.stages.split(",")) - {""}
    known = {"cost", "tuner", "overhead", "e2e"}
    if stages - known:
        ap.error(f"unknown stages {sorted(stages - known)}; choose from {', '.join(sorted(known))}")
    try:
        rates = tuple(float(r) for r in args.synthetic_rates.split(",") if r.strip())
        profile = Profile(rates or profile_for_tau(args.synthetic_tau, args.synthetic_k),
                          below_miss=args.synthetic_below_miss)                 # checks its own bounds
    except ValueError as e:
        ap.error(f"synthetic drafter: {e}")
    at = [int(s) for s in args.compile_sizes.split(",")] if args.compile_sizes else sizes
    profile_at = tuple(int(x) for x in args.profile_sizes.split(",") if x.strip())
    if set(profile_at) - set(at) or (profile_at and not args.compile):
        ap.error("--profile-sizes needs --compile and sizes among the compiled curve's (--compile-sizes)")
    e2e_modes = {x for x in args.e2e_modes.split(",") if x}
    if e2e_modes - {"eager", "compiled"}:
        ap.error(f"unknown e2e modes {sorted(e2e_modes - {'eager', 'compiled'})}; choose eager, compiled")
    e2e_only = {x for x in args.e2e_runs.split(",") if x}
    if e2e_only - {label for label, _ in E2E_RUNS}:
        ap.error(f"unknown e2e runs {sorted(e2e_only - {l for l, _ in E2E_RUNS})}")
    e2e_runs = [(label, conf) for label, conf in E2E_RUNS if not e2e_only or label in e2e_only or label == "ar"]
    only = tuple(x for x in args.lossless_only.split(",") if x)
    if set(only) - {label for label, _ in LOSSLESS_CONFIGS}:
        ap.error(f"unknown lossless configurations {sorted(set(only) - {l for l, _ in LOSSLESS_CONFIGS})}")
    if args.lossless:
        stage("lossless", lambda: report.update(lossless=lossless(device, args.lossless, only=only)))
    t_build = time.perf_counter()
    target, draft, mask_id = build(args.shape, device, dtype)
    report["build_s"] = time.perf_counter() - t_build

    def curve(name: str, layout: dict, at, profile_at=()) -> None:
        warm = 3 if layout.get("compile") else 1
        profiles = report.setdefault("profile_compiled", []) if profile_at else None
        report["cost_ms"][name] = dict(zip(at, cost_curve(target, layout, at, args.ctx, args.reps, warm, late,
                                                          profile_at, profiles)))
        print(f"cost {name:9}", " ".join(f"V{v}:{ms:.2f}" for v, ms in report["cost_ms"][name].items()), flush=True)
        for row in profiles or ():
            print(f"profile {name} V{row['v']}: {row['wall_ms_profiled']:.2f} ms a forward; top: "
                  + "; ".join(f"{r['op'][:40]} {r['ms_per_forward']:.2f}" for r in row["top"][:5]), flush=True)

    for name in ("dynamic", "static") if "cost" in stages else ():
        stage(f"cost_{name}", lambda name=name: curve(name, dict(kv=name), sizes))

    def tuner_curve() -> None:
        c = measure_cost_curve(target, max_size=64, use_disk_cache=False)
        report["tuner_curve"] = c.to_dict()
        print("tuner curve", " ".join(f"V{v}:{ms:.2f}" for v, ms in zip(c.sizes, c.verify_ms)), flush=True)
    if "tuner" in stages:
        stage("tuner_curve", tuner_curve)

    clock = Clock(device, target, draft)
    vocab = int(target.config.vocab_size)
    drafters = {"pard": lambda: build_pair(target, draft, drafter="pard", mask_token_id=mask_id, vocab_size=vocab)[0].drafter,
                "dflash": lambda: build_pair(target, dflash_network(target, mask_id), vocab_size=vocab)[0].drafter}
    built: dict = {}
    prompt = torch.randint(0, int(target.config.vocab_size) - 1, (min(args.ctx, 256),),
                           generator=torch.Generator().manual_seed(1)).tolist()
    for drafter, strategy, v_max, extra in OVERHEAD_RUNS if "overhead" in stages else ():
        def one(drafter=drafter, strategy=strategy, v_max=v_max, extra=extra) -> None:
            if drafter not in built:
                built[drafter] = drafters[drafter]()
                if drafter == "dflash":                  # its network and the target's embedding/head it calls
                    clock.watch(built[drafter].model, target.get_input_embeddings(), target.lm_head)
            pair = ModelPair(target=target, drafter=built[drafter])
            cfg = DecodeConfig.of(strategy=strategy, v_max=v_max, max_new_tokens=10_000, stop_at_eos=False, **extra)
            overhead(pair, clock, cfg, prompt, 3)                                  # warm-up
            row = {"drafter": drafter, **overhead(pair, clock, cfg, prompt, args.blocks)}
            report["overhead"].append(row)
            print(f"overhead {drafter:6} {strategy:8} V_max {row['v_max']!s:4}: mean V {row['mean_V']:.1f}, "
                  f"{row['overhead_ms_median']:.2f} ms median (p90 {row['overhead_ms_p90']:.2f}), "
                  f"block {row['block_ms_median']:.2f} ms", flush=True)
        stage(f"overhead_{drafter}_{strategy}_{v_max}{'_auto' if extra.get('auto_budget') else ''}", one)

    clock.close()
    built.clear()                                          # free the drafters' buffers before compiling

    def synthetic_e2e(compiled: bool) -> None:
        """Stage e2e: every row's numbers are SYNTHETIC (the drafter is told the target's output)."""
        inner = drafters["dflash"]() if args.synthetic_inner == "dflash" else None
        drafter = SyntheticDrafter(profile, vocab, args.synthetic_k, inner=inner, mask_token_id=mask_id)
        e2e_clock = Clock(device)
        if inner is not None:
            for name in ("propose", "redraft_topk", "prefill"):
                e2e_clock.wrap(inner, name)
        gen = torch.Generator().manual_seed(2)
        prompts = [torch.randint(0, vocab - 1, (args.e2e_prompt_len,), generator=gen).tolist()
                   for _ in range(args.e2e_prompts + 1)]
        try:
            rows = e2e(target, drafter, e2e_clock, e2e_runs, prompts, args.e2e_tokens, args.synthetic_k,
                       compiled, late)
        finally:
            e2e_clock.close()
        entry = report.setdefault("e2e_synthetic", {
            "label": "SYNTHETIC drafter: proposals drawn to agree with the target's greedy output "
                     "(benchmarks/synthetic_drafter.py); not a real drafter's acceptance",
            "profile": {"rates": list(profile.rates), "below_miss": profile.below_miss, "k": args.synthetic_k,
                        "expected_chain_tau": expected_tau(profile.rates, args.synthetic_k)},
            "inner": args.synthetic_inner, "new_tokens": args.e2e_tokens, "prompt_len": args.e2e_prompt_len,
            "runs": []})
        entry["runs"].extend(rows)

    if "e2e" in stages and "eager" in e2e_modes:
        stage("e2e_eager", lambda: synthetic_e2e(False))
    if args.compile:
        stage("cost_compiled", lambda: curve("compiled", dict(kv="static", compile=True), at, profile_at))
        if "e2e" in stages and "compiled" in e2e_modes:
            stage("e2e_compiled", lambda: synthetic_e2e(True))
        try:
            from torch._dynamo.utils import counters
            report["compile_counters"] = {k: dict(v) for k, v in counters.items() if k in ("inductor", "stats")}
        except Exception:                                  # noqa: BLE001 -- diagnostics only
            pass
    save()
    if args.json:
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    common.entry(main)
