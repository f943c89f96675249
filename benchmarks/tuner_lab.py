"""The budget tuner on a modelled clock: which budgets its rules pick, and what those would earn, without
this machine's timing noise in the comparison.

    python benchmarks/tuner_lab.py --target qwen-coder-1.5b --sets gsm8k@20 --limit 10 --max-new-tokens 32 \\
        --strategies sd,cure --rules main,direct,lsq,both --seeds 0,1,2 --fixed 2,4,8 --json OUT.json

Real models decode real prompts, greedy, so every block accepts exactly what the pair would accept under
the budget the tuner chose. But the tuner sees MODELLED timings, not measured ones:

    draft  = (c0 + c1 x positions drafted) x noise      (0 for a block that drafts nothing)
    verify = C_v(tree size), the pair's measured cost curve, x noise
    noise  = lognormal jitter (--jitter), a slow block now and then (--spikes: probability, x2-3), and a
             first time per drafted length x1.5 (kernels meeting a shape; what the first full chain of a
             1.5B run showed)

and every rule is scored on the same clock: modelled tok/s = tokens / the sum of modelled block times
(prefill excluded; a generation's first drafting block pays `catch_up` ms more, the drafter taking in the
prompt as it did before the engine's prefill step took it in: kept so that earlier lab runs stay comparable). The same prompts and seeds under different rules therefore differ by the rules' choices only,
and the spread over seeds is how much the noise moves where a rule settles. The clock is a model
(labelled so in every output): its c0/c1 defaults are the 1.5B pair's fitted lines at 2 threads
(benchmarks/results/README.md); it says which rule settles better, `peers.py` says how fast.

Rules (--rules):
    main     cure_core.budget.BudgetTuner as it is
    direct   a(V) averaged over the blocks that tell it alone (the rule before the chained estimate)
    lsq      the cost line by least squares (the rule before Theil-Sen)
    zero-early  budget 0 as soon as it rates best (the rule before `priced_before_zero`)
    both     direct + lsq + zero-early: the tuner of commit 245dc39
--fixed B,...: fixed budgets on the same clock, noise-free (auto off: no tuner, so no draft stop either).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cure_core.files import atomic_write_json  # noqa: E402
from cure_core.block import Block, Timings  # noqa: E402
from cure_core.budget import BudgetTuner  # noqa: E402
from cure_core.options import EngineArgs, parse_list  # noqa: E402

SCHEMA = "cure.tuner_lab/1"
# (c0, c1) ms per block and per drafted position, 1.5B target + 0.5B chain at 2 threads: sd's fitted line;
# cure's chain carries 3 re-draft rows a step (direct fit c0 -14, c1 80: c0 set to 10)
LINES = {"sd": (25.0, 68.0), "cure": (10.0, 80.0), "ddtree": (25.0, 68.0)}


@dataclasses.dataclass
class Clock:
    """Modelled block times, seeded. `ms`/`tokens` accumulate what the blocks it timed cost and emitted."""
    c0: float
    c1: float
    jitter: float = 0.08          # lognormal sigma per component
    spikes: float = 0.03          # probability that a component runs 2-3x slow
    cold: float = 1.5             # first time a drafted length is seen
    catch_up: float = 150.0       # a generation's first drafting block: the drafter takes in the prompt
    seed: int | None = 0          # None: no noise at all
    ms: float = 0.0
    tokens: int = 0

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed) if self.seed is not None else None
        self.seen: set[int] = set()
        self.fresh = True

    def _noise(self) -> float:
        if self.rng is None:
            return 1.0
        x = float(np.exp(self.rng.normal(0.0, self.jitter)))
        return x * float(self.rng.uniform(2.0, 3.0)) if self.rng.random() < self.spikes else x

    def time(self, block: Block, curve) -> Block:
        """`block` with modelled timings; counted in ms/tokens."""
        if block.index == 0:
            self.fresh = True
        draft = 0.0
        if block.tree_size > 0:
            p = len(block.draft)
            draft = (self.c0 + self.c1 * p) * self._noise()
            if p not in self.seen and self.rng is not None:
                draft *= self.cold
                self.seen.add(p)
            if self.fresh:
                draft += self.catch_up
            self.fresh = False
        verify = curve.verify(block.tree_size) * self._noise()
        self.ms += draft + verify
        self.tokens += len(block.emitted)
        return dataclasses.replace(block, timings=Timings(draft_ms=draft, verify_ms=verify))


class LabTuner(BudgetTuner):
    """BudgetTuner that observes modelled timings (`clock`)."""
    clock: Clock

    def observe(self, block, budget, clipped=False, chain_logp=None):
        super().observe(self.clock.time(block, self.curve), budget, clipped, chain_logp)


class DirectAccept(LabTuner):
    """a(V) = the mean over the blocks that tell it: the rule before the chained estimate."""

    def expected_accept(self, v):
        vals = [sum(1 for i in acc if i < v) for acc, size, cut in self.history[-self.window:]
                if not (cut and v > size)]
        return sum(vals) / len(vals) if vals else None


class LeastSquaresLine(LabTuner):
    """The cost line by least squares, through 0 where positions barely vary: the rule before Theil-Sen."""

    def cost_line(self):
        if self._line is None:
            recent = self.costs[-self.window:]
            n = len(recent)
            mx = sum(c.positions for c in recent) / n
            my = sum(c.ms for c in recent) / n
            sxx = sum((c.positions - mx) ** 2 for c in recent)
            line = (0.0, my / mx if mx > 0 else 0.0)
            if n >= 4 and sxx >= 0.25 * n:
                c1 = sum((c.positions - mx) * (c.ms - my) for c in recent) / sxx
                c0 = my - c1 * mx
                if c1 > 0 and c0 >= 0:
                    line = (c0, c1)
            self._line = line
        return self._line


class ZeroEarly(LabTuner):
    """Budget 0 as soon as it rates best, whatever a sequential drafter's cost line rests on: the rule before
    `priced_before_zero`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, priced_before_zero=0, **kwargs)


class Both(DirectAccept, LeastSquaresLine, ZeroEarly):
    """The three earlier rules: the tuner of commit 245dc39."""


RULES = {"main": LabTuner, "direct": DirectAccept, "lsq": LeastSquaresLine, "both": Both,
         "zero-early": ZeroEarly}


def run_rule(setup, cfg, base: BudgetTuner, rule: str, seed: int, line, args) -> dict:
    """A fresh tuner of `rule` (built like `base`: its measured curve, candidates and steps) on a clock
    seeded `seed`: the warm-up generation, then every prompt."""
    engine = setup.engine
    key = engine.tuner_key(cfg)
    tuner = RULES[rule](base.curve, base.candidates, steps=base.steps)
    tuner.clock = Clock(*line, jitter=args.jitter, spikes=args.spikes, seed=seed)
    engine._tuners[key] = tuner
    budgets: dict[int, int] = {}
    warm = cfg.with_(max_new_tokens=min(args.warmup_tokens, cfg.max_new_tokens))
    if warm.max_new_tokens > 0:
        list(engine.generate(setup.prompts[0][2], warm))
    tuner.clock.ms, tuner.clock.tokens = 0.0, 0
    for _, _, ids in setup.prompts:
        for b in engine.generate(ids, cfg):
            budgets[b.meta["v_max"]] = budgets.get(b.meta["v_max"], 0) + 1
    engine._tuners.pop(key, None)
    return {"rule": rule, "seed": seed, "tok_s": 1e3 * tuner.clock.tokens / tuner.clock.ms,
            "tokens": tuner.clock.tokens, "blocks_by_budget": dict(sorted(budgets.items()))}


def run_fixed(setup, cfg, curve, budget: int, line) -> dict:
    """A fixed budget (auto off) on the noise-free clock."""
    clock = Clock(*line, seed=None)
    # the tuner runs a budget below K-1 as a shorter block (K = budget + 1): so does this
    c = cfg.with_(k=min(cfg.k, budget + 1), v_max=budget, auto_budget=False)
    for _, _, ids in setup.prompts:
        for b in setup.engine.generate(ids, c):
            clock.time(b, curve)
    return {"budget": budget, "tok_s": 1e3 * clock.tokens / clock.ms, "tokens": clock.tokens}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategies", default="sd,cure", help="comma list of tree/chain strategies")
    ap.add_argument("--rules", default="main,both", help=f"comma list of {', '.join(RULES)}")
    ap.add_argument("--seeds", default="0,1,2", help="comma list of clock seeds")
    ap.add_argument("--repeat", type=int, default=1, help="runs per rule and seed (the same seed: the same result)")
    ap.add_argument("--fixed", default="", help="comma list of fixed budgets scored on the noise-free clock")
    ap.add_argument("--sets", default="gsm8k@20", help="as peers.py --sets")
    ap.add_argument("--limit", type=int, default=10, help="prompts per set")
    ap.add_argument("--jitter", type=float, default=0.08, help="lognormal sigma of the modelled times")
    ap.add_argument("--spikes", type=float, default=0.03, help="probability of a 2-3x slow component")
    ap.add_argument("--line", action="append", default=[], metavar="STRATEGY=C0,C1",
                    help="the modelled drafting line for a strategy (ms); default: the 1.5B pair's")
    ap.add_argument("--warmup-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="in-process tiny random models (a smoke run)")
    ap.add_argument("--json", default=None, metavar="OUT.json")
    EngineArgs.add_cli_args(ap, exclude=("strategy", "temperature", "seed", "chat"), max_new_tokens=32)
    args = ap.parse_args(argv)
    for r in parse_list(args.rules):
        if r not in RULES:
            ap.error(f"unknown rule {r!r}; choose from {', '.join(RULES)}")
    if args.limit < 1 or args.max_new_tokens < 1 or args.repeat < 1:
        ap.error("--limit, --max-new-tokens and --repeat must be >= 1")
    args.hf, args.strategies_list = "", parse_list(args.strategies)
    lines = dict(LINES)
    for spec in args.line:
        name, _, vals = spec.partition("=")
        try:
            c0, c1 = (float(x) for x in vals.split(","))
        except ValueError:
            ap.error(f"--line wants STRATEGY=C0,C1, got {spec!r}")
        lines[name] = (c0, c1)
    args.lines = lines
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    from peers import load_setup
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    setup = load_setup(args)
    rows, fixed = [], []
    for strategy in args.strategies_list:
        cfg = setup.config.with_(strategy=strategy, max_new_tokens=args.max_new_tokens)
        line = args.lines.get(strategy, LINES["sd"])
        base = setup.engine._make_tuner(cfg)               # the measured cost curve, once: every rule's clock
        for rule in parse_list(args.rules):
            for seed in (int(s) for s in parse_list(args.seeds)):
                for _ in range(args.repeat):
                    r = {"strategy": strategy, **run_rule(setup, cfg, base, rule, seed, line, args)}
                    rows.append(r)
                print(f"{strategy} {rule} seed {seed}: {r['tok_s']:.2f} modelled tok/s, budgets "
                      f"{r['blocks_by_budget']}", flush=True)
        for b in (int(x) for x in parse_list(args.fixed)):
            f = {"strategy": strategy, **run_fixed(setup, cfg, base.curve, b, line)}
            fixed.append(f)
            print(f"{strategy} fixed {b}: {f['tok_s']:.2f} modelled tok/s", flush=True)
    summary = {}
    for strategy in args.strategies_list:
        for rule in parse_list(args.rules):
            xs = [r["tok_s"] for r in rows if r["strategy"] == strategy and r["rule"] == rule]
            summary[f"{strategy}/{rule}"] = {"mean": statistics.mean(xs), "min": min(xs), "max": max(xs),
                                             "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0}
    print("modelled tok/s over seeds (mean, min-max):")
    for k, s in summary.items():
        print(f"  {k:<16} {s['mean']:.2f}  {s['min']:.2f}-{s['max']:.2f}")
    report = {"schema": SCHEMA, "clock": "MODELLED (see the script's docstring), not measured",
              "lines_ms": args.lines, "jitter": args.jitter, "spikes": args.spikes,
              "sets": parse_list(args.sets), "limit": args.limit, "max_new_tokens": args.max_new_tokens,
              "threads": args.threads, "load_average": list(os.getloadavg()),
              "wall_s": time.perf_counter() - t0, "summary": summary, "runs": rows, "fixed": fixed}
    if args.json:
        atomic_write_json(args.json, report, indent=2)
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
