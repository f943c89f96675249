"""Tree policies: one object per strategy that plans each block's tree and learns from what the target did.

As transformers' candidate generators do (one object proposes, one hook learns), a policy has
    plan(root, room, now) -> TreePlan     draft the block and build its tree (the budget, the tree rule)
    learn(plan, block)    -> meta         what the verified block teaches the policy's learners
and owns its learners; the engine keeps one policy per policy key (Engine.policy_key) across generations.

  policy          strategies       tree rule (strategies.py)          learners
  Ar              ar               none: the target steps alone        -
  Chain           sd, parallel     chain_tree: branch 0 only           budget tuner (--v-max auto)
  DDTree          ddtree           build_ddtree: the reference         budget tuner
  PaperCure       cure --cure-tree paper   build_paper_tree            budget tuner
  BestFirstCure   cure (default)   build_cure_best_first               budget tuner, acceptance model,
                                                                       re-draft price, lookup statistics
The budget tuner (budget.py) is the one learner every drafting policy shares: under --v-max auto it picks
each block's node budget from the measured cost curve and the acceptance it has seen (budget 0: no draft).
"""
from __future__ import annotations

import math
from typing import Callable

from .acceptance import AcceptanceModel
from .block import Block
from .budget import BudgetTuner
from .config import DecodeConfig
from .drafters.base import Drafter, Proposal
from .lookup import Graft, LookupStats, NgramIndex
from .metrics import common_prefix
from .redraft_price import RedraftPrice
from .strategies import (TreePlan, build_cure_best_first, build_ddtree, build_paper_tree, chain_tree,
                         drafted_steps, path_nodes, redraft_policy)
from .tree import DraftTree

LOOKUP_NGRAM = 2          # the longest trailing n-gram the prompt lookup matches (then shorter ones)

Clock = Callable[[], float]


class Policy:
    """ar: no drafter and no tree; every block is one target step."""
    tuner: BudgetTuner | None = None

    def __init__(self, cfg: DecodeConfig, drafter: Drafter | None = None, tuner: BudgetTuner | None = None):
        self.cfg, self.drafter, self.tuner = cfg, drafter, tuner
        self.greedy = True

    @property
    def timed(self) -> bool:
        """Whether the policy learns from the blocks' timings (then a GPU's clock syncs)."""
        return self.tuner is not None

    def start(self, context: list[int], cfg: DecodeConfig) -> bool:
        """A generation starts over `context` (the prompt but its last token). Returns whether the drafter
        takes in the prompt now (its prefill)."""
        self.greedy = cfg.temperature == 0
        return False

    def plan(self, root: int, room: int, now: Clock) -> TreePlan:
        return TreePlan(DraftTree())

    def learn(self, plan: TreePlan, block: Block) -> dict:
        return {}


class Chain(Policy):
    """sd / parallel: the drafted block as one path. The base of every drafting policy: the budget (the tuner's
    choice or v_max), the draft, the timing of both, and what the tuner learns."""

    def start(self, context: list[int], cfg: DecodeConfig) -> bool:
        super().start(context, cfg)
        # the drafter takes in the prompt in the prefill step, unless the tuner's last budget was 0 (no draft)
        return self.tuner is None or self.tuner.last_choice > 0

    def plan(self, root: int, room: int, now: Clock) -> TreePlan:
        cfg, tuner = self.cfg, self.tuner
        budget = tuner.choose() if tuner is not None else cfg.v_max
        steps = drafted_steps(cfg, budget) if tuner is not None else cfg.depth
        clipped = room < steps                   # the generation's end, not the budget, bounds this block
        n = min(room, steps)                     # budget 0: no draft, the target steps alone
        t_draft = now()
        proposal = self.propose(root, n, budget) if n > 0 else None
        t_tree = now()
        plan = self.build(proposal, budget, root) if proposal is not None else TreePlan(DraftTree())
        t_end = now()
        plan.proposal, plan.budget, plan.clipped = proposal, budget, clipped
        # re-drafting repair suffixes is drafter compute: it counts as draft time
        plan.draft_ms = (t_tree - t_draft) * 1e3 + plan.redraft_ms
        plan.tree_ms = (t_end - t_tree) * 1e3 - plan.redraft_ms
        plan.meta.update(self._tuner_meta(budget))
        return plan

    def propose(self, root: int, n: int, budget: int) -> Proposal:
        return self.drafter.propose(root, n, self.cfg.paper.top_k)

    def build(self, proposal: Proposal, budget: int, root: int) -> TreePlan:
        return TreePlan(chain_tree(proposal))

    def chain_logp(self, plan: TreePlan) -> list[float] | None:
        """What the tuner's chain calibration learns from (BestFirstCure: under a draft stop or a floor)."""
        return None

    def learn(self, plan: TreePlan, block: Block) -> dict:
        if self.tuner is not None:
            self.tuner.observe(block, plan.budget, plan.clipped, self.chain_logp(plan))
        return {}

    def _tuner_meta(self, budget: int) -> dict:
        tuner = self.tuner
        if tuner is None:
            return {}
        meta = {"v_max": budget, "predicted_speedup": tuner.last_prediction, "tuning": tuner.last_phase}
        if budget == 0:
            # What budget 0 was chosen over (Block.no_draft_reason), with the fixed settings that force it:
            # a budget below K-1 is a shorter block (K = budget + 1), as the tuner runs it.
            best = tuner.best_tree()
            meta["best_tree"] = None if best is None else {
                "v_max": best[0], "k": best[0] + 1 if best[0] < self.cfg.depth else None,   # None: the K set
                "predicted_speedup": round(best[1], 4)}
        return meta


class DDTree(Chain):
    """The reference rule alone: best-first by joint draft log-prob over the per-position top-k."""

    def propose(self, root: int, n: int, budget: int) -> Proposal:
        return self.drafter.propose(root, n, max(self.cfg.paper.top_k, budget))

    def build(self, proposal: Proposal, budget: int, root: int) -> TreePlan:
        return TreePlan(build_ddtree(proposal, budget))


class PaperCure(Chain):
    """The paper's tree: branch 0 plus repair branches at the UFPs."""

    def build(self, proposal: Proposal, budget: int, root: int) -> TreePlan:
        return build_paper_tree(proposal, self.drafter, self.cfg, budget)


class BestFirstCure(Chain):
    """cure's default tree: best-first over what the target accepts (the acceptance model), the best
    substitutions' subtrees re-drafted where the pass pays, and the prompt-lookup continuation in the heap."""

    def __init__(self, cfg: DecodeConfig, drafter: Drafter, tuner: BudgetTuner | None = None):
        super().__init__(cfg, drafter, tuner)
        self.redrafts = redraft_policy(cfg, drafter)
        self.acceptance = AcceptanceModel() if cfg.best_first.acceptance else None
        self.lookup = LookupStats() if cfg.best_first.lookup > 0 else None
        # Rule: over a block-parallel drafter the re-draft pass is one more drafter forward, run only where it
        # pays (redraft_price.py): the tuner prices it under --v-max auto, this at a fixed budget. A chain
        # drafter re-drafts inside its own steps: no pass.
        self.prices_pass = not drafter.redrafts_while_drafting
        self.price = RedraftPrice() if self.prices_pass and tuner is None else None
        # Rule: over a sequential drafter, the chain stops where it gets too unlikely to pay for its next step
        # (BudgetTuner.draft_stop), and a node off the chain joins only where it pays for its row
        # (BudgetTuner.alt_floor); both price with the tuner's rate.
        self.stops = cfg.best_first.draft_stop and drafter.sequential and tuner is not None
        self.floored = self.stops and cfg.best_first.alt_floor
        self.ngrams: NgramIndex | None = None
        self._stop: float | None = None       # this block's draft stop (a joint draft log-prob), if any

    @property
    def timed(self) -> bool:
        return self.tuner is not None or self.price is not None

    def start(self, context: list[int], cfg: DecodeConfig) -> bool:
        self.ngrams = NgramIndex(LOOKUP_NGRAM, context) if self.lookup is not None else None
        return super().start(context, cfg)

    def plan(self, root: int, room: int, now: Clock) -> TreePlan:
        if self.ngrams is not None:
            self.ngrams.extend([root])          # the root is committed, whatever is accepted
        return super().plan(root, room, now)

    def propose(self, root: int, n: int, budget: int) -> Proposal:
        width = max(self.cfg.paper.top_k, budget)     # a node may get as many children as the budget holds
        self._stop = self.tuner.draft_stop(budget) if self.stops else None
        if self._stop is not None:              # a stopped chain leaves the budget room for its re-drafts
            return self.drafter.propose_with_redrafts(root, n, width, self.redrafts.count, self._stop)
        count = self.fused(n, budget)
        return self.drafter.propose_with_redrafts(root, n, width, count) if count else self.drafter.propose(root, n, width)

    def fused(self, n: int, budget: int) -> int:
        """Substitutions the drafter re-drafts inside its proposal. Rule: only a chain drafter that can batch
        them into its own steps, and only where the budget leaves room past the n drafted nodes."""
        return self.redrafts.count if self.drafter.redrafts_while_drafting and budget > n else 0

    def build(self, proposal: Proposal, budget: int, root: int) -> TreePlan:
        n, tuner = len(proposal.tokens), self.tuner
        graft = None
        if self.ngrams is not None:
            tokens = self.ngrams.continuation(min(self.cfg.best_first.lookup, n))
            agree = common_prefix(tokens, proposal.tokens)
            graft = Graft(tokens, self.lookup.path_logp(len(tokens), agree)) if tokens else None
        if self.price is not None:
            redraft = self.price.pays(budget, self.price.measured_rate)
        elif tuner is not None and self.prices_pass:
            redraft = tuner.redraft_pays(budget)
        else:
            redraft = True
        floor = tuner.alt_floor(budget) if self.floored else -math.inf
        plan = build_cure_best_first(
            proposal, self.drafter, budget, self.redrafts,
            fused=self.redrafts.count if proposal.redrafts else self.fused(n, budget), redraft=redraft,
            graft=graft, score=self.acceptance.logp if self.acceptance is not None else None, floor=floor)
        if not redraft:
            plan.meta["redraft"] = "skipped"                 # the pass would not pay (redraft_price.py)
        if self._stop is not None:
            plan.meta["draft_stop"] = round(math.exp(self._stop), 4)   # the chain probability it drafted down to
        if floor > -math.inf:
            plan.meta["alt_floor"] = round(math.exp(floor), 4)        # the joint draft probability an alternative needed
        return plan

    def chain_logp(self, plan: TreePlan) -> list[float] | None:
        if plan.proposal is None or not (self.stops or self.floored):
            return None
        depth = sum(1 for b in plan.tree.branches if b == 0)
        return plan.proposal.top_logprobs[:depth, 0].tolist()

    def learn(self, plan: TreePlan, block: Block) -> dict:
        tree, accepted = plan.tree, set(block.accepted)
        if self.ngrams is not None:
            self.ngrams.extend([tree.tokens[i] for i in block.accepted])
        if self.greedy and self.acceptance is not None and plan.ranks:
            self.acceptance.observe(plan.ranks, plan.logq, tree.parents, tree.depths, accepted)
        if self.lookup is not None and plan.lookup_nodes:
            held = [tree.tokens[i] for i in plan.lookup_nodes]
            self.lookup.observe(plan.lookup_nodes, accepted, common_prefix(held, plan.proposal.tokens))
        if plan.unrepaired is not None and self.greedy and (self.tuner is not None or self.price is not None):
            # what the re-draft pass won: the target's greedy path (accepted + bonus) walked down the tree
            # before the pass holds `held` of its tokens, and that tree would have accepted them
            walked = [tree.tokens[i] for i in block.accepted] + [block.bonus]
            held = len(path_nodes(plan.unrepaired, walked))
            gain = len(block.accepted) - held
            if self.tuner is not None:
                self.tuner.observe_redraft(plan.budget, gain, plan.redraft_ms)
            else:
                self.price.observe(plan.budget, gain, plan.redraft_ms)
        if self.price is not None:
            t = block.timings
            self.price.observe_block(len(block.accepted) + 1, t.draft_ms + t.tree_ms + t.verify_ms + t.commit_ms)
        return super().learn(plan, block)


def make_policy(cfg: DecodeConfig, drafter: Drafter | None, tuner: BudgetTuner | None) -> Policy:
    """The policy a config decodes with."""
    if cfg.strategy == "ar" or drafter is None:
        return Policy(cfg)
    if cfg.strategy == "ddtree":
        return DDTree(cfg, drafter, tuner)
    if cfg.strategy == "cure":
        return (PaperCure if cfg.cure_tree == "paper" else BestFirstCure)(cfg, drafter, tuner)
    return Chain(cfg, drafter, tuner)
