"""How well drafters agree with their target, on held-out prompt sets, side by side.

    python benchmarks/agreement.py --target qwen-coder-0.5b \\
        --drafts assets/drafters/qwen-coder-0.5b,training/qwen-coder-0.5b-v9 \\
        --sets humaneval@20,gsm8k,benchmarks/prompts/chat20.jsonl --limit 20 --max-new-tokens 64 \\
        [--k 8] [--threads 2] [--json OUT.json]

For every set (`cure_tasks.load_set`: a task, task@N to skip its first N, or a prompts .jsonl; raw
completion for completion-style tasks, the chat template otherwise, as `cure bench` encodes them) and
every drafter, the measurement `cure train-drafter` runs at the end (cure_core.training.evaluate):

  * offset-j top-1 agreement: at every position of the target's greedy continuation, the drafter
    drafts one block from the true context; offset j counts when its top-1 equals the target's token
    j places on (and the chain rate: offsets 1..j all agree);
  * tau, emitted tokens per target forward, of `parallel` and `cure` at block size K in the real
    engine, each output checked against the target's greedy continuation.

The target's greedy continuations are computed once (with the first drafter's pair) and shared, so
every drafter is measured on the same positions. Nothing here is timed: the counts do not depend
on the machine's load, so this may run beside other work.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from cure_core.options import EngineArgs, parse_list  # noqa: E402


def parse_args(argv: Sequence[str] | None):
    ap = common.parser(__doc__)
    ap.add_argument("--drafts", required=True, help="comma list of drafters (folders or ids), compared side by side")
    common.add_sets(ap, default="humaneval@20")
    common.add_threads(ap)
    common.add_json(ap)
    # the engine's own flags (one owner, EngineArgs): --drafter applies to every --drafts entry, --k and
    # --max-new-tokens to the tau runs and the greedy references
    EngineArgs.add_cli_args(ap, only=("target", "drafter", "max_new_tokens", "k", "kernels", "draft_vocab",
                                      "device", "dtype"), max_new_tokens=64, k=8)
    args = common.check(ap, ap.parse_args(argv))
    if args.max_new_tokens < 1 or args.k < 2:
        ap.error("--max-new-tokens must be >= 1, --k >= 2")
    if not parse_list(args.drafts):
        ap.error("--drafts names no drafter")
    return args


def _set_prompts(spec: str, limit: int, loaded) -> tuple[str, list[list[int]]]:
    from cure_tasks import load_set, raw_by_default
    name, task, problems = load_set(spec, limit)
    return name, [loaded.encode(p.prompt, chat=not raw_by_default(task)) for p in problems]


def main(argv: Sequence[str] | None = None) -> dict:
    from rich.console import Console
    from rich.table import Table

    from cure_core.api import open_pair
    from cure_core.training.evaluate import evaluate

    args = parse_args(argv)
    threads = common.set_threads(args.threads)
    console = Console(width=max(Console().width, 110))
    drafts = parse_list(args.drafts)
    out = {"target": args.target, "drafts": drafts, "k": args.k, "max_new_tokens": args.max_new_tokens,
           "limit": args.limit, "threads": threads, "load_average_start": common.load_average(), "sets": {}}
    refs: dict[str, list[list[int]]] = {}
    prompts: dict[str, list[list[int]]] = {}
    for d in drafts:
        loaded = open_pair(EngineArgs.from_cli_args(args).with_(draft=d, strategy="parallel"),
                           strategies=["parallel", "cure"])
        kind = loaded.drafter_kind
        block = loaded.pair.drafter.block_size or args.k      # PARD: any block; measure K
        for spec in parse_list(args.sets):
            if spec not in prompts:
                name, prompts[spec] = _set_prompts(spec, args.limit, loaded)
                out["sets"].setdefault(spec, {"name": name, "prompts": len(prompts[spec]), "drafters": {}})
            done = [0]

            def tick():
                done[0] += 1
                console.print(f"  {d} on {spec}: {done[0]}/{len(prompts[spec])}", end="\r")
            ev = evaluate(loaded.pair, kind, prompts[spec], max_new_tokens=args.max_new_tokens, k=args.k,
                          block=block, progress=tick, refs=refs.get(spec))
            refs.setdefault(spec, ev.pop("references"))           # shared, not written per drafter
            ev["kind"] = kind
            out["sets"][spec]["drafters"][d] = ev
        del loaded
    out["load_average_end"] = common.load_average()
    for spec, s in out["sets"].items():
        t = Table(title=f"{s['name']}: {s['prompts']} prompts, {args.max_new_tokens} greedy tokens, K={args.k}")
        t.add_column("drafter")
        for j in range(1, 5):
            t.add_column(f"top-1 @{j}", justify="right")
        t.add_column("chain @2", justify="right")
        t.add_column("tau parallel", justify="right")
        t.add_column("tau cure", justify="right")
        t.add_column("lossless")
        for d, ev in s["drafters"].items():
            top = ev["per_position_top1"]
            t.add_row(d, *[f"{100 * top[str(j)]:.1f}%" if str(j) in top else "-" for j in range(1, 5)],
                      f"{100 * ev['per_position_chain'].get('2', 0.0):.1f}%",
                      f"{ev['tau']['parallel']:.3f}", f"{ev['tau']['cure']:.3f}", str(ev["lossless"]))
        console.print(t)
    console.print(f"threads {out['threads']}, load average {out['load_average_start']} -> {out['load_average_end']}")
    return common.write_json(args.json, out, say=console.print)


if __name__ == "__main__":
    common.entry(main)
