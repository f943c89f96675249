"""Cost-aware tree budget: pick V_max to maximise expected tokens per second.

The paper's efficiency model: tokens/s ~ (E[a] + 1) / (C_d + C_v(V)). A bigger tree only pays
when the extra accepted tokens outgrow the extra verification cost, and C_v's shape depends on
the machine (steep on a CPU, nearly flat on a GPU up to dozens of tokens). So the engine
  1. measures C_v(V), one target forward over a root plus V tree nodes, once per model / device /
     dtype (cached on disk), and
  2. learns the drafting cost C_d(V) (a block-parallel drafter pays about the same at any V, so per
     budget; an AR drafter pays a per-block part plus one step per position it drafts, and the positions
     a budget drafts are learnt too, since a draft stop may end the chain before the budget does), and
  3. learns E[a(V)] online from the blocks it verifies: the tree's nodes are inserted in priority
     order (branch 0, then repairs; best-first for ddtree), and a budget V keeps exactly the first
     V, so a block verified with a tree of T nodes tells a(V) = accepted nodes with index < V for
     every V <= T (and for every V when the tree was not cut by its budget).
The first blocks use the warm-up budget: the largest candidate whose verification costs at most
`warmup_cost` one-token steps (the ceiling on a GPU's flat curve; 16-32 nodes on a CPU, where the
ceiling's 65-node forward costs several tokens). Then an exploration block now and then tries the next budget up,
so the estimates just above the chosen one stay fresh without paying for the largest trees (or, over a
block-parallel drafter, the next one down while its drafting cost is unsampled; or the warm-up budget again
while budgets up to it are unrated: `exploration`). The
exploration interval starts at `explore_every` blocks and doubles (up to `explore_max`) while the
best budget does not move, so a settled choice costs almost nothing to keep checking.
Budget 0 is a candidate too: no draft, a plain ar step (no drafting cost). Where no tree pays, e.g.
a CPU that verifies 2 tokens in twice the time of 1, the tuner settles there and cure runs at ar's
speed plus the warm-up and the (ever rarer) exploration blocks, instead of below it.
"""
from __future__ import annotations

import bisect
import itertools
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .block import Block
from .cpu_kernels import MIN_ROWS, cpu_info, is_packed, run_dtype
from .lm import CachedLM, padded_size
from .progress import phase
from .redraft_price import RedraftPrice
from .tree import argmax

# Tree sizes the cost curve is measured at (and the tuner's candidate budgets, engine._make_tuner). Rule: every
# size up to 8. Why: CPU matmul kernels step at small row counts (oneDNN's float32 kernels: 1-6 rows at about
# one price, 7 at +15-30%; benchmarks/results/cost_steps_cpu), and a curve that skips sizes cannot offer the
# budgets inside a step.
SIZES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128)


@dataclass(frozen=True)
class CostCurve:
    sizes: tuple[int, ...]          # tree sizes V measured (root excluded)
    verify_ms: tuple[float, ...]    # one target forward over root + V nodes, median
    key: str | None = None          # its entry in the disk cache (None: not cached)

    def verify(self, v: float) -> float:
        """C_v(V), linear between measured sizes, extrapolated past the last one."""
        xs, ys = self.sizes, self.verify_ms
        if v <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if v <= x1:
                return y0 + (y1 - y0) * (v - x0) / (x1 - x0)
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + slope * (v - xs[-1])

    def to_dict(self) -> dict:
        return {"sizes": list(self.sizes), "verify_ms": list(self.verify_ms)}


def _model_key(model, ctx_len: int, kv: str = "dynamic", compile: bool = False) -> str:
    device = next(model.parameters()).device
    name = getattr(model.config, "_name_or_path", "") or model.config.model_type
    n = sum(x.numel() for x in model.parameters())
    kernels = f"packed{MIN_ROWS}" if is_packed(model) else "eager"   # the row padding changes the curve's low end
    path = f"{kv}-compiled" if compile else kv                      # CUDA graphs flatten a GPU's curve 4x
    # Rule: the dtype its matmuls run in (run_dtype), not its parameters': an int8 target's parameters are the
    # float32 ones its linears did not take, as a float32 target's under packed kernels are
    cpu = cpu_info()["cpu_model"] if device.type == "cpu" else None          # the machine, where a cache is shared
    return (f"{name}|{n}|{device}|{run_dtype(model)}|ctx{ctx_len}|torch{torch.__version__}|threads{torch.get_num_threads()}"
            f"|{kernels}|{path}|{cpu}|rounds|max|int8x2")   # rounds: timed in interleaved rounds; max: argmax's
    # read; int8x2: an int8 target's rows in two levels (cpu_kernels.row_int8_matmul)


def _cache_file() -> Path:
    from .catalog import cache_root
    return cache_root() / "cost_curves.json"


@torch.inference_mode()
def measure_cost_curve(model, max_size: int = 64, ctx_len: int = 128, repeats: int = 3,
                       use_disk_cache: bool = True, kv: str = "dynamic", compile: bool = False) -> CostCurve:
    """Time target forwards over a root + V chain on a random context of ctx_len tokens.
    Rule: measure through the execution path the engine will decode with (KV layout, compiled or
    not): on a GPU, compiled forwards replay CUDA graphs at a quarter of the eager time, and the
    eager curve is launch-bound noise (benchmarks/results, gpu_h200)."""
    key = _model_key(model, ctx_len, kv, compile)
    sizes = tuple(s for s in SIZES if s <= max_size) + ((max_size,) if max_size not in SIZES else ())
    path = _cache_file()
    if use_disk_cache and path.exists():
        try:
            saved = json.loads(path.read_text()).get(key)
            # a curve cached before SIZES grew lacks sizes it would interpolate: measured again
            if saved and max(saved["sizes"]) >= max_size and set(sizes) <= set(saved["sizes"]):
                return CostCurve(tuple(saved["sizes"]), tuple(saved["verify_ms"]), key)
        except (OSError, ValueError, KeyError):
            pass
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (ctx_len,), generator=gen).tolist()
    lm = CachedLM(model, kv=kv, compile=compile, capacity=ctx_len + padded_size(max_size + 1) + 2)
    lm.prefill(ctx)
    chains = {v: torch.randint(0, vocab, (v + 1,), generator=gen).tolist() for v in sizes}
    # Rule: rounds over every size, the least disturbed run per size kept (noise only adds time). Why: a burst
    # of other load then spoils one round of a few sizes, not every run of one size, which would cache a flat
    # curve (every V "as cheap as one token") and send the tuner to trees that lose.
    times = {v: math.inf for v in sizes}
    with phase(f"measuring the verification cost curve ({len(sizes)} tree sizes, once per model and machine)",
               total=repeats + 1) as update:
        for r in range(repeats + 1):                     # round 0 warms every shape up
            for v in sizes:
                ms = _time_forward(lm, chains[v])
                if r:
                    times[v] = min(times[v], ms)
            update(r + 1)
    curve = CostCurve(sizes, tuple(_isotonic([times[v] for v in sizes])), key if use_disk_cache else None)
    if use_disk_cache:
        def put(data: dict) -> bool:
            data[key] = curve.to_dict()
            return True
        _edit_cache(put)
    return curve


def forget_cost_curve(key: str) -> bool:
    """Drop one curve from the disk cache (the next `measure_cost_curve` for its model measures again);
    True if it was there."""
    return _edit_cache(lambda data: data.pop(key, None) is not None)


def _edit_cache(edit: Callable[[dict], bool]) -> bool:
    """Read the cost-curve cache, apply `edit` (True: it changed something) and write it back atomically
    (a temporary file replaced into place, so a concurrent reader sees the old file or the new one).
    False where nothing changed or the file could not be read or written."""
    path = _cache_file()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
        if not edit(data):
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
        return True
    except (OSError, ValueError):
        return False


def _time_forward(lm: CachedLM, toks: list[int]) -> float:
    """ms of one target forward over a root + (len(toks) - 1)-node chain, the argmax read back as
    acceptance reads it; the KV rows it wrote are rolled back."""
    device = lm.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fwd = lm.forward(toks, [-1] + list(range(len(toks) - 1)))
    argmax(fwd.logits).tolist()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ms = (time.perf_counter() - t0) * 1e3
    lm.rollback()
    return ms


def _isotonic(ys: list[float]) -> list[float]:
    """Rule: verification never gets cheaper with more nodes. Pool adjacent violators, so one noisy
    point is averaged with its neighbours instead of lifting every larger size."""
    blocks = [[y, 1] for y in ys]                          # [mean, count]
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] > blocks[i + 1][0]:
            m0, n0 = blocks[i]
            m1, n1 = blocks.pop(i + 1)
            blocks[i] = [(m0 * n0 + m1 * n1) / (n0 + n1), n0 + n1]
            i = max(i - 1, 0)
        else:
            i += 1
    out = []
    for m, n in blocks:
        out += [m] * n
    return out


@dataclass(frozen=True)
class DraftCost:
    """One drafting block's cost sample."""
    budget: int          # the budget it was drafted under
    positions: int       # positions the drafter drafted (branch 0's length)
    ms: float            # C_d: draft + tree + commit


def _tells(u: int, size: int, cut: bool) -> bool:
    """Whether a verified block with a tree of `size` nodes tells a(u). Rule: it does unless its tree was cut
    (by its budget or the generation's end) below u: then what u more nodes would have accepted is unknown."""
    return not (cut and u > size)


def fit_calibration(chains: list[tuple[list[float], int]], hi: float = 2.0) -> float:
    """gamma by maximum likelihood over chains (the joint draft log-prob at depths 1..D, the depths the target
    accepted): depth d accepted with probability exp(gamma x l_d), on a grid in [1/16, hi] (`fit_power`)."""
    logp = np.array([lp for lps, _ in chains for lp in lps], dtype=np.float64)                   # [n]
    hit = np.array([d < a for lps, a in chains for d in range(len(lps))], dtype=bool)             # [n]
    return fit_power(logp, hit, hi)


def fit_power(logp: np.ndarray, hit: np.ndarray, hi: float = 2.0) -> float:
    """The rule: gamma maximising the likelihood of P(accepted) = exp(gamma x logp) over points [n] (log-probs
    <= 0, `hit` whether each was accepted), on a 49-point log grid in [1/16, hi]. A hit adds gamma x l, a miss
    log(1 - exp(gamma x l)); only the misses need the transcendental (the blocks' fits run every 8 blocks)."""
    grid = np.exp(np.linspace(math.log(1 / 16), math.log(hi), 49))                                # [G]
    hits, misses = logp[hit], logp[~hit]
    ll = np.minimum(grid[:, None] * hits[None, :], -1e-9).sum(1)                                  # [G]
    if misses.size:
        ll += np.log(-np.expm1(np.minimum(grid[:, None] * misses[None, :], -1e-9))).sum(1)
    return float(grid[int(np.argmax(ll))])


class BudgetTuner:
    """Online choice of the tree budget V from the cost curve and the acceptance seen so far."""

    def __init__(self, curve: CostCurve, candidates: list[int], window: int = 64, explore_every: int = 8,
                 warmup: int = 2, explore_max: int = 64, warmup_cost: float = 2.0,
                 steps: Callable[[int], int] | None = None, priced_before_zero: int = 3,
                 redraft_min: int = 8, redraft_probe: int = 8, stale_after: int = 32, stale_ratio: float = 2.0,
                 memory: int = 256, probe_min: int = 4, probe_max: int = 12, probe_z: float = 1.5,
                 cost_min: int = 3):
        self.curve = curve
        # sequential drafter steps a budget costs (an AR chain: one per drafted position, min(V, K-1));
        # None: one pass at any budget (a block-parallel drafter)
        self.steps = steps
        self.candidates = sorted(set(candidates))
        self.ceiling = self.candidates[-1]
        self.window = window
        self.explore_every = explore_every                   # blocks between explorations, at first...
        self.explore_max = explore_max                       # ...doubling up to this while the best stays put
        self.interval = explore_every
        self.next_explore = warmup + explore_every           # block number of the next exploration
        self.settled: int | None = None                      # the best budget at the last exploration
        self.probe: tuple[int, float | None] | None = None   # (budget, expected a(V)) of a pending exploration
        self.warmup = warmup                                 # first blocks verified at the warm-up budget
        self.priced_before_zero = priced_before_zero         # C_d samples a sequential drafter needs before budget 0
        # Rule: warm-up blocks learn a(V) for every V up to their budget at once, so they want the largest
        # tree whose verification costs at most `warmup_cost` one-token steps.
        cheap = [v for v in self.candidates if v > 0 and curve.verify(v) <= warmup_cost * curve.verify(0)]
        self.warmup_budget = max(cheap) if cheap else min((v for v in self.candidates if v > 0), default=0)
        self.history: list[tuple[list[int], int, bool]] = []   # (sorted accepted node indices, tree size, cut)
        # the last `memory` blocks are kept; each budget's a(V) increment is over the last `window` of them that
        # tell it, and a budget told by fewer than `probe_min` of them is thin (`wide_probe`)
        self.memory = max(memory, window)
        self.probe_min = probe_min
        # beyond `probe_min`, wide probes go on while a budget above the best could still win: its a(V) plus
        # `probe_z` standard errors of its gain over the best (`could_win`), up to `probe_max` telling blocks
        self.probe_max = max(probe_max, probe_min)
        self.probe_z = probe_z
        self.probing = False                                 # the last exploration was a thin or could-win probe
        self._accept: dict[int, float | None] = {}           # cached `expected_accept`, reset per block
        self.costs: list[DraftCost] = []                     # one per drafting block: budget, positions, C_d ms
        self.cost_min = cost_min                             # C_d samples a budget needs to be priced by its own
        self._line: tuple[float, float] | None = None        # cached (c0, c1) of `cost_line`, reset per sample
        self._survival: list[float] | None = None            # cached `drafted_survival`, reset per sample
        # per drafting block under a draft stop: (the chain's joint draft log-prob at depths 1..D, the
        # chain's tokens the target accepted): what `calibration` fits
        self.chains: list[tuple[list[float], int]] = []
        self._gamma: float | None = None                     # cached `calibration`, reset per sample
        self.verify_scale: list[float] = []                  # measured verify_ms / curve's C_v(V): load drift
        self.stale_after = stale_after                       # blocks of verify_scale, and the drift beyond which...
        self.stale_ratio = stale_ratio                       # ...the cached curve is dropped (`_check_stale_curve`)
        self.curve_forgotten = False                         # `_check_stale_curve` has dropped it
        # best-first cure's re-draft pass per budget (redraft_price.py): the last window / 2 passes decide
        self.redraft = RedraftPrice(window // 2, min_samples=redraft_min, probe=redraft_probe)
        self.blocks = 0
        self.fresh = True                                    # no drafting block yet in this generation
        self.last_choice = self.ceiling
        self.last_prediction: float | None = None
        self.last_phase = "settled"

    def expected_accept(self, v: int) -> float | None:
        """E[a(V)]: accepted nodes with index < v per block. Rule: the blocks that tell a(v) for a large v are
        the few drafted under a large budget (warm-up, explorations); the blocks that tell a small one are
        all of them. Why: averaged over the large-budget blocks alone, a(v) takes the luck of those few blocks
        at every depth (a prompt's hard opening can price a large budget below a small one that accepts
        more). So a(v) is chained over the candidate budgets below it: a(u_1) from every block that tells it, plus,
        for each next budget u_j <= v, the mean increment a(u_j) - a(u_j-1) over the blocks that tell
        a(u_j). With every block telling every budget this is the plain mean (the sums telescope). None
        when no block tells a(v)."""
        if v <= 0:
            return 0.0 if self.history else None
        if not self._accept:                               # every candidate's, in one sweep up the chain
            self._accept = self._chain([c for c in self.candidates if c > 0])
        if v not in self._accept:
            self._accept.update(self._chain([c for c in self.candidates if 0 < c < v] + [v]))
        return self._accept[v]

    def _chain(self, levels: list[int]) -> dict[int, float | None]:
        """{u: a(u)} for increasing budgets `levels`, each the one below's plus the mean increment over the
        blocks that tell it: those among the last `window` blocks, and older ones from `memory` until there
        are `probe_min` (None from the first level that no block tells). Why: a level told only by warm-up and
        exploration blocks has one or two of them in the window, and their luck would be its estimate; the
        window alone still decides where it holds enough, so the estimate follows drafts that change."""
        out: dict[int, float | None] = {}
        total, prev = 0.0, 0
        # (age, accepted, tree size, cut), newest first; a block that does not tell a(u) tells no level above
        # it, so each level filters the one below's
        tell = [(age, *h) for age, h in enumerate(reversed(self.history))]
        for u in levels:
            tell = [e for e in tell if _tells(u, e[2], e[3])]
            if not tell:
                out.update((w, None) for w in levels if w >= u)
                break
            keep = max(self.probe_min, bisect.bisect_left(tell, (self.window,)))
            inc = [bisect.bisect_left(acc, u) - bisect.bisect_left(acc, prev) for _, acc, _, _ in tell[:keep]]
            total += sum(inc) / len(inc)
            out[u], prev = total, u
        return out

    def told(self, v: int, last: int | None = None) -> int:
        """Blocks that tell a(v), among the last `last` blocks (None: all of memory)."""
        recent = self.history[-last:] if last else self.history
        return sum(1 for _, size, cut in recent if _tells(v, size, cut))

    def expected_size(self, v: int) -> float:
        """E[V(T)] under budget v: a tree holds min(v, the nodes its block offered); for a block whose
        tree was cut, the nodes it offered beyond its budget are unknown, so assume v."""
        sizes = [min(size, v) if _tells(v, size, cut) else v for _, size, cut in self.history[-self.window:]]
        return sum(sizes) / len(sizes) if sizes else float(v)

    def rate(self, v: int) -> float | None:
        """Predicted tokens per ms with budget v."""
        ea = self.expected_accept(v)
        if ea is None:
            return None
        return (ea + 1.0) / (self.drafting_ms(v) + self.verify_ms(self.expected_size(v)))

    def drafting_ms(self, v: int) -> float:
        """C_d(v), learned from the drafting blocks. Rule: budget 0 drafts nothing (C_d = 0: a plain ar step).
        A block-parallel drafter (`steps` None) pays one pass at any budget, plus tree work that grows with
        v: the mean over recent blocks drafted at v; between two budgets with samples, linear in v; outside
        them, the nearest one's. A sequential drafter pays per position it drafts: C_d(v) = c0 + c1 x
        E[positions drafted under v] (`cost_line`, `expected_drafted`). Why both parts: priced in proportion to
        the steps alone, a long chain costs too much where the per-block part c0 is large, and a stopped chain
        costs the steps it never drafted. How large c0 is varies by pair and run; it is learnt, not assumed.
        Rule: over a block-parallel drafter, a budget is priced by its own samples alone once it holds `cost_min`
        of them in the window; with fewer, by the budgets that hold enough (between two, linear; outside, the
        nearest; before any does, the median of every sample), or by its own mean where that is lower. Why: one
        block drafted in a burst of other load carries the burst. Priced too low, a budget gets chosen or
        explored, and its samples correct the price; priced too high, nothing brings it samples."""
        if v == 0 or not self.costs:
            return 0.0
        if self.steps is not None:
            c0, c1 = self.cost_line()
            return c0 + c1 * self.expected_drafted(v)
        by = self.cost_samples()
        own = sum(by[v]) / len(by[v]) if v in by else math.inf
        mean = {b: sum(ms) / len(ms) for b, ms in by.items() if len(ms) >= self.cost_min}   # the priced budgets
        if v in mean:
            return mean[v]
        if not mean:                                       # none priced yet: every sample, pooled
            return min(own, statistics.median(ms for got in by.values() for ms in got))
        lo = max((b for b in mean if b <= v), default=None)
        hi = min((b for b in mean if b >= v), default=None)
        if lo is None or hi is None:
            est = mean[lo if hi is None else hi]
        else:
            est = mean[lo] + (mean[hi] - mean[lo]) * (v - lo) / (hi - lo)
        return min(own, est)                               # a few own samples may lower the price, never raise it

    def cost_samples(self) -> dict[int, list[float]]:
        """{budget: C_d ms of its drafting blocks in the window}."""
        by: dict[int, list[float]] = {}
        for c in self.costs[-self.window:]:
            by.setdefault(c.budget, []).append(c.ms)
        return by

    def cost_line(self) -> tuple[float, float]:
        """(c0, c1): a sequential drafter's C_d = c0 + c1 x positions drafted, fitted over the recent drafting
        blocks. c1 is what one more position costs (a drafter step, its re-draft rows, its share of the tree
        work); c0 what a block costs whatever it drafts (the drafter's catch-up on the accepted tokens, the
        tree's fixed part, the commit). Rule: the fit is Theil-Sen (c1 the median slope over pairs of blocks
        that drafted different lengths, c0 the median residual), not least squares. Why: single blocks run
        2-3x slow (a shape the CPU kernels meet for the first time, another job's burst), and one such block
        would set a least-squares line. Where the
        lengths barely vary (fewer pairs that differ than blocks: one block alone would set the slope) or
        the fit comes out negative, the line goes through 0 (c1 = median ms per position), which prices
        unsampled budgets high, never low; explorations then bring the samples that identify c0."""
        if self._line is None:
            recent = self.costs[-self.window:]
            pos = np.array([c.positions for c in recent], dtype=np.float64)                     # [n]
            ms = np.array([c.ms for c in recent], dtype=np.float64)                             # [n]
            some = pos > 0
            line = (0.0, float(np.median(ms[some] / pos[some]))) if some.any() else (0.0, 0.0)
            i, j = np.triu_indices(len(recent), 1)                                              # every pair
            differ = pos[i] != pos[j]
            if len(recent) >= 4 and differ.sum() >= len(recent):
                c1 = float(np.median((ms[j] - ms[i])[differ] / (pos[j] - pos[i])[differ]))
                c0 = float(np.median(ms - c1 * pos))
                if c1 > 0 and c0 >= 0:
                    line = (c0, c1)
            self._line = line
        return self._line

    def expected_drafted(self, v: int) -> float:
        """E[positions a sequential drafter drafts under budget v]: at most steps(v); fewer where the draft
        stop ends the chain first. Rule: the stop depths are learnt as a survival curve (Kaplan-Meier) over
        the recent drafting blocks: a block drafted under budget b that drafted p < steps(b) positions
        stopped at p; one that drafted all steps(b) only says its stop lies deeper (censored). Then
        E = sum over positions d <= steps(v) of P(the chain reaches d). Without a stop (sd, ddtree) no
        block stops early and E = steps(v)."""
        n = self.steps(v)
        survival = self.drafted_survival()
        return sum(survival[d] if d < len(survival) else survival[-1] for d in range(n))

    def drafted_survival(self) -> list[float]:
        """[P(a chain drafts more than d positions) for d = 0, 1, ...]; entry 0 is 1 (every drafting block
        drafts a first position), and the last entry holds for every deeper d (no block reached further)."""
        if self._survival is None:
            recent = [(c.positions, self.steps(c.budget)) for c in self.costs[-self.window:]]
            deepest = max((p for p, _ in recent), default=0)
            # at depth d a block is at risk when it drafted d and could have drafted more (p >= d, cap > d),
            # and stopped there when p == d < cap: counted in one pass (a difference array for the risk set)
            entering, stopped = [0] * (deepest + 2), [0] * (deepest + 2)
            for p, cap in recent:
                top = min(p, cap - 1)                     # at risk at depths 1..top
                if top >= 1:
                    entering[1] += 1
                    entering[top + 1] -= 1
                if p < cap:
                    stopped[p] += 1
            survival, s, at_risk = [1.0], 1.0, 0
            for d in range(1, deepest + 1):
                at_risk += entering[d]
                if at_risk:
                    s *= 1.0 - stopped[d] / at_risk
                survival.append(s)
            self._survival = survival
        return self._survival

    def draft_stop(self, v: int) -> float | None:
        """log theta: a sequential drafter (steps set) drafting for budget v stops once its chain's joint
        draft probability p falls below theta^(1/gamma). Rule: one more position is worth drafting while
        what it can add, at most P(the target accepts the chain so far) = p^gamma tokens (`calibration`),
        beats what its cost would earn at the predicted rate: theta = rate(v) x (one more position, c1 of
        `cost_line`, not the block's mean per position, whose per-block part stopping does not save; plus
        one more verified node). None before anything is measured, for a block-parallel drafter, and for
        budget 0."""
        if self.steps is None or v <= 0 or not self.costs:
            return None
        r = self.rate(v)
        if r is None:
            return None
        theta = r * (self.cost_line()[1] + self.node_ms(v))
        # the chain's tokens are accepted with probability p^gamma, not p: stop where p^gamma < theta
        return math.log(min(theta, 1.0)) / self.calibration() if theta > 0 else None

    def node_ms(self, v: int) -> float:
        """One verified node's time at budget v: (C_v(v) - C_v(0)) / v."""
        return (self.verify_ms(v) - self.verify_ms(0)) / v

    def alt_floor(self, v: int) -> float:
        """The joint draft log-prob a node off the drafted chain
        needs to join a tree of budget v (best_first `floor`). Rule: as for a chain position (`draft_stop`), a
        node is worth its row while what it can add, at most P(the target accepts it) = p^gamma tokens, beats
        what its time would earn at the predicted rate: p^gamma >= rate(v) x `node_ms`. The chain's positions
        pass the draft stop's bar, which holds the same row and a drafter step; the tree's alternatives had
        none, and the budget let them in wherever the chain left room. -inf before anything is rated and at
        budget 0."""
        r = self.rate(v) if v > 0 and self.costs else None
        if r is None:
            return -math.inf
        price = r * self.node_ms(v)
        return math.log(min(price, 1.0)) / self.calibration() if price > 0 else -math.inf

    def calibration(self) -> float:
        """gamma: the target accepts a chain whose joint draft probability is p with probability about
        p^gamma. Rule: the draft stop weighs a position by what the target will accept, and a draft model's
        own probability is not that (a small drafter can be unsure of chains its target accepts whole). So
        gamma is fitted by maximum likelihood over the recent blocks' drafted depths (each depth d: joint
        log-prob l_d, and whether the target accepted the chain through d), on a grid in [1/16, 2]; 1
        (p itself) until 8 blocks have been seen."""
        if self._gamma is None:
            recent = self.chains[-self.window:]
            self._gamma = fit_calibration(recent) if len(recent) >= 8 else 1.0
        return self._gamma

    def _check_stale_curve(self) -> None:
        """Rule: the disk cache keeps a curve for good, and `verify_scale` corrects its level, not its shape. Why:
        a curve measured while another job loaded the box has the wrong shape too (a cost step where the
        kernels have none), which no rescaling fixes. Once
        `stale_after` blocks put the median scale outside [1/stale_ratio, stale_ratio], the cached entry is
        dropped, so the next process measures the curve again; this one keeps what it has (a measurement
        mid-answer would stall it)."""
        if self.curve_forgotten or self.curve.key is None or len(self.verify_scale) < self.stale_after:
            return
        scale = statistics.median(self.verify_scale[-self.stale_after:])
        if not 1 / self.stale_ratio <= scale <= self.stale_ratio:
            forget_cost_curve(self.curve.key)               # (already gone: another process dropped it)
            self.curve_forgotten = True

    def scale(self) -> float:
        """How verification times run now against the start-up curve (median over the window)."""
        return statistics.median(self.verify_scale[-self.window:]) if self.verify_scale else 1.0

    def verify_ms(self, v: float) -> float:
        """C_v(V): the start-up curve, rescaled online by how verification times run now."""
        return self.curve.verify(v) * self.scale()

    def choose(self) -> int:
        self.blocks += 1
        self.last_phase = "settled"                        # why this budget: warmup | explore | unpriced | settled
        if len(self.history) < self.warmup:
            choice = self.warmup_budget                    # warm-up: learn a(V) for every V at once
            self.last_phase = "warmup"
        else:
            rated = [(r, v) for v in self.candidates if (r := self.rate(v)) is not None]
            choice = max(rated, key=lambda rv: (rv[0], -rv[1]))[1] if rated else self.ceiling
            # (what to explore is worked out on exploration blocks only, not on every block)
            if self.blocks >= self.next_explore and (probe := self.exploration(choice)) is not None:
                # Rule: explore next to the best (`exploration`), so the estimates there stay fresh. The
                # interval doubles (up to explore_max) while the best has not moved since the last exploration,
                # and falls back to explore_every when it moves: settled at budget 0 on a CPU, exploring V=1
                # every 8th block would cost several percent for good.
                # A wide probe that gathers telling blocks (thin or could-win: `wide_probe`, `probing`) keeps the
                # interval at explore_every: what it is for is telling blocks soon, not one now and then.
                same = choice == self.settled and not self.probing
                self.interval = min(2 * self.interval, self.explore_max) if same else self.explore_every
                self.settled = choice
                self.next_explore = self.blocks + self.interval
                # a wide probe (`wide_probe`) has no estimate to beat: whether it moved the best shows at the
                # next exploration, which resets the interval then (`same`)
                expect = self.expected_accept(probe)
                self.probe = None if expect is None and probe == self.warmup_budget else (probe, expect)
                choice = probe
                self.last_phase = "explore"
            if choice == 0 and self.steps is not None and len(self.costs) < self.priced_before_zero:
                # Rule: a sequential drafter's tuner leaves for budget 0 only once `priced_before_zero` blocks
                # have priced drafting; before that it drafts at the best-rated non-zero budget. With one or
                # two samples its cost line is a guess (c1 = ms per position through 0, one slow block's
                # worth), and budget 0 drafts nothing, so nothing would correct the guess: explorations then
                # come ever more rarely.
                best = self.best_tree()
                if best is not None:
                    choice = best[0]
                    self.last_phase = "unpriced"
        self.last_choice = choice
        self.last_prediction = self.predicted_speedup(choice)
        return choice

    def exploration(self, best: int) -> int | None:
        """The budget an exploration block tries when the best is `best`: one step up, so a(V) stays fresh
        there; but one step down first where a block-parallel drafter's cost there is unsampled. Rule: a
        block-parallel drafter's C_d grows with the budget (cure's re-drafts), and `drafting_ms` prices a
        budget below every sample at the smallest priced one's cost. Why: that price is too high, and nothing
        would correct it, since explorations only go up and every block's a(V) already tells the smaller
        budget's acceptance. A sequential drafter's cost line prices every budget from any samples, so it
        explores up only. One sample below is enough: `drafting_ms` lets a budget's own samples lower its price
        before it holds `cost_min` (asking for `cost_min` here sends a settled tuner down where it should go
        up). None: nothing to explore."""
        self.probing = False
        if self.steps is None:
            below = [v for v in self.candidates if 0 < v < best]
            if below and below[-1] not in self.cost_samples():
                return below[-1]
        if wide := self.wide_probe(best):
            return wide
        bigger = [v for v in self.candidates if v > best]
        return bigger[0] if bigger else None

    def wide_probe(self, best: int) -> int | None:
        """The budget above one step up that an exploration from `best` tries (None: one step up). Rule: blocks
        settled at `best` tell a(V) for V <= best only, so every budget above rests on the warm-up and
        exploration blocks, and one-step-up explorations climb only while each single step pays for itself:
        a cost curve with a step at the low end can hold the tuner below trees that accept far more. A block
        verified at the warm-up budget tells a(V) for every V up to it at once, for at most `warmup_cost`
        one-token steps; so while a budget between `best` and the warm-up budget is unrated in the window, or
        thin (told by fewer than `probe_min` blocks in memory), the exploration goes there. `probe_min` is 4,
        two probes beyond the warm-up: each probe costs up to a one-token step where it loses, and one telling
        block is too few where acceptance is lumpy. A block that tells a(v) tells a(u) for every
        u < v, so the warm-up budget is the least told of the budgets between: counting its telling blocks
        counts theirs. Past `probe_min`, probes go on at the largest budget that `could_win` (up to
        `probe_max` telling blocks there)."""
        wide = self.warmup_budget
        if wide <= best:
            return None
        # `probing`: this probe is there to gather telling blocks, so the exploration interval stays short
        self.probing = self.thin(wide)
        if self.probing or self.told(wide, self.window) == 0:
            return wide
        u = self.could_win(best)
        self.probing = u is not None
        return u

    def thin(self, v: int) -> bool:
        """Whether fewer than `probe_min` blocks in memory tell a(v) (then fewer tell any budget above v)."""
        return self.told(v) < self.probe_min

    def could_win(self, best: int) -> int | None:
        """The largest budget u between `best` and the warm-up budget, told by fewer than `probe_max` blocks in
        memory, that could still beat `best`: rated with a(u) plus `probe_z` standard errors of its per-block
        gain over a(best) (accepted nodes with index in [best, u)) among the blocks that tell a(u). None: no
        such budget. The largest, since a probe there tells every budget below it too; not the warm-up
        budget, since where only a cheap one could win, a probe there would pay for nodes nothing bets on.
        Rule: past `probe_min`, probe while the bound could win. Why: `probe_min` telling blocks are few where
        acceptance is lumpy, and a larger fixed count costs every tuner where big trees plainly lose. The bound
        stops probing where even an optimistic gain cannot pay for the bigger tree (a probe that costs a
        one-token step needs a gain near a whole token), and goes on where the gain is uncertain and its cost
        small."""
        base = self.rate(best)
        for u in reversed([c for c in self.candidates if best < c <= self.warmup_budget]):
            tell = [acc for acc, size, cut in self.history if _tells(u, size, cut)]
            n, a = len(tell), self.expected_accept(u)
            if n >= self.probe_max:
                continue
            if n < 2 or a is None or base is None:
                return u
            gains = [bisect.bisect_left(acc, u) - bisect.bisect_left(acc, best) for acc in tell]
            # the spread is at least a count's (variance = mean) with one gained node in n + 1 blocks: four
            # blocks that all gained nothing have not shown that u gains nothing
            var = max(statistics.variance(gains), (sum(gains) + 1) / (n + 1))
            bound = a + self.probe_z * math.sqrt(var / n)
            if (bound + 1.0) / (self.drafting_ms(u) + self.verify_ms(self.expected_size(u))) > base:
                return u
        return None

    def redraft_pays(self, v: int) -> bool:
        """Whether best-first cure's re-draft pass runs at budget v: while its measured gain beats the
        predicted rate(v) x its ms (the rule and why: redraft_price.py). Over a chain drafter the re-drafts
        ride in the chain's steps: no pass, no sample, always True.
        Rule: a warm-up or exploration block runs it only where v's own passes have priced it. Why: those
        blocks are there to rate a tree, and a budget visited only by them never gathers the passes its price
        needs, so each of its visits would run the pass unpriced. A settled budget runs its first passes as
        before."""
        if self.last_phase in ("warmup", "explore") and not self.redraft.priced(v):
            return False
        return self.redraft.pays(v, lambda: self.rate(v))

    def observe_redraft(self, v: int, gain: int, ms: float) -> None:
        """A block verified at temperature 0 with budget v ran a re-draft pass of `ms` that won `gain`
        accepted tokens over the tree before it."""
        self.redraft.observe(v, gain, ms)

    def best_tree(self) -> tuple[int, float] | None:
        """(budget, predicted speedup over ar) of the best non-zero budget: what budget 0 was chosen over."""
        rated = [(s, v) for v in self.candidates if v > 0 and (s := self.predicted_speedup(v)) is not None]
        if not rated:
            return None
        s, v = max(rated, key=lambda sv: (sv[0], -sv[1]))
        return v, s

    def predicted_speedup(self, v: int) -> float | None:
        """Predicted speedup over AR (one target forward per token: C_v(0))."""
        r = self.rate(v)
        return r * self.verify_ms(0) if r is not None else None

    def observe(self, block: Block, budget: int, clipped: bool = False,
                chain_logp: list[float] | None = None) -> None:
        """Learn from a verified block drafted under `budget`. `clipped`: the end of the generation (max
        new tokens, the context) left the block less room than a full one, so its tree says nothing
        about what the budget would have offered or cost. `chain_logp`: under a draft stop, the draft
        log-prob of each of branch 0's tokens (what `calibration` learns from)."""
        t = block.timings
        if block.index == 0:
            self.fresh = True
        if budget > 0 and block.tree_size > 0:            # C_d is the cost of drafting blocks only
            # Rule: a generation's first drafting block is no sample. Drafters once took in the prompt at their
            # first pass (now the engine's prefill step does, unless the generation opens at budget 0), and
            # one that skipped drafting catches up on the skipped tokens at its next pass: a cost that no
            # budget causes, 2-7 drafted steps of an AR draft. Counted as a C_d sample it would price whichever
            # budget happened to open a prompt.
            if not self.fresh and not clipped:
                self.costs.append(DraftCost(budget, len(block.draft), t.draft_ms + t.tree_ms + t.commit_ms))
                self._line = self._survival = None
            if chain_logp:
                self.chains.append((list(itertools.accumulate(chain_logp)), block.branch0_accepted))
                self._gamma = None
            self.fresh = False
        expected = self.curve.verify(block.tree_size)
        if expected > 0 and t.verify_ms > 0:
            self.verify_scale.append(t.verify_ms / expected)
            self._check_stale_curve()
        if self.probe is not None:
            v, expect = self.probe
            self.probe = None
            # Rule: an exploration that beats its estimate brings the interval back to explore_every (the
            # drafts may have got better: look again soon instead of 64 blocks later).
            if expect is None or sum(1 for i in block.accepted if i < v) > expect:
                self.interval = self.explore_every
                self.next_explore = min(self.next_explore, self.blocks + self.explore_every)
        # Rule: a clipped tree is censored like one cut by its budget (counted for V <= its size only); as
        # an uncut tree, each prompt's last, short block taught a(V) = its few nodes for every V.
        # Rule: nodes past the budget tell nothing of a(V) above it (a tree larger than its budget is counted
        # as the budget's).
        size = min(block.tree_size, budget) if budget > 0 else block.tree_size
        self.history.append((sorted(block.accepted), size, clipped or size >= budget))
        self._accept = {}
        if len(self.history) > self.memory + self.window:
            del self.history[: -self.memory]
            del self.costs[: -self.window]
            del self.chains[: -self.window]
            del self.verify_scale[: -self.window]

