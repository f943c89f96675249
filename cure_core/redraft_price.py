"""Whether best-first cure's re-draft pass pays for its time, at a budget chosen by the tuner or fixed.

Over a block-parallel drafter (DFlash, PARD) best-first cure re-drafts the suffix under the tree's best
substitutions in one more drafter forward per block (strategies.build_cure_best_first). That pass costs a
drafter forward; what it wins is measured exactly at T=0: the tree from before the pass (TreePlan.unrepaired)
would have accepted the nodes the target's greedy path (accepted tokens + bonus) walks down in it, so the
gain is the block's accepted path minus that. One rule decides for both budget modes:

    the pass runs at budget v while  mean gain > rate(v) x mean pass ms   over v's last `window` passes

With g the gain, r the pass's ms and A + 1 tokens in T ms without it, the pass raises tokens per ms iff
g / r > (A + 1) / T, the block's own rate. Under `--v-max auto` the rate is the tuner's prediction for v
(BudgetTuner.rate); at a fixed budget it is what the last blocks measured (`measured_rate`). Until
`min_samples` passes at v have been seen, the mean is not trusted: from `early` passes the pass runs while its
mean gain plus `z` standard errors still beats the price (`_runs`), so where a pass costs half a token and three
passes won nothing it stops at the third pass, not the eighth (the 1.5B pair's PARD drafter, where those eight
passes per budget were most of cure's pass time in a 32-token answer), while a pass that costs a tenth of a token
keeps running until the mean decides. A skipped pass still runs as a probe `probe` blocks later, so its gain stays
measured. A probe costs a whole pass for the little it wins where the pass does not
pay (on the 1.5B pair's PARD drafter a 0.5B forward, a sixth of a block's time, for +0.09 tau at 4-node trees:
one probe in 8 blocks is ~2% of decode time), so each probe that leaves the decision at "skip" doubles the
interval to the next, up to `probe_max`; a probe that by itself wins more than its price (g > rate x ms), or a
decision that turns to "run", sets it back to `probe`, so a change of regime is still sampled at once.
A budget with fewer than `early` passes of its own is decided by every budget's passes pooled (at its own
rate), so each budget the tuner moves to does not pay its own first passes where the others already showed the
pass does not pay; its probes then gather its own (the measurements: benchmarks/results/SUMMARY.md).
At T>0 no gain is recorded: the decision then rests on what T=0 generations measured on the same engine,
and otherwise the pass runs.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def own_or_pooled(by_budget: dict[int, Sequence[T]], v: int, least: int) -> Sequence[T]:
    """Budget v's own evidence where it holds `least` items, else every budget's pooled. Rule: each budget the
    tuner moves to does not learn again what the others already showed."""
    own = by_budget.get(v, ())
    return own if len(own) >= least else [x for got in by_budget.values() for x in got]


@dataclass(frozen=True)
class RedraftSample:
    """One best-first cure block whose tree came from a re-draft pass, verified at temperature 0."""
    gain: int            # accepted tokens the pass won: the block's accepted path minus what the tree before
                         # the pass would have accepted (-1 where that tree held the whole path and the bonus)
    ms: float            # the pass's drafter time


class RedraftPrice:
    """Per budget: the re-draft passes seen and the decision (the module's rule)."""

    def __init__(self, window: int = 32, min_samples: int = 8, probe: int = 8, rate_blocks: int = 64,
                 probe_max: int = 256, early: int = 3, z: float = 1.5):
        self.window = window                                 # passes per budget the mean is over
        self.min_samples = min_samples                       # passes at a budget before the mean decides...
        self.early = min(early, min_samples)                 # ...and before it, from this many, the bound does:
        self.z = z                                           # mean gain + z standard errors against the price
        self.probe = probe                                   # a skipped pass first runs again after this many blocks
        self.probe_max = max(probe, probe_max)               # ...and the interval doubles per losing probe up to this
        self.samples: dict[int, list[RedraftSample]] = {}    # budget -> its recent passes
        self.skips: dict[int, int] = {}                      # budget -> passes skipped since its last one
        self.interval: dict[int, int] = {}                   # budget -> blocks from one probe to the next
        # fixed budget only: (tokens the block produced = accepted + 1, its ms from draft to commit)
        self.blocks: deque[tuple[int, float]] = deque(maxlen=rate_blocks)

    def pays(self, v: int, rate: Callable[[], float | None]) -> bool:
        """Whether the pass runs at budget v; `rate()`: tokens per ms at v (called only once v, or the pool, has
        `early` samples)."""
        seen = self.samples.get(v, [])
        basis = own_or_pooled(self.samples, v, self.early)
        r = rate() if len(basis) >= self.early else None
        if r is None or self._runs(basis, r):
            self.skips[v] = 0
            self.interval[v] = self.probe
            return True
        if (seen and self.skips.get(v, 0) == 0 and self.interval.get(v, 0) > self.probe
                and seen[-1].gain > r * seen[-1].ms):
            self.interval[v] = self.probe                    # the last probe won its price by itself: sample again soon
        interval = self.interval.setdefault(v, self.probe)
        self.skips[v] = self.skips.get(v, 0) + 1
        if self.skips[v] < interval:
            return False
        self.skips[v] = 0                                    # probe now; the next one after twice the interval
        self.interval[v] = min(2 * interval, self.probe_max)
        return True

    def _runs(self, seen: list[RedraftSample], r: float) -> bool:
        """The decision at rate r (tokens per ms). From `min_samples` passes: mean gain > r x mean ms. Before
        that, the pass runs while its gain could still beat the price: mean + `z` standard errors, the spread
        floored at a count's (variance = mean with one gained token in n + 1 passes; as BudgetTuner.could_win),
        so three passes that won nothing stop a pass that costs half a token but not one that costs a tenth."""
        gains = [s.gain for s in seen]
        n, gain, price = len(gains), statistics.fmean(gains), r * statistics.fmean(s.ms for s in seen)
        if n >= self.min_samples:
            return gain > price
        var = max(statistics.variance(gains) if n > 1 else 0.0, (max(sum(gains), 0) + 1) / (n + 1))
        return gain + self.z * math.sqrt(var / n) > price

    def priced(self, v: int) -> bool:
        """Whether budget v has the `min_samples` passes its decision rests on."""
        return len(self.samples.get(v, ())) >= self.min_samples

    def observe(self, v: int, gain: int, ms: float) -> None:
        """A block verified at T=0 with budget v ran a pass of `ms` that won `gain` accepted tokens."""
        seen = self.samples.setdefault(v, [])
        seen.append(RedraftSample(gain, ms))
        del seen[: -self.window]

    def observe_block(self, tokens: int, ms: float) -> None:
        """A block at a fixed budget produced `tokens` (accepted + bonus) in `ms` (draft to commit)."""
        self.blocks.append((tokens, ms))

    def measured_rate(self) -> float | None:
        """Tokens per ms over the recent fixed-budget blocks, those with the pass and those without it
        (as the tuner's rate(v) averages both); None before any block."""
        ms = sum(m for _, m in self.blocks)
        return sum(t for t, _ in self.blocks) / ms if ms > 0 else None
