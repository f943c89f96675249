"""The drafter protocol every strategy drafts through.

One block's calls, in order:
  propose(root, n, top_k)   -> the block y_0..y_{n-1} plus per-position top-k log-probs (one pass
                               for a block-parallel drafter, n steps for an autoregressive one)
  redraft_topk(prefixes, lengths, top_k) -> for each substitution (tokens after the root, ending with
                               the substituted token), the next `length` positions re-drafted under it,
                               with per-position top-k, as a Proposal; one batched pass
  redraft(prefixes, lengths) -> the same, the suffix tokens only (the paper's repair branches)
  propose_with_redrafts(root, n, top_k, count, stop_logp=None) -> optional, for causal chain drafters
                               (ArDrafter): the proposal AND the re-drafts under its `count` best chain
                               substitutions (chain_substitutions), drafted in the same sequential steps
                               as the chain (one batched row each), so re-drafting adds no sequential
                               step; in Proposal.redrafts. With stop_logp: no further position once the
                               chain's joint log-prob is below it (fewer than n). Drafters that have it
                               set `redrafts_while_drafting`.
Drafters that take one forward per drafted token set `sequential` (the budget tuner prices their
drafting per step); block-parallel ones draft their block in one pass at any budget.
  compile_for(capacity)     -> optional: before a generation's reset, its static-shape room (`compile`:
                               the engine's compiled generations; None for any other), so a drafter can
                               run its passes over fixed shapes, compiled (DFlashDrafter)
  advance(tokens, hidden)   -> resync: `tokens` (root + accepted path) are now committed; `hidden`
                               holds the target's hidden states at those positions for drafters
                               conditioned on the target (`target_layers` says which layers).
`reset(context, hidden)` starts a generation: `context` is every prompt token but the last, which
becomes the first root. `truncate(n)` instead keeps the first n context tokens of the state a previous
generation left (everything given through reset + advance), so a chat turn that extends the last one
only `advance`s by its new tokens (Engine.generate(..., reuse_prefix=True)).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

import torch


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]            # [n] the drafted block (argmax at each position)
    top_ids: torch.Tensor        # [n, top_k] long, candidates per position, best first (target ids)
    top_logprobs: torch.Tensor   # [n, top_k] float32 draft log-probs of top_ids
    # prefix (tokens after the root, ending with the substitute) -> its re-draft, when the drafter
    # re-drafted while drafting (propose_with_redrafts); empty otherwise
    redrafts: dict = field(default_factory=dict, compare=False)

    @cached_property
    def margins(self) -> tuple[float, ...]:
        """m_i = l_{i,1} - l_{i,2} (read once: the engine's Block and cure's UFPs both ask)."""
        return tuple((self.top_logprobs[:, 0] - self.top_logprobs[:, 1]).tolist())


@dataclass(frozen=True)
class RedraftPolicy:
    """How best-first cure re-drafts with a drafter when the config leaves it to the drafter (`redrafts`,
    `redraft_weight` None), per drafter kind."""
    count: int = 2                # substitutions re-drafted per block
    weight: float = 0.5           # the re-draft's weight in the blend with the proposal (1: the re-draft alone)


# DFlash's re-drafts are out of its training distribution ([anchor, masks] blocks only), so they are blended.
# PARD and adapted drafters take the same.
DEFAULT_REDRAFTS = RedraftPolicy()


def chain_substitutions(top_ids: torch.Tensor, top_logprobs: torch.Tensor, count: int, depth: int) -> list[tuple[int, ...]]:
    """The `count` substitutions a causal chain drafter re-drafts while drafting: chain alternatives
    (rank >= 1 at a row, the chain's tokens before it), best joint draft log-prob first (the chain's
    log-probs above it plus its own; ties: shallower, then better rank), from rows 0 .. depth-2 (a
    substitute at the last row has nothing below it to re-draft), impossible ones (-inf) never.
    top_ids/top_logprobs: [r, W] the rows drafted so far (r <= depth). The rule is ChainSubstitutions',
    applied to every row at once (the engine, replays); the drafter applies it row by row."""
    subs = ChainSubstitutions(count, depth)
    if count > 0:
        for ids, logp in zip(top_ids[:, : count + 1].tolist(), top_logprobs[:, : count + 1].tolist()):
            subs.add(ids, logp)
    return subs.best()


class ChainSubstitutions:
    """chain_substitutions row by row, reading only the row's best count + 1 candidates.

    Rule: a candidate enters the set only when its row is drafted (exactly when its token must be fed)
    and a later row can only push it out, never back in (the set is the best `count` of every candidate
    so far, and the best of a union is the best of (the old best + the new)), so the rows a drafter
    keeps drafting are exactly the final set's, each complete from its substitute down to `depth`."""

    def __init__(self, count: int, depth: int):
        self.count, self.depth = count, depth
        self.rows = 0                 # rows added
        self.joint = 0.0              # the chain's joint log-prob over the rows added
        self.chain: list[int] = []    # the chain's tokens over the rows added
        self._best: list = []         # [((-score, row, rank), prefix)], best first, at most `count`

    def add(self, ids: list[int], logp: list[float]) -> bool:
        """One drafted row: its candidates best first (target ids) and their log-probs (>= count + 1
        of each, or all the row has). Returns whether the set changed (a candidate of this row entered)."""
        r, best, count = self.rows, self._best, self.count
        changed = False
        if count > 0 and r < self.depth - 1:
            for j in range(1, min(count + 1, len(ids))):
                key = (-(self.joint + logp[j]), r, j)
                # a full set keeps a candidate only if it beats the worst kept (candidates come best first)
                if logp[j] == -math.inf or (len(best) == count and key >= best[-1][0]):
                    break
                # keys are distinct (row, rank), so entries order by key alone
                bisect.insort(best, (key, tuple(self.chain) + (ids[j],)))
                del best[count:]
                changed = True
        self.joint += logp[0]
        self.chain.append(ids[0])
        self.rows += 1
        return changed

    def best(self) -> list[tuple[int, ...]]:
        """The set so far, best first: each prefix (chain tokens, then the substitute)."""
        return [p for _, p in self._best]


class Drafter:
    """The base every drafter derives from: the protocol above, with the optional parts' defaults, so the
    engine asks every drafter the same questions and probes nothing."""
    name: str = "drafter"
    target_layers: tuple[int, ...] = ()  # target hidden_states indices this drafter conditions on; () = none
    block_size: int | None = None        # the block K it was trained to draft (root included); None = any K
    sequential: bool = False             # one forward per drafted position (the tuner prices drafting per step)
    redrafts_while_drafting: bool = False   # propose_with_redrafts re-drafts substitutions in the chain's steps
    redraft_policy: RedraftPolicy = DEFAULT_REDRAFTS   # best-first cure's re-drafts unless the config sets them

    def reset(self, context: Sequence[int], hidden: torch.Tensor | None) -> None:
        raise NotImplementedError

    def truncate(self, n: int) -> None:
        raise NotImplementedError

    def propose(self, root: int, n: int, top_k: int) -> Proposal:
        raise NotImplementedError

    def propose_with_redrafts(self, root: int, n: int, top_k: int, count: int,
                              stop_logp: float | None = None) -> Proposal:
        """Only drafters with `redrafts_while_drafting` re-draft while drafting; the rest just propose."""
        return self.propose(root, n, top_k)

    def redraft_topk(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int], top_k: int) -> list[Proposal]:
        raise NotImplementedError

    def redraft(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
        raise NotImplementedError

    def advance(self, tokens: Sequence[int], hidden: torch.Tensor | None) -> None:
        raise NotImplementedError

    def prefill(self) -> None:
        """Take in the context given by reset/advance now, in one pass, so that the next propose feeds only
        its root. The engine calls it in its prefill step: the drafter's pass over the prompt is part of the
        time to first token, as the target's is, not of the first block's drafting. Default: nothing to do."""

    def compile_for(self, capacity: int | None) -> None:
        """Before a generation's reset: its static-shape room under `compile` (None: any other generation).
        Default: the drafter runs its passes as they come."""


def proposals(rows: Sequence[torch.Tensor], top_k: int, to_ids=lambda cols: cols) -> list[Proposal]:
    """Per branch [L_j, C] draft logits -> its Proposal (top-k over the columns, mapped to target ids),
    one top-k over every row at once."""
    sizes = [int(r.shape[0]) for r in rows]
    if not sum(sizes):
        empty = torch.zeros((0, top_k), dtype=torch.long)
        return [Proposal([], empty, empty.float()) for _ in rows]
    cols, logp = top_k_logprobs(torch.cat([r for r in rows if r.shape[0]]), top_k)
    ids = to_ids(cols)
    out, at = [], 0
    for n in sizes:
        out.append(Proposal(tokens=ids[at:at + n, 0].tolist(), top_ids=ids[at:at + n], top_logprobs=logp[at:at + n]))
        at += n
    return out


def top_k_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, V] logits -> ([n, k] ids, [n, k] log-probs), best first, on the host.
    Rule: off the CPU both come back in ONE device-to-host read (ids ride as float64, exact below 2^53; a
    float32 log-prob is exact in float64): each read is a wait for the device (#13 item 4)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    vals, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return (ids, vals) if vals.device.type == "cpu" else to_host(ids, vals)


def to_host(ids: torch.Tensor, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, k] long ids and [n, k] float32 log-probs on a device -> the same on the host, in one read."""
    both = torch.cat([logp.double(), ids.double()], dim=-1).cpu()          # [n, 2k]
    width = logp.shape[-1]
    return both[:, width:].long(), both[:, :width].float()
