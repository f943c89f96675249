"""CPU verification cost curve, eager vs packed kernels, side by side in one process.

    python benchmarks/cpu_kernels.py --target qwen-coder-0.5b --threads 2 --json benchmarks/results/cpu_kernels_qwen05b.json
    python benchmarks/cpu_kernels.py --tiny                          # smoke run (the test does this)
    python benchmarks/cpu_kernels.py --dtypes float32,bfloat16,int8 --sizes 1,2,4,8,16,32,48,64 --json F

For each node count N in --sizes: one target forward over [root + (N-1) chain nodes] on a
--ctx-token context through cure's CachedLM, the eager model and a packed copy (cure_core/
cpu_kernels.py) timed in alternation, --reps times each; the median is reported, in ms and as a
ratio to the same model's one-token step. The ratio is what decides whether a tree can pay:
verifying a tree of N nodes must cost less than the tokens it is expected to accept.
"""
from __future__ import annotations

import copy
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from cure_core.cpu_kernels import pack_linears, unavailable_reason  # noqa: E402
from cure_core.catalog import DEFAULT_TARGET  # noqa: E402
from cure_core.lm import CachedLM  # noqa: E402
from cure_core.tree import argmax  # noqa: E402


def forward_ms(lm: CachedLM, n: int, gen: torch.Generator) -> float:
    """One forward over a root + (n-1)-node chain after the committed context, then rolled back."""
    vocab = int(lm.config.vocab_size)
    toks = torch.randint(0, vocab, (n,), generator=gen).tolist()
    t0 = time.perf_counter()
    fwd = lm.forward(toks, [-1] + list(range(n - 1)))
    argmax(fwd.logits).tolist()                        # acceptance reads the argmax back (as the engine does)
    ms = (time.perf_counter() - t0) * 1e3
    lm.rollback()
    return ms


def measure(models: dict, sizes: list[int], ctx_len: int, reps: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    vocab = int(next(iter(models.values())).config.vocab_size)
    ctx = torch.randint(0, vocab, (ctx_len,), generator=gen).tolist()
    lms = {name: CachedLM(m, kv="static", capacity=ctx_len + max(sizes) + 8) for name, m in models.items()}
    for lm in lms.values():
        lm.prefill(ctx)
        forward_ms(lm, max(sizes), gen)                 # warm-up
    times = {name: {n: [] for n in sizes} for name in lms}
    for _ in range(reps):
        for n in sizes:
            for name, lm in lms.items():                # alternate, so drift hits both alike
                times[name][n].append(forward_ms(lm, n, gen))
    out = {}
    for name in lms:
        med = {n: statistics.median(times[name][n]) for n in sizes}
        out[name] = {"ms": {str(n): round(med[n], 2) for n in sizes},
                     "x_one_token": {str(n): round(med[n] / med[sizes[0]], 3) for n in sizes}}
    return out


def main(argv=None) -> dict:
    ap = common.timing_parser(__doc__)
    ap.add_argument("--sizes", default="1,2,4,8,16,32", help="node counts (root included); the first is the base")
    ap.add_argument("--ctx", type=int, default=256, help="context tokens before the tree")
    ap.add_argument("--dtypes", default=None, metavar="D1,D2,...", help=(
        "instead of eager against packed float32: the target as the engine loads it (load_pair, packed) in each "
        "of these dtypes, e.g. float32,bfloat16,int8"))
    args = common.check(ap, ap.parse_args(argv))
    common.set_threads(args.threads)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if args.dtypes:
        return by_dtype(args, sizes)
    if args.tiny:
        from cure_core.tiny import tiny_target
        eager, name = tiny_target(seed=0), "tiny"
    else:
        from cure_core.models import load_model
        name = args.target or DEFAULT_TARGET                 # float32: this measures float32 kernels
        eager, _ = load_model(name)
    why = unavailable_reason(eager)
    if why:
        raise SystemExit(f"cannot pack {name}: {why}")
    packed = copy.deepcopy(eager)
    pack_linears(packed)
    result = {
        "schema": "cure.cpu_kernels/1", "target": name, "ctx": args.ctx, "reps": args.reps, "sizes": sizes,
        "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                        "platform": platform.platform(), "processor": platform.processor(),
                        "load_average_start": common.load_average()},
        "curves": measure({"eager": eager, "packed": packed}, sizes, args.ctx, args.reps),
    }
    c = result["curves"]
    result["packed_speedup"] = {str(n): round(c["eager"]["ms"][str(n)] / c["packed"]["ms"][str(n)], 3) for n in sizes}
    print(f"{'nodes':>6} {'eager ms':>10} {'x1':>6} {'packed ms':>10} {'x1':>6} {'eager/packed':>13}")
    for n in sizes:
        k = str(n)
        print(f"{n:>6} {c['eager']['ms'][k]:>10.1f} {c['eager']['x_one_token'][k]:>6.2f} "
              f"{c['packed']['ms'][k]:>10.1f} {c['packed']['x_one_token'][k]:>6.2f} {result['packed_speedup'][k]:>12.2f}x")
    return common.write_json(args.json, result, indent=1)


def by_dtype(args, sizes: list[int]) -> dict:
    """The cost curve of the target in each of --dtypes, loaded as the engine loads it, timed in alternation."""
    from cure_core.cpu_kernels import cpu_info
    from cure_core.models import load_pair
    dtypes = [d for d in args.dtypes.split(",") if d]
    if args.tiny:
        import tempfile
        from cure_core.tiny import byte_tokenizer, tiny_target
        name = tempfile.mkdtemp(prefix="cure-kernels-")
        tiny_target(seed=0).save_pretrained(name)
        byte_tokenizer().save_pretrained(name)
    else:
        name = args.target or DEFAULT_TARGET
    models = {d: load_pair(name, dtype=d, kernels="packed").pair.target for d in dtypes}
    result = {
        "schema": "cure.cpu_kernels/2", "target": "tiny" if args.tiny else name, "ctx": args.ctx, "reps": args.reps,
        "sizes": sizes, "dtypes": dtypes,
        "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                        "platform": platform.platform(), **cpu_info(), "load_average_start": common.load_average()},
        "curves": measure(models, sizes, args.ctx, args.reps),
    }
    result["environment"]["load_average_end"] = common.load_average()
    c = result["curves"]
    print(f"{'nodes':>6} " + " ".join(f"{d + ' ms':>14} {'x1':>5}" for d in dtypes))
    for n in sizes:
        k = str(n)
        print(f"{n:>6} " + " ".join(f"{c[d]['ms'][k]:>14.1f} {c[d]['x_one_token'][k]:>5.2f}" for d in dtypes))
    return common.write_json(args.json, result, indent=1)


if __name__ == "__main__":
    common.entry(main)
