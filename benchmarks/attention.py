"""One tree forward's time with cure's grouped attention against transformers' sdpa (cure_core/attention.py),
by cached context length and node count, on a real model in one process, interleaved.

    python benchmarks/attention.py [--target qwen-coder-0.5b] [--contexts 150,300,600,1200] [--nodes 1,4,16]
                                   [--reps 7] [--threads 2] [--kernels auto] [--json OUT.json]

For each (context, nodes): the context is prefilled once, then a chain of `nodes` new tokens is forwarded
and rolled back, `reps` times per variant, the variants alternating forward by forward. Reported: the
median ms of each, and their ratio. Nodes 1 is the control (both variants run transformers' packed path).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from cure_core.attention import stock_sdpa  # noqa: E402
from cure_core.catalog import DEFAULT_TARGET  # noqa: E402
from cure_core.lm import CachedLM  # noqa: E402
from cure_core.errors import ModelLoadError  # noqa: E402
from cure_core.models import apply_kernels, load_model  # noqa: E402
from cure_core.options import EngineArgs, parse_list  # noqa: E402


def timed_forward(lm: CachedLM, tokens: list[int], parents: list[int]) -> float:
    t0 = time.perf_counter()
    lm.forward(tokens, parents)
    ms = (time.perf_counter() - t0) * 1e3
    lm.rollback()
    return ms


def measure(model, lm: CachedLM, context: int, nodes: int, reps: int) -> dict:
    vocab = int(model.config.vocab_size)
    lm.reset()
    lm.prefill([(100 + i) % vocab for i in range(context)])
    tokens, parents = [(7 * j + 3) % vocab for j in range(nodes)], [-1] + list(range(nodes - 1))
    times: dict[str, list[float]] = {"grouped": [], "sdpa": []}
    timed_forward(lm, tokens, parents)                       # warm-up, each variant
    with stock_sdpa([model]):
        timed_forward(lm, tokens, parents)
    for _ in range(reps):
        times["grouped"].append(timed_forward(lm, tokens, parents))
        with stock_sdpa([model]):
            times["sdpa"].append(timed_forward(lm, tokens, parents))
    g, s = statistics.median(times["grouped"]), statistics.median(times["sdpa"])
    return {"context": context, "nodes": nodes, "grouped_ms": g, "sdpa_ms": s, "sdpa_over_grouped": s / g,
            "grouped_all_ms": times["grouped"], "sdpa_all_ms": times["sdpa"]}


def main(argv=None) -> list[dict]:
    ap = common.parser(__doc__)
    ap.add_argument("--contexts", default="150,300,600,1200", help="cached context lengths (rows)")
    ap.add_argument("--nodes", default="1,4,16", help="nodes per forward (a chain)")
    ap.add_argument("--reps", type=int, default=7, help="forwards per variant and cell")
    common.add_threads(ap, default=2)
    common.add_json(ap)
    EngineArgs.add_cli_args(ap, only=("target", "kernels"))
    args = common.check(ap, ap.parse_args(argv))
    try:
        contexts = [int(x) for x in parse_list(args.contexts)]
        node_counts = [int(x) for x in parse_list(args.nodes)]
    except ValueError:
        ap.error("--contexts and --nodes take comma lists of integers")
    if args.reps < 1 or min(contexts + node_counts, default=0) < 1:
        ap.error("--reps, --contexts and --nodes must be >= 1")
    common.set_threads(args.threads)
    args.target = args.target or DEFAULT_TARGET
    try:
        model, _ = load_model(args.target)
        packed = apply_kernels(args.kernels, [model])
    except ModelLoadError as e:
        ap.error(str(e))
    lm = CachedLM(model, kv="static", capacity=max(contexts) + max(node_counts) + 8)
    cfg = model.config
    print(f"{args.target}: {cfg.num_attention_heads} query heads over {cfg.num_key_value_heads} K/V heads; "
          f"kernels {'packed' if packed else 'eager'}; threads {args.threads}; load {os.getloadavg()[0]:.2f}")
    print(f"{'context':>8} {'nodes':>6} {'grouped ms':>11} {'sdpa ms':>9} {'sdpa/grouped':>13}")
    rows = []
    for context in contexts:
        for nodes in node_counts:
            r = measure(model, lm, context, nodes, args.reps)
            rows.append(r)
            print(f"{context:>8} {nodes:>6} {r['grouped_ms']:>11.1f} {r['sdpa_ms']:>9.1f} {r['sdpa_over_grouped']:>13.2f}",
                  flush=True)
    common.write_json(args.json, {"target": args.target, "threads": args.threads, "kernels": packed,
                                  "load_average_end": common.load_average(), "reps": args.reps, "rows": rows})
    return rows


if __name__ == "__main__":
    common.entry(main)
