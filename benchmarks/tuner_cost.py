"""What the budget tuner's warm-up and exploration cost, charged honestly (#13).

Each prompt decodes from a FRESH engine (a new tuner: the worst case; one engine keeps its tuner
across generations), `--max-new-tokens` tokens with `--v-max auto`. Blocks carry why their budget was
chosen (Block.meta["tuning"]: warmup | explore | unpriced | settled). The cost of a warm-up, exploration
or unpriced block (a sequential drafter's tuner kept off budget 0 until drafting is priced) is its time
minus what its tokens would have cost at the settled blocks' rate (ms per emitted token, same
generation); negative when the probe happened to pay. Reported as a share of decode time.

    python benchmarks/tuner_cost.py --sets humaneval@20 --limit 5 --max-new-tokens 256 [--json OUT.json]
"""
from __future__ import annotations

import argparse
import os
import statistics

import torch

from cure_core.files import atomic_write_json  # noqa: E402
from cure_core.options import EngineArgs, parse_list


def tuning_cost(blocks) -> dict:
    """{decode_ms, tuning_ms (warm-up + exploration + unpriced cost), share, blocks per phase} of one generation."""
    settled = [b for b in blocks if b.meta.get("tuning") == "settled"]
    emitted = sum(len(b.emitted) for b in settled)
    rate = sum(b.timings.total_ms for b in settled) / emitted if emitted else None
    decode = sum(b.timings.total_ms for b in blocks)
    extra = sum(b.timings.total_ms - len(b.emitted) * rate for b in blocks
                if rate is not None and b.meta.get("tuning") in ("warmup", "explore", "unpriced"))
    phases = {p: sum(1 for b in blocks if b.meta.get("tuning") == p)
              for p in ("warmup", "explore", "unpriced", "settled")}
    return {"decode_ms": decode, "tuning_ms": extra, "share": extra / decode if decode else 0.0,
            "tokens": sum(len(b.emitted) for b in blocks), "blocks": phases}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="humaneval@20")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, metavar="OUT.json")
    EngineArgs.add_cli_args(ap, exclude=("temperature", "seed", "v_max", "chat"), max_new_tokens=256)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from cure_core.api import open_pair
    from cure_core.engine import Engine
    from cure_tasks import load_set, raw_by_default
    loaded = open_pair(EngineArgs.from_cli_args(args).with_(v_max="auto"))
    cfg = loaded.config.with_(stop_at_eos=False)          # the full length: the share is over a whole answer
    rows = []
    for spec in parse_list(args.sets):
        name, task, problems = load_set(spec, args.limit)
        for p in problems:
            ids = loaded.encode(p.prompt, chat=not raw_by_default(task))
            blocks = list(Engine(loaded.pair).generate(ids, cfg))       # a fresh tuner every prompt
            rows.append({"set": name, "task_id": p.task_id, **tuning_cost(blocks)})
            r = rows[-1]
            print(f"{p.task_id}: {r['tokens']} tokens, tuning {r['tuning_ms']:.0f} of {r['decode_ms']:.0f} ms "
                  f"({100 * r['share']:.1f}%), blocks {r['blocks']}", flush=True)
    total = sum(r["tuning_ms"] for r in rows) / sum(r["decode_ms"] for r in rows)
    rep = {"strategy": cfg.strategy, "max_new_tokens": cfg.max_new_tokens, "threads": torch.get_num_threads(),
           "load_average": list(os.getloadavg()), "share_total": total,
           "share_median": statistics.median(r["share"] for r in rows), "rows": rows}
    print(f"warm-up + exploration: {100 * total:.1f}% of decode time over {len(rows)} answers "
          f"(median {100 * rep['share_median']:.1f}%)")
    if args.json:
        atomic_write_json(args.json, rep, indent=2)
    return rep


if __name__ == "__main__":
    main()
