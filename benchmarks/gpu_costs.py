"""Verification cost curve and per-block engine overhead at realistic model shapes (for a GPU).

No weights can reach the GPU machines, so the target is RANDOMLY INITIALISED from a real config
(Qwen3-8B's shape by default) and the drafter is a small random causal LM used PARD-style. Random
models accept almost nothing, which does not matter here: this measures time, not acceptance.

    python benchmarks/gpu_costs.py --device cuda --shape qwen3-8b --out benchmarks/results/gpu_costs_h200.json
    python benchmarks/gpu_costs.py --device cuda --compile           # also the static-shape compiled path
    python benchmarks/gpu_costs.py --shape tiny --device cpu         # smoke run (the test does this)

1. Cost curve: one target forward over [root + V chain] on a context of --ctx tokens, for every
   V in --sizes and every KV layout (dynamic = transformers' DynamicCache, static = preallocated
   rows; with --compile also static shapes + torch.compile, CUDA graphs on a GPU). Median of
   --reps runs after warm-up runs (which compile, for the compiled layout).
2. Overhead: block wall time minus the time inside model forwards (synchronised), per strategy
   and budget, on the static layout: what the engine costs beyond the models.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cure_core.config import DecodeConfig
from cure_core.drafters.causal import PardDrafter
from cure_core.engine import Engine, ModelPair
from cure_core.lm import CachedLM
from cure_core.tiny import MASK_ID, perturbed_copy, tiny_config

# Real configs' shapes (random weights). Each draft is a 2-layer model sharing the vocabulary.
SHAPES = {
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936),
}
DRAFT = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16,
             num_key_value_heads=8, head_dim=64)


def synced_now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Clock:
    """Seconds inside the forwards of some modules; synchronises the device at each edge. Its hooks
    are registered after the cost curves: inside a compiled forward they would break the graph."""

    def __init__(self, device: torch.device, *modules):
        self.device, self.total, self._t = device, 0.0, 0.0
        for m in modules:
            m.register_forward_pre_hook(lambda *_: self._edge(True))
            m.register_forward_hook(lambda *_: self._edge(False))

    def now(self) -> float:
        return synced_now(self.device)

    def _edge(self, start: bool) -> None:
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


@torch.inference_mode()
def cost_curve(target, layout: dict, sizes, ctx_len: int, reps: int, warm: int) -> list[float]:
    vocab = int(target.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    lm = CachedLM(target, capacity=ctx_len + max(sizes) + 160, **layout)
    lm.prefill(torch.randint(0, vocab, (ctx_len,), generator=gen).tolist())
    out = []
    for v in sizes:
        toks = torch.randint(0, vocab, (v + 1,), generator=gen).tolist()
        runs = []
        for r in range(warm + reps):
            t0 = synced_now(lm.device)
            lm.forward(toks, [-1] + list(range(v))).logits.argmax(-1).tolist()
            if r >= warm:
                runs.append((synced_now(lm.device) - t0) * 1e3)
            lm.rollback()
        out.append(statistics.median(runs))
    return out


def overhead(pair, clock: Clock, cfg: DecodeConfig, prompt, blocks: int) -> dict:
    rows = []
    while len(rows) < blocks:
        gen = Engine(pair, cfg).generate(prompt)
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
    return {"strategy": cfg.strategy, "v_max": cfg.v_max, "blocks": len(rows),
            "mean_V": statistics.mean(r[2] for r in rows), "overhead_ms_median": statistics.median(oh),
            "overhead_ms_p90": oh[int(0.9 * (len(oh) - 1))], "block_ms_median": statistics.median(r[1] for r in rows)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b", choices=["tiny", *SHAPES])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--sizes", default="1,2,4,8,16,24,32,48,64,96,128", help="tree sizes V (root excluded)")
    ap.add_argument("--ctx", type=int, default=1024, help="context tokens already in the cache")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also time static shapes + torch.compile")
    ap.add_argument("--blocks", type=int, default=40, help="blocks per overhead measurement")
    ap.add_argument("--out", default=None, metavar="OUT.json")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.float32 if args.shape == "tiny" else getattr(torch, args.dtype)
    sizes = [int(s) for s in args.sizes.split(",")]
    t_build = time.perf_counter()
    target, draft, mask_id = build(args.shape, device, dtype)
    report = {"shape": args.shape, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "torch": torch.__version__, "ctx": args.ctx, "sizes": sizes, "build_s": time.perf_counter() - t_build,
              "cost_ms": {}, "overhead": []}
    layouts = {"dynamic": dict(kv="dynamic"), "static": dict(kv="static")}
    if args.compile:
        layouts["compiled"] = dict(kv="static", compile=True)
    for name, layout in layouts.items():
        warm = 3 if name == "compiled" else 1
        report["cost_ms"][name] = cost_curve(target, layout, sizes, args.ctx, args.reps, warm)
        print(f"cost {name:9}", " ".join(f"V{v}:{ms:.2f}" for v, ms in zip(sizes, report["cost_ms"][name])),
              flush=True)
    clock = Clock(device, target, draft)
    pair = ModelPair(target=target, drafter=PardDrafter(draft, mask_id, vocab_size=int(target.config.vocab_size)))
    prompt = torch.randint(0, int(target.config.vocab_size) - 1, (min(args.ctx, 256),),
                           generator=torch.Generator().manual_seed(1)).tolist()
    for strategy, v_max, extra in [("parallel", 15, {}), ("cure", 32, {"tau_margin": 100.0}),
                                   ("cure", 64, {"tau_margin": 100.0, "max_ufps": 3}), ("ddtree", 32, {}),
                                   ("ddtree", 64, {})]:
        cfg = DecodeConfig(strategy=strategy, v_max=v_max, max_new_tokens=10_000, stop_at_eos=False, **extra)
        overhead(pair, clock, cfg, prompt, 3)                                  # warm-up
        row = overhead(pair, clock, cfg, prompt, args.blocks)
        report["overhead"].append(row)
        print(f"overhead {strategy:8} V_max {v_max:3}: mean V {row['mean_V']:.1f}, "
              f"{row['overhead_ms_median']:.2f} ms median (p90 {row['overhead_ms_p90']:.2f}), "
              f"block {row['block_ms_median']:.2f} ms", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
