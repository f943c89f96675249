"""The decoding loop: one generator for every strategy, one Block per target forward.

Each iteration reads as the named steps of DESIGN.md:
    plan (the policy: budget, draft, tree) -> verify (one target pass) -> commit -> learn (the policy)
The root of every tree is the last emitted token, not yet in the target's KV cache; the target's
forward over [root, tree nodes] both verifies the tree and produces the next root (the bonus).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Iterator, Sequence

import torch

from .block import Block, Resync, Timings, TreeNode
from .budget import SIZES, BudgetTuner, measure_cost_curve
from .config import ConfigError, DecodeConfig
from .drafters.base import Drafter
from .errors import CureError
from .lm import CachedLM, padded_size
from .metrics import common_prefix
from .policies import Policy, make_policy
from .strategies import CHAIN_STRATEGIES, drafted_steps
from .tree import DraftTree, argmax, greedy_accept, sample_accept


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
    the tree policy of each policy key, with its learners (chat turns and bench prompts share it), the
    target's KV buffers of each execution layout and, when asked, the last generation's cached prefix (chat).
    `cfg` given here is the default for `generate`."""

    def __init__(self, pair: ModelPair, cfg: DecodeConfig | None = None):
        self.pair = pair
        self.cfg = cfg if cfg is not None else DecodeConfig()
        if cfg is not None:
            pair.drafter_for(cfg.strategy)                    # fail early: the strategy needs its drafter
        self._targets: dict[tuple, CachedLM] = {}             # (hidden layers, kv layout, compile) -> cache
        self._policies: dict[DecodeConfig, Policy] = {}       # policy_key(cfg) -> its policy
        self._kept: CachedPrefix | None = None                # the last generation's caches (reuse_prefix)
        self._started = 0                                     # generations started: the newest owns the caches

    # Rule: a policy learns acceptance and costs for one tree rule on one execution path; the length, seed
    # and temperature of a generation do not change either, so they share it.
    @staticmethod
    def policy_key(cfg: DecodeConfig) -> DecodeConfig:
        return cfg.with_(max_new_tokens=1, seed=0, temperature=0.0, stop_at_eos=True)

    def policy_for(self, cfg: DecodeConfig) -> Policy:
        """The tree policy `cfg` decodes with, kept across generations."""
        key = self.policy_key(cfg)
        if key not in self._policies:
            drafter = self.pair.drafter_for(cfg.strategy)
            tuner = self._make_tuner(key) if cfg.auto_budget and drafter is not None else None
            self._policies[key] = make_policy(key, drafter, tuner)
        return self._policies[key]

    @property
    def tuner(self) -> BudgetTuner | None:
        """The default config's budget tuner, once a generation has made it."""
        policy = self._policies.get(self.policy_key(self.cfg))
        return policy.tuner if policy is not None else None

    def tuner_for(self, cfg: DecodeConfig) -> BudgetTuner | None:
        """The budget tuner `cfg` decodes with (kept across generations); None without `v_max` auto."""
        return self.policy_for(cfg).tuner

    def target_for(self, cfg: DecodeConfig) -> CachedLM:
        drafter = self.pair.drafter_for(cfg.strategy)
        layers = drafter.target_layers if drafter is not None else ()
        run = cfg.execution
        key = (tuple(layers), run.kv_cache, run.compile)
        if key not in self._targets:
            self._targets[key] = CachedLM(self.pair.target, hidden_layers=layers, kv=run.kv_cache, compile=run.compile)
        return self._targets[key]

    def _make_tuner(self, cfg: DecodeConfig) -> BudgetTuner:
        curve = measure_cost_curve(self.pair.target, max_size=cfg.v_max, kv=cfg.execution.kv_cache,
                                   compile=cfg.execution.compile)
        # Budget 0 skips drafting (a plain ar step: where verifying even 2 tokens costs more than the
        # drafts win back, e.g. a CPU); budgets up to K-1 shorten the block itself (branch 0 stays whole,
        # just shorter: a smaller K); larger ones leave room for repair branches (tree strategies only).
        shorter = [s for s in SIZES if 0 <= s < cfg.depth] + [cfg.depth]
        wider = [] if cfg.strategy in CHAIN_STRATEGIES else [s for s in SIZES if cfg.depth < s < cfg.v_max] + [cfg.v_max]
        # A sequential (AR) drafter takes one step per drafted position (strategies.drafted_steps), so its
        # tuner prices drafting per step.
        steps = (lambda v: drafted_steps(cfg, v)) if self.pair.drafter_for(cfg.strategy).sequential else None
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

    def _checked(self, prompt_ids: Sequence[int]) -> list[int]:
        prompt = [int(t) for t in prompt_ids]
        limit = self.pair.context_limit
        if not prompt:
            raise GenerationError("the prompt is empty")
        if len(prompt) >= limit:
            raise GenerationError(f"the prompt is {len(prompt)} tokens; the model's context holds {limit} "
                                  f"(no room to generate)")
        return prompt

    def _prefill(self, prompt: list[int], cfg: DecodeConfig, target: CachedLM, drafter: Drafter | None,
                 policy: Policy, previous: CachedPrefix | None, state: CachedPrefix) -> int:
        """Step 0: the target and the drafter take in every prompt token but the last. With a cached prefix,
        the caches are truncated to the shared prefix and only the rest is prefilled. Returns the prompt
        tokens reused."""
        context = prompt[:-1]
        # A static cache holds the whole generation plus one tree of scratch rows (padded for static shapes).
        capacity = min(len(prompt) + cfg.max_new_tokens, self.pair.context_limit) + padded_size(cfg.v_max + 1) + 2
        reused = self._reusable(previous, state, context, capacity)
        if drafter is not None:
            # Rule: a compiled generation runs the drafter's passes over static shapes too, compiled, sized for
            # the same generation (DFlashDrafter.compile_for); any other generation runs plain passes.
            drafter.compile_for(capacity if cfg.execution.compile else None)
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
        # Rule: the drafter takes in the prompt here, inside the prefill step and its time (time to first token,
        # as the target's prompt pass), not in the first block's drafting (Policy.start says whether it drafts).
        if policy.start(context, cfg):
            drafter.prefill()
        state.target_ids = list(context)
        state.drafter_ids = list(context)
        state.reused = reused
        return reused

    def _decode(self, prompt_ids: Sequence[int], cfg: DecodeConfig, target: CachedLM, drafter: Drafter | None,
                timings: bool, previous: CachedPrefix | None, state: CachedPrefix) -> Iterator[Block]:
        prompt = self._checked(prompt_ids)
        limit = self.pair.context_limit
        gen = torch.Generator().manual_seed(cfg.seed)
        eos = set(self.pair.eos_ids) if cfg.stop_at_eos else set()
        policy = self.policy_for(cfg)
        now = _clock(target.device, sync=timings or policy.timed)

        # 0. Prefill: every prompt token but the last; the last becomes the first root.
        t0 = now()
        context = prompt[:-1]
        reused = self._prefill(prompt, cfg, target, drafter, policy, previous, state)
        root = prompt[-1]
        prefill_ms = (now() - t0) * 1e3
        new = 0
        index = 0
        while True:
            ctx = target.committed
            # Rule: emitted tokens (accepted + bonus) must fit both max_new_tokens and the context.
            room = min(cfg.depth, limit - ctx - 2, cfg.max_new_tokens - new - 1)

            # 1. Plan: the budget, the drafted block, the tree (the policy's rule).
            plan = policy.plan(root, room, now)
            tree = plan.tree
            t_plan = now()

            # 2. Verify: one target forward over [root, nodes]; node i is scratch row i + 1.
            fwd = target.forward([root] + tree.tokens, [-1] + [p + 1 for p in tree.parents])
            if cfg.temperature == 0:
                pred = argmax(fwd.logits).tolist()              # [N+1] on the host: the verify's one read
                path = greedy_accept(tree, pred)
                bonus = pred[path[-1] + 1 if path else 0]
            else:
                path, bonus = sample_accept(tree, fwd.logits, cfg.temperature, gen)
            t_verify = now()

            # 3. Commit: keep exactly root + accepted nodes in the target cache; resync the drafter.
            target.commit([0] + [i + 1 for i in path])
            state.target_ids += [root] + [tree.tokens[i] for i in path]
            branch0 = _branch0_chain(tree)
            resync_nodes = path if cfg.ablations.resync else [branch0[d] if d < len(branch0) else path[d]
                                                    for d in range(len(path))]
            resync_tokens = [tree.tokens[i] for i in resync_nodes]
            if drafter is not None:
                hidden = fwd.hidden[[0] + [i + 1 for i in resync_nodes]] if fwd.hidden is not None else None
                drafter.advance([root] + resync_tokens, hidden)
                state.drafter_ids += [root] + resync_tokens
            # the target's path from the root: accepted tokens + bonus
            emitted, stop = _cut([tree.tokens[i] for i in path] + [bonus], cfg.max_new_tokens - new,
                                 len(prompt) + new, limit, eos)
            t_commit = now()
            accepted = set(path)
            proposal = plan.proposal
            block = Block(
                index=index, strategy=cfg.strategy, context_len=ctx, root=root,
                draft=tuple(proposal.tokens) if proposal is not None else (),
                margins=proposal.margins if proposal is not None else (),
                ufps=plan.ufps, nodes=tuple(TreeNode(token=tree.tokens[i], parent=tree.parents[i],
                                                     depth=tree.depths[i], branch=tree.branches[i],
                                                     accepted=i in accepted) for i in range(len(tree))),
                accepted=tuple(path), winner=tree.branches[path[-1]] if path else 0,
                branch0_accepted=common_prefix(path, branch0), bonus=bonus, emitted=tuple(emitted),
                resync=Resync(mode=("winner" if cfg.ablations.resync else "branch0") if drafter is not None else "none",
                              tokens=tuple(resync_tokens)),
                timings=Timings(prefill_ms=prefill_ms if index == 0 else 0.0,
                                prefill_tokens=len(context) - reused if index == 0 else 0,
                                reused_tokens=reused if index == 0 else 0,
                                draft_ms=plan.draft_ms, tree_ms=plan.tree_ms,
                                verify_ms=(t_verify - t_plan) * 1e3, commit_ms=(t_commit - t_verify) * 1e3),
                stop=stop, meta=plan.meta)

            # 4. Learn: what the verified block teaches the policy (budget, acceptance, re-draft price). Its
            # time is the block's too: the next block cannot start before it.
            block.meta.update(policy.learn(plan, block))
            block = replace(block, timings=replace(block.timings, learn_ms=(now() - t_commit) * 1e3))
            yield block
            new += len(emitted)
            index += 1
            if stop is not None:
                return
            root = bonus


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
