"""What each of best-first cure's own choices won at T=0, per prompt set: the lookup graft, the node weight
(calibration.py) and the re-draft pass (redraft_price.py). Acceptance only, and exact: every gain is the one
the engine itself measures on the tree with the choice flipped (calibration.FlipGains) or on the tree before
the pass (RedraftPrice), here tallied over a whole run instead of a window. Where cure stands against ddtree
on a pair, this says which of its choices paid and which cost (the pass also in drafter milliseconds).

Every flipped tree is built on every block here (FlipGains.every = 1), so the counts are of all blocks that
could measure a choice; a shipped engine measures every 4th once a budget's window is full. Run it on tuning
prompts: it is for deciding rules, not for reporting.

    python benchmarks/choice_ledger.py --target qwen-coder-1.5b --sets humaneval,gsm8k@20,FILE.jsonl --limit 20 \\
        --max-new-tokens 32 --threads 2 [--strategy cure:lookup=0] [--json OUT.json]

Per set: blocks; for `lookup` and `weight`: blocks that measured it, blocks that took it, the tokens it won
where taken (`gain_taken`) and what it would have won where withheld (`gain_withheld`); the passes, their
gain and ms.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402

from cure_core.files import atomic_write_json  # noqa: E402
from cure_core import calibration, redraft_price  # noqa: E402


def ledger(args, strategy: str) -> dict:
    """Run the one strategy over the sets; {set: its tallies, "_strategy": strategy}."""
    torch.set_num_threads(peers.choose_threads(args.threads)[0])
    log: list[tuple] = []
    flip_observe, pass_observe, every = calibration.FlipGains.observe, redraft_price.RedraftPrice.observe, \
        calibration.FlipGains.every

    def on_flip(self, v, used, accepted, alt_held):
        log.append(("flip", id(self), used, calibration.flip_gain(used, accepted, alt_held)))
        return flip_observe(self, v, used, accepted, alt_held)

    def on_pass(self, v, gain, ms):
        log.append(("pass", gain, ms))
        return pass_observe(self, v, gain, ms)
    calibration.FlipGains.observe, redraft_price.RedraftPrice.observe = on_flip, on_pass
    calibration.FlipGains.every = 1
    try:
        setup = peers.load_setup(args)
        method = next(m for m in peers.build_methods(args, setup) if m.kind == "cure")
        method.run(setup.prompts[0][2], min(8, args.max_new_tokens))          # warm-up, as peers does
        engine = setup.engine
        out: dict[str, Counter] = {}
        for i, (name, task_id, ids) in enumerate(setup.prompts):
            start = len(log)
            rec = method.run(ids, args.max_new_tokens)
            owners = ({id(s.flips): "lookup" for s in engine._lookups.values()}
                      | {id(c.flips): "weight" for c in engine._calibrations.values()})
            c = out.setdefault(name, Counter())
            c["blocks"] += rec["target_forwards"]
            c["tokens"] += rec["decode_tokens"]
            for e in log[start:]:
                if e[0] == "flip":
                    who = owners[e[1]]
                    c[f"{who}_measured"] += 1
                    c[f"{who}_taken"] += e[2]
                    c[f"{who}_gain_{'taken' if e[2] else 'withheld'}"] += e[3]
                else:
                    c["passes"] += 1
                    c["pass_gain"] += e[1]
                    c["pass_ms"] += e[2]
            if not args.quiet:
                print(f"[{i + 1}/{len(setup.prompts)}] {name} {task_id}: {rec['target_forwards']} blocks",
                      file=sys.stderr)
    finally:
        calibration.FlipGains.observe, redraft_price.RedraftPrice.observe = flip_observe, pass_observe
        calibration.FlipGains.every = every
    return {name: dict(c) for name, c in out.items()} | {"_strategy": strategy}


def _fail(msg: str):
    print(f"choice_ledger.py: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _args(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    strategy = "cure"
    if "--strategy" in argv:
        i = argv.index("--strategy")
        if i + 1 >= len(argv) or not argv[i + 1].startswith("cure"):
            _fail("--strategy takes cure or a cure variant (cure:KEY=VALUE)")
        strategy = argv[i + 1]
        del argv[i: i + 2]
    if "--strategies" in argv or "--hf" in argv:
        _fail("one strategy (--strategy), no --strategies or --hf")
    return peers.parse_args(argv + ["--strategies", strategy, "--hf", ""]), strategy


def main(argv=None) -> dict:
    args, strategy = _args(argv)
    report = ledger(args, strategy)
    for name, c in report.items():
        if not name.startswith("_"):
            print(name, json.dumps(c))
    if args.json:
        atomic_write_json(args.json, report, indent=1)
    return report


if __name__ == "__main__":
    main()
