"""The decoding loop: one generator for every strategy, one Block per target forward.

Each iteration reads as the named steps of DESIGN.md:
    draft -> tree (UFPs, budget, repair branches, trie) -> verify (one target pass) -> commit
The root of every tree is the last emitted token, not yet in the target's KV cache; the target's
forward over [root, tree nodes] both verifies the tree and produces the next root (the bonus).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .block import Block, Resync, Timings, TreeNode
from .budget import SIZES, BudgetTuner, measure_cost_curve
from .config import ConfigError, DecodeConfig
from .drafters.base import Drafter
from .errors import CureError
from .lm import CachedLM, padded_size
from .metrics import common_prefix
from .lookup import Graft, LookupStats, NgramIndex
from .redraft_price import RedraftPrice
from .calibration import NodeCalibration
from .strategies import (CHAIN_STRATEGIES, admits, build_tree, floors, calibrates, drafted_steps, path_nodes,
                         prices_redraft_pass, propose, stops_drafting, uses_lookup)
from .tree import DraftTree, greedy_accept, sample_accept


class GenerationError(CureError, ValueError):
    """Bad input to a generation (empty prompt, prompt longer than the context...)."""


@dataclass
class ModelPair:
    """The models one engine decodes with."""
    target: torch.nn.Module                 # HF causal LM
    drafter: Drafter | None = None          # block drafter (parallel / cure / ddtree)
    ar_drafter: Drafter | None = None       # autoregressive draft model (sd)
    eos_ids: tuple[int, ...] = ()
    max_context: int | None = None          # None: the target config's max_position_embeddings
    names: dict = field(default_factory=dict)   # "target"/"draft"/"ar_draft" -> model id, for traces
    chain_strategies: frozenset[str] = frozenset({"sd"})   # the strategies that draft with ar_drafter

    @property
    def context_limit(self) -> int:
        if self.max_context is not None:
            return self.max_context
        return int(getattr(self.target.config, "max_position_embeddings", 1 << 20))

    def drafter_for(self, strategy: str) -> Drafter | None:
        if strategy == "ar":
            return None
        # Rule: sd drafts chains; a strategy in chain_strategies besides it (cure over the chain draft on a
        # target that repairs chains better than it drafts blocks: defaults.CURE_OVER_CHAIN) does too.
        if strategy in self.chain_strategies:
            if self.ar_drafter is None:
                raise ConfigError(f"strategy {strategy!r} needs an autoregressive draft model here "
                                  f"(`ar_draft`, or a PARD or AR `draft`)")
            return self.ar_drafter
        if self.drafter is None:
            raise ConfigError(f"strategy {strategy!r} needs a block-parallel drafter (`draft`)")
        return self.drafter


@dataclass
class CachedPrefix:
    """What the caches hold after a generation: kept for the next one when it asks (reuse_prefix).
    Rule: the target's rows and the drafter's state each hold a known token list; the next prompt reuses
    the longest prefix it shares with BOTH, on the same target cache and the same drafter object."""
    target: CachedLM                        # the target cache holding the rows
    drafter: Drafter | None                 # the drafter whose state goes with them (None: ar)
    target_ids: list[int] = field(default_factory=list)    # tokens of the committed K/V rows, in order
    drafter_ids: list[int] = field(default_factory=list)   # tokens given to the drafter (reset + advance)
    reused: int = 0                         # prompt tokens this generation took from the previous one


class Engine:
    """Decodes with one ModelPair under any DecodeConfig, and keeps what it learns between generations:
    the budget tuner of each config (chat turns and bench prompts share it), the target's KV
    buffers of each execution layout and, when asked, the last generation's cached prefix (chat).
    `cfg` given here is the default for `generate`."""

    def __init__(self, pair: ModelPair, cfg: DecodeConfig | None = None):
        self.pair = pair
        self.cfg = cfg if cfg is not None else DecodeConfig()
        if cfg is not None:
            pair.drafter_for(cfg.strategy)                    # fail early: the strategy needs its drafter
        self._targets: dict[tuple, CachedLM] = {}             # (hidden layers, kv layout, compile) -> cache
        self._tuners: dict[DecodeConfig, BudgetTuner] = {}    # tuner_key(cfg) -> its tuner
        self._lookups: dict[DecodeConfig, LookupStats] = {}   # tuner_key(cfg) -> lookup acceptance (cfg.lookup)
        self._prices: dict[DecodeConfig, RedraftPrice] = {}   # tuner_key(cfg) -> its re-draft pass at a fixed budget
        self._calibrations: dict[DecodeConfig, NodeCalibration] = {}   # tuner_key(cfg) -> node acceptance (calibrate)
        self._kept: CachedPrefix | None = None                # the last generation's caches (reuse_prefix)
        self._started = 0                                     # generations started: the newest owns the caches

    # Rule: a tuner learns acceptance and costs for one tree policy on one execution path; the length,
    # seed and temperature of a generation do not change either, so they share it.
    @staticmethod
    def tuner_key(cfg: DecodeConfig) -> DecodeConfig:
        return cfg.with_(max_new_tokens=1, seed=0, temperature=0.0, stop_at_eos=True)

    @property
    def tuner(self) -> BudgetTuner | None:
        """The default config's budget tuner, once a generation has made it."""
        return self._tuners.get(self.tuner_key(self.cfg))

    def tuner_for(self, cfg: DecodeConfig) -> BudgetTuner | None:
        """The budget tuner `cfg` decodes with (kept across generations); None without `v_max` auto."""
        if not cfg.auto_budget or self.pair.drafter_for(cfg.strategy) is None:
            return None
        key = self.tuner_key(cfg)
        if key not in self._tuners:
            self._tuners[key] = self._make_tuner(cfg)
        return self._tuners[key]

    def fixed_price_for(self, cfg: DecodeConfig) -> RedraftPrice | None:
        """At a fixed budget, what best-first cure's re-draft pass has measured (kept across generations, as a
        tuner is); None where the tuner prices the pass (`v_max` auto) or no pass is priced."""
        if cfg.auto_budget or not prices_redraft_pass(cfg, self.pair.drafter_for(cfg.strategy)):
            return None
        return self._prices.setdefault(self.tuner_key(cfg), RedraftPrice())

    def target_for(self, cfg: DecodeConfig) -> CachedLM:
        drafter = self.pair.drafter_for(cfg.strategy)
        layers = drafter.target_layers if drafter is not None else ()
        key = (tuple(layers), cfg.kv_cache, cfg.compile)
        if key not in self._targets:
            self._targets[key] = CachedLM(self.pair.target, hidden_layers=layers, kv=cfg.kv_cache, compile=cfg.compile)
        return self._targets[key]

    def _make_tuner(self, cfg: DecodeConfig) -> BudgetTuner:
        curve = measure_cost_curve(self.pair.target, max_size=cfg.v_max, kv=cfg.kv_cache, compile=cfg.compile)
        # Budget 0 skips drafting (a plain ar step: where verifying even 2 tokens costs more than the
        # drafts win back, e.g. a CPU); budgets up to K-1 shorten the block itself (branch 0 stays whole,
        # just shorter: a smaller K); larger ones leave room for repair branches (tree strategies only).
        shorter = [s for s in SIZES if 0 <= s < cfg.depth] + [cfg.depth]
        wider = [] if cfg.strategy in CHAIN_STRATEGIES else [s for s in SIZES if cfg.depth < s < cfg.v_max] + [cfg.v_max]
        # A sequential (AR) drafter takes one step per drafted position (strategies.drafted_steps), so its
        # tuner prices drafting per step.
        sequential = getattr(self.pair.drafter_for(cfg.strategy), "sequential", False)
        steps = (lambda v: drafted_steps(cfg, v)) if sequential else None
        return BudgetTuner(curve, sorted(set(shorter + wider)), steps=steps)

    def generate(self, prompt_ids: Sequence[int], cfg: DecodeConfig | None = None, *,
                 timings: bool = True, reuse_prefix: bool = False) -> Iterator[Block]:
        """Yield one Block per target forward until a stop; closing the generator stops early.
        `timings=False` skips the device syncs that make per-step timings exact on a GPU (the budget
        tuner needs them, so --v-max auto keeps them).
        `reuse_prefix=True` (chat turns): start from what the previous generation left in the caches,
        truncated to the longest prefix it shares with this prompt, so only the new tokens are prefilled;
        and keep this generation's caches for the next one. The output is the same as a fresh prefill's
        (K/V rows and drafter context rows depend only on the tokens before them)."""
        cfg = cfg if cfg is not None else self.cfg
        target = self.target_for(cfg)
        drafter = self.pair.drafter_for(cfg.strategy)
        # Rule: every generation consumes what the last one kept; only a reuse_prefix one that ends at a
        # block boundary (finished, or closed between blocks) keeps its own.
        previous, self._kept = self._kept, None
        if previous is not None and previous.target is not target:
            previous.target.reset()                 # another execution path: free the old rows
            previous = None
        self._started += 1
        serial = self._started
        state = CachedPrefix(target, drafter)
        keep = False
        try:
            yield from self._decode(prompt_ids, cfg, target, drafter, timings,
                                    previous if reuse_prefix else None, state)
            keep = reuse_prefix
        except GeneratorExit:                       # closed at a yield: the caches hold whole blocks
            keep = reuse_prefix
            raise
        finally:
            # Rule: a generation left open while a newer one ran (closed later, or by the garbage collector)
            # no longer owns the caches: it must neither keep nor reset them.
            if serial == self._started:
                if keep:
                    self._kept = state
                else:
                    target.reset()      # free the KV cache once the generation ends or is abandoned

    def forget_prefix(self) -> None:
        """Drop the cached prefix (the next reuse_prefix generation prefills everything)."""
        if self._kept is not None:
            self._kept.target.reset()
            self._kept = None

    @staticmethod
    def _reusable(previous: CachedPrefix | None, state: CachedPrefix, context: list[int], capacity: int) -> int:
        """Prompt tokens (of `context`, the prompt but its last token) whose cached rows `previous` can give.
        Rule: the same target cache and drafter object, the longest prefix shared with both of their token
        lists, and (compiled static shapes cannot grow) room for the whole generation."""
        if previous is None or previous.target is not state.target or previous.drafter is not state.drafter:
            return 0
        if state.target.static_shapes and state.target.capacity < capacity:
            return 0
        n = common_prefix(previous.target_ids, context)
        if state.drafter is not None:
            n = min(n, common_prefix(previous.drafter_ids, context))
        return n

    def _decode(self, prompt_ids: Sequence[int], cfg: DecodeConfig, target: CachedLM, drafter: Drafter | None,
                timings: bool, previous: CachedPrefix | None, state: CachedPrefix) -> Iterator[Block]:
        prompt = [int(t) for t in prompt_ids]
        limit = self.pair.context_limit
        if not prompt:
            raise GenerationError("the prompt is empty")
        if len(prompt) >= limit:
            raise GenerationError(f"the prompt is {len(prompt)} tokens; the model's context holds {limit} "
                                  f"(no room to generate)")
        gen = torch.Generator().manual_seed(cfg.seed)
        eos = set(self.pair.eos_ids) if cfg.stop_at_eos else set()
        tuner = self.tuner_for(cfg)
        price = self.fixed_price_for(cfg) if drafter is not None else None
        lookup = self._lookups.setdefault(self.tuner_key(cfg), LookupStats()) if uses_lookup(cfg) else None
        extends = tuner is not None and drafter is not None and admits(cfg)     # nodes past the budget
        floored = tuner is not None and drafter is not None and floors(cfg, drafter)   # alternatives that pay
        calibration = (self._calibrations.setdefault(self.tuner_key(cfg), NodeCalibration())
                       if drafter is not None and calibrates(cfg) else None)
        sequential = getattr(drafter, "sequential", False)
        now = _clock(target.device, sync=timings or tuner is not None or price is not None)

        # Step 0. Prefill: every prompt token but the last; the last becomes the first root. With a cached
        # prefix, the caches are truncated to the shared prefix and only the rest is prefilled.
        t0 = now()
        context = prompt[:-1]
        # A static cache holds the whole generation plus one tree of scratch rows (padded for static shapes).
        capacity = min(len(prompt) + cfg.max_new_tokens, limit) + padded_size(cfg.v_max + 1) + 2
        reused = self._reusable(previous, state, context, capacity)
        if drafter is not None and hasattr(drafter, "compile_for"):
            # Rule: a compiled generation runs the drafter's block passes over static shapes too, compiled, sized
            # for the same generation (DFlashDrafter.compile_for); any other generation runs plain passes.
            drafter.compile_for(capacity if cfg.compile else None)
        if reused:
            target.truncate(reused)
            if drafter is not None:
                drafter.truncate(reused)
        else:
            target.reset(capacity=capacity)
        pre = target.prefill(context[reused:])
        if drafter is not None:
            hidden = pre.hidden if pre is not None else None
            if reused:
                drafter.advance(context[reused:], hidden)
            else:
                drafter.reset(context, hidden)
            # Rule: the drafter takes in the prompt here, inside the prefill step and its time (time to first
            # token, as the target's prompt pass), not in the first block's drafting; a first block that
            # drafted the whole prompt cost 3-4 blocks' drafting and, counted as decode, was a generation's
            # cost that no block causes. Skipped where the tuner's last budget was 0: it may not draft at all.
            if tuner is None or tuner.last_choice > 0:
                drafter.prefill()
        state.target_ids = list(context)
        state.drafter_ids = list(context)
        state.reused = reused
        root = prompt[-1]
        ngrams = NgramIndex(cfg.lookup_ngram, context) if lookup is not None else None   # = state.target_ids
        prefill_ms = (now() - t0) * 1e3
        new = 0
        index = 0
        while True:
            ctx = target.committed
            # Rule: emitted tokens (accepted + bonus) must fit both max_new_tokens and the context.
            room = min(cfg.depth, limit - ctx - 2, cfg.max_new_tokens - new - 1)
            budget = tuner.choose() if tuner is not None else cfg.v_max
            # nodes past the budget where they pay (BudgetTuner.admission)
            admit = tuner.admission(budget) if extends else ()
            steps = drafted_steps(cfg, budget) if tuner is not None else cfg.depth
            clipped = room < steps                        # the generation's end, not the budget, bounds this block
            block_cfg = cfg
            if tuner is not None:
                # budget 0: no draft this block, the target steps alone. A tree that admits nodes past its budget
                # over a block-parallel drafter is drafted whole: the nodes it admits are mostly deeper.
                room = min(room, cfg.depth if admit and not sequential else steps)
                if 0 < steps < cfg.depth:                 # a shorter block, K = steps + 1 (repairs if budget > steps)
                    block_cfg = cfg.with_(k=steps + 1, v_max=budget)
                elif steps:
                    block_cfg = cfg.with_(v_max=budget)

            # Step 1. Draft a block.
            t_draft = now()
            draft_stop = tuner.draft_stop(budget) if tuner is not None and stops_drafting(cfg, drafter) else None
            proposal = (propose(block_cfg, drafter, root, room, draft_stop)
                        if drafter is not None and room > 0 else None)

            # Steps 2-5. UFPs, branch budget, repair branches (re-drafted inside), trie under V_max.
            t_tree = now()
            graft = None
            if ngrams is not None:
                ngrams.extend([root])                      # the root is committed below, whatever is accepted
            if lookup is not None and proposal is not None:
                tokens = ngrams.continuation(min(cfg.lookup, len(proposal.tokens)))   # over target_ids + [root]
                graft = Graft(tokens, lookup.path_logp(len(tokens))) if tokens else None
            # the re-draft pass runs where it pays (redraft_price.py): at the tuner's predicted rate for the
            # budget, or at a fixed budget the rate its recent blocks measured
            if price is not None:
                redraft = price.pays(budget, price.measured_rate)
            elif tuner is not None and budget > 0 and prices_redraft_pass(cfg, drafter):
                redraft = tuner.redraft_pays(budget)
            else:
                redraft = True
            # the lookup graft goes in while it wins acceptance at this budget (calibration.FlipGains); at T=0
            # the tree with it flipped is built too (FlipGains.measures: every block, then every few), to measure it
            graft_on = lookup is None or lookup.flips.allows(budget)
            # best-first cure scores a lower candidate's log-prob at the weight its acceptance earned, at budgets
            # where that wins (calibration.py); at T=0 the tree with the other weight is measured the same way
            fitted = calibration.weight() if calibration is not None else 1.0
            weighs = fitted != 1.0 and calibration.flips.allows(budget)
            greedy = cfg.temperature == 0
            # nodes off the drafted chain join where they pay for their row (BudgetTuner.alt_floor)
            floor = tuner.alt_floor(budget) if floored else -math.inf
            plan = build_tree(block_cfg, proposal, drafter, graft, redraft, graft_on,
                              flip=graft is not None and greedy and lookup.flips.measures(budget), admit=admit,
                              weight=fitted if weighs else 1.0,
                              floor=floor,
                              weight_alt=(1.0 if weighs else fitted)
                              if fitted != 1.0 and greedy and calibration.flips.measures(budget) else None)
            tree = plan.tree
            t_tree_end = now()

            # Step 6. Verify: one target forward over [root, nodes]; node i is scratch row i + 1.
            fwd = target.forward([root] + tree.tokens, [-1] + [p + 1 for p in tree.parents])
            if cfg.temperature == 0:
                pred = fwd.logits.argmax(-1).tolist()              # [N+1] on the host: the verify's one read
                path = greedy_accept(tree, pred)
                bonus = pred[path[-1] + 1 if path else 0]
            else:
                path, bonus = sample_accept(tree, fwd.logits, cfg.temperature, gen)
            t_verify = now()

            # Step 7. Commit: keep exactly root + accepted nodes in the target cache; resync the drafter.
            target.commit([0] + [i + 1 for i in path])
            state.target_ids += [root] + [tree.tokens[i] for i in path]
            if ngrams is not None:
                ngrams.extend([tree.tokens[i] for i in path])
            branch0 = _branch0_chain(tree)
            a0 = common_prefix(path, branch0)
            resync_nodes = path if cfg.resync else [branch0[d] if d < len(branch0) else path[d]
                                                    for d in range(len(path))]
            resync_tokens = [tree.tokens[i] for i in resync_nodes]
            if drafter is not None:
                hidden = fwd.hidden[[0] + [i + 1 for i in resync_nodes]] if fwd.hidden is not None else None
                drafter.advance([root] + resync_tokens, hidden)
                state.drafter_ids += [root] + resync_tokens
            # the target's path from the root: accepted tokens + bonus (at T=0 its greedy continuation, which
            # any other tree for this block would have accepted as far as it holds it)
            walked = [tree.tokens[i] for i in path] + [bonus]
            emitted, stop = _cut(walked, cfg.max_new_tokens - new, len(prompt) + new, limit, eos)
            accepted = set(path)
            # what best-first cure learns from the block (its node weight, its lookup graft) is its own
            # host work: it is timed in the commit phase, which ends here
            if calibration is not None and cfg.temperature == 0 and plan.ranks:
                calibration.observe(plan.ranks, plan.logq, tree.parents, accepted)
                if plan.weight_alt is not None:          # what the fitted weight won or lost this block
                    calibration.flips.observe(budget, weighs, len(path), len(path_nodes(plan.weight_alt, walked)))
            if lookup is not None and plan.lookup_nodes:
                lookup.observe(plan.lookup_nodes, accepted)
            if plan.lookup_alt is not None:                # T=0: what the graft won or lost this block
                lookup.flips.observe(budget, plan.grafted, len(path), len(path_nodes(plan.lookup_alt, walked)))
            t_commit = now()
            nodes = tuple(TreeNode(token=tree.tokens[i], parent=tree.parents[i], depth=tree.depths[i],
                                   branch=tree.branches[i], accepted=i in accepted) for i in range(len(tree)))
            winner = tree.branches[path[-1]] if path else 0
            block = Block(
                index=index, strategy=cfg.strategy, context_len=ctx, root=root,
                draft=tuple(proposal.tokens) if proposal is not None else (),
                margins=proposal.margins if proposal is not None else (),
                ufps=plan.ufps, nodes=nodes, accepted=tuple(path), winner=winner,
                branch0_accepted=a0, bonus=bonus, emitted=tuple(emitted),
                resync=Resync(mode=("winner" if cfg.resync else "branch0") if drafter is not None else "none",
                              tokens=tuple(resync_tokens)),
                timings=Timings(prefill_ms=prefill_ms if index == 0 else 0.0,
                                prefill_tokens=len(context) - reused if index == 0 else 0,
                                reused_tokens=reused if index == 0 else 0,
                                # re-drafting repair suffixes is drafter compute: it counts as draft time
                                draft_ms=(t_tree - t_draft) * 1e3 + plan.redraft_ms,
                                tree_ms=(t_tree_end - t_tree) * 1e3 - plan.redraft_ms,
                                verify_ms=(t_verify - t_tree_end) * 1e3, commit_ms=(t_commit - t_verify) * 1e3),
                stop=stop, meta=self._budget_meta(tuner, budget, cfg, draft_stop, redraft,
                                                  graft is not None and not graft_on, len(tree) - budget, floor))
            if plan.unrepaired is not None and cfg.temperature == 0 and (tuner is not None or price is not None):
                # what the re-draft pass won: the target's greedy path (accepted + bonus) walked down the
                # tree before the pass holds `held` of its tokens, and that tree would have accepted them
                held = len(path_nodes(plan.unrepaired, walked))
                (tuner.observe_redraft if tuner is not None else price.observe)(budget, len(path) - held,
                                                                                 plan.redraft_ms)
            if price is not None:
                price.observe_block(len(path) + 1, (t_commit - t_draft) * 1e3)
            if tuner is not None:
                # under a draft stop the tuner learns how the chain's draft log-probs predict acceptance (of
                # the chain's depths the tree holds: those the target could accept)
                # (and where the tree could admit nodes past its budget: `calibration` prices them)
                chain_logp = (proposal.top_logprobs[: len(branch0), 0].tolist()
                              if (draft_stop is not None or admit or floored) and proposal is not None else None)
                tuner.observe(block, budget, clipped, chain_logp)
            yield block
            new += len(emitted)
            index += 1
            if stop is not None:
                return
            root = bonus

    @staticmethod
    def _budget_meta(tuner: BudgetTuner | None, budget: int, cfg: DecodeConfig, draft_stop: float | None = None,
                     redraft: bool = True, withheld: bool = False, past: int = 0,
                     floor: float = -math.inf) -> dict:
        meta = {} if tuner is None else {"v_max": budget, "predicted_speedup": tuner.last_prediction,
                                         "tuning": tuner.last_phase}
        if withheld:
            meta["lookup"] = "withheld"                  # LookupStats.flips: the graft lost acceptance here
        if tuner is None:
            if not redraft:
                meta["redraft"] = "skipped"              # a fixed budget's RedraftPrice: it would not pay
            return meta
        if not redraft:
            meta["redraft"] = "skipped"                  # BudgetTuner.redraft_pays: the pass would not pay
        if draft_stop is not None:
            meta["draft_stop"] = round(math.exp(draft_stop), 4)   # the chain probability it drafted down to
        if floor > -math.inf:
            meta["alt_floor"] = round(math.exp(floor), 4)        # the joint draft probability an alternative needed
        if past > 0:
            meta["admitted"] = past                      # nodes past the budget (BudgetTuner.admission)
        if budget == 0:
            # What budget 0 was chosen over (Block.no_draft_reason), with the fixed settings that force it:
            # a budget below K-1 is a shorter block (K = budget + 1), as the tuner runs it.
            best = tuner.best_tree()
            meta["best_tree"] = None if best is None else {
                "v_max": best[0], "k": best[0] + 1 if best[0] < cfg.depth else None,     # None: the K set
                "predicted_speedup": round(best[1], 4)}
        return meta



def _cut(emitted: list[int], room: int, length: int, limit: int, eos: set[int]):
    """Cut a block's emission at the first stop: eos (kept), max_new_tokens (`room` tokens left), the
    context end (`length` tokens so far, prompt included)."""
    for j, tok in enumerate(emitted):
        if tok in eos:
            return emitted[: j + 1], "eos"
    if len(emitted) >= room:
        return emitted[:room], "max_new_tokens"
    if length + len(emitted) >= limit:
        return emitted[: limit - length], "context"
    return emitted, None


def _clock(device: torch.device, sync: bool):
    """perf_counter, after a device sync when exact timings are wanted on a GPU."""
    if sync and device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return now
    return time.perf_counter


def _branch0_chain(tree: DraftTree) -> list[int]:
    """Branch-0 nodes, shallow to deep (they form one chain from depth 1)."""
    return sorted((i for i, b in enumerate(tree.branches) if b == 0), key=lambda i: tree.depths[i])


def generate_ids(pair: ModelPair, cfg: DecodeConfig, prompt_ids: Sequence[int]) -> list[int]:
    """Convenience: the new token ids of one generation."""
    out: list[int] = []
    for block in Engine(pair).generate(prompt_ids, cfg):
        out.extend(block.emitted)
    return out
