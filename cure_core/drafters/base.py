"""The drafter protocol every strategy drafts through.

One block's calls, in order:
  propose(root, n, top_k)   -> the block y_0..y_{n-1} plus per-position top-k log-probs (one pass
                               for a block-parallel drafter, n steps for an autoregressive one)
  redraft_topk(prefixes, lengths, top_k) -> for each substitution (tokens after the root, ending with
                               the substituted token), the next `length` positions re-drafted under it,
                               with per-position top-k, as a Proposal; one batched pass
  redraft(prefixes, lengths) -> the same, the suffix tokens only (the paper's repair branches)
  advance(tokens, hidden)   -> resync: `tokens` (root + accepted path) are now committed; `hidden`
                               holds the target's hidden states at those positions for drafters
                               conditioned on the target (`target_layers` says which layers).
`reset(context, hidden)` starts a generation: `context` is every prompt token but the last, which
becomes the first root. `truncate(n)` instead keeps the first n context tokens of the state a previous
generation left (everything given through reset + advance), so a chat turn that extends the last one
only `advance`s by its new tokens (Engine.generate(..., reuse_prefix=True)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]            # [n] the drafted block (argmax at each position)
    top_ids: torch.Tensor        # [n, top_k] long, candidates per position, best first (target ids)
    top_logprobs: torch.Tensor   # [n, top_k] float32 draft log-probs of top_ids

    @property
    def margins(self) -> list[float]:
        """m_i = l_{i,1} - l_{i,2}."""
        return (self.top_logprobs[:, 0] - self.top_logprobs[:, 1]).tolist()


class Drafter(Protocol):
    name: str
    target_layers: tuple[int, ...]   # target hidden_states indices this drafter conditions on; () = none
    block_size: int | None           # the block K it was trained to draft (root included); None = any K

    def reset(self, context: Sequence[int], hidden: torch.Tensor | None) -> None: ...

    def truncate(self, n: int) -> None: ...

    def propose(self, root: int, n: int, top_k: int) -> Proposal: ...

    def redraft_topk(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int], top_k: int) -> list[Proposal]: ...

    def redraft(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]: ...

    def advance(self, tokens: Sequence[int], hidden: torch.Tensor | None) -> None: ...


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
    """[n, V] logits -> ([n, k] ids, [n, k] log-probs), best first."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    vals, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return ids.cpu(), vals.cpu()
