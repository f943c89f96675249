"""Drafters built on a small causal LM with its own token KV cache.

- `ArDrafter`: naive speculative decoding's draft model; drafts a chain one token per step.
- `PardDrafter`: PARD-style block-parallel drafter; the context, the root and n-1 mask tokens go
  through the model in ONE pass and the root/mask positions predict the n block tokens.

Both keep the tokens committed since their last pass as `pending` and feed them at the front of
the next pass, so resync costs no extra forward. With a draft vocabulary (DraftVocab: a fixed id list
plus the context's ids) the model runs without its head and the head is applied over those ids only
(columns -> target ids through `vocab.ids`); without one, over every id below `vocab_size`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..lm import CachedLM, Forward
from ..tree import DraftTree
from .base import Proposal, top_k_logprobs
from .vocab import DraftVocab


class _CausalDrafter:
    name = "causal"
    target_layers: tuple[int, ...] = ()

    def __init__(self, model, vocab_size: int | None = None, draft_vocab: torch.Tensor | None = None,
                 mask_token_id: int = -1):
        self.model = model
        # Draft logits beyond the target's vocabulary (padding rows, mask tokens) are never proposed.
        self.vocab_size = vocab_size
        self.vocab = DraftVocab(draft_vocab, mask_token_id, vocab_size) if draft_vocab is not None else None
        # rows reused across blocks, grows by doubling; no head when the vocabulary applies its own
        self.lm = CachedLM(model, kv="static", capacity=256, head=self.vocab is None)
        self.pending: list[int] = []
        self.root_fed = False           # propose() put this block's root in the cache

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[..., : self.vocab_size] if self.vocab_size else logits

    def _scores(self, fwd: Forward, rows) -> torch.Tensor:
        """[R, C] draft logits of the given node rows over the proposable ids (columns: `_ids`)."""
        if self.vocab is None:
            return self._logits(fwd.logits[rows])
        # Rule: the head is looked up on every use (cpu_kernels.pack_linears swaps it after loading).
        return self.vocab.logits(fwd.last[rows], self.model.get_output_embeddings())

    def _ids(self, cols: torch.Tensor) -> torch.Tensor:
        """Score columns -> target token ids."""
        return cols if self.vocab is None else self.vocab.to_target(cols)

    def reset(self, context: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        self.lm.reset()
        self.pending = list(context)
        self.root_fed = False
        if self.vocab is not None:
            self.vocab.reset()
            self.vocab.add(context)

    def advance(self, tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        # tokens[0] is the root: in the cache if propose() ran this block (a block can skip drafting:
        # budget 0, or no room left); everything not in the cache is fed at the front of the next pass.
        self.pending = list(tokens[1:]) if self.root_fed else self.pending + list(tokens)
        self.root_fed = False
        if self.vocab is not None:
            self.vocab.add(tokens)

    def _feed_root(self, root: int, extra: Sequence[int]) -> torch.Tensor:
        """One chain pass over pending + [root] + extra; commits pending + root. Returns the scores
        from the root on ([1 + len(extra), C])."""
        if self.vocab is not None:
            self.vocab.add([root])                               # the root is context too
        seq = self.pending + [root] + list(extra)
        fwd = self.lm.forward(seq, [-1] + list(range(len(seq) - 1)))
        n_commit = len(self.pending) + 1
        self.lm.commit(fwd.nodes[:n_commit])
        self.pending = []
        self.root_fed = True
        return self._scores(fwd, slice(n_commit - 1, None))


class ArDrafter(_CausalDrafter):
    name = "ar"

    def propose(self, root: int, n: int, top_k: int) -> Proposal:
        rows = [self._feed_root(root, [])[-1]]                  # [C] after the root
        tokens = [int(self._ids(rows[0].argmax()))]
        last = -1
        for _ in range(n - 1):
            fwd = self.lm.forward([tokens[-1]], [last])
            last = fwd.nodes[0]
            rows.append(self._scores(fwd, 0))
            tokens.append(int(self._ids(rows[-1].argmax())))
        self.lm.rollback()
        cols, logp = top_k_logprobs(torch.stack(rows), top_k)   # [n, k]
        return Proposal(tokens=tokens, top_ids=self._ids(cols), top_logprobs=logp)

    def redraft(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
        tree = DraftTree()
        ends = [tree.add_path(p, branch=j)[-1] for j, p in enumerate(prefixes)]
        fwd = self.lm.forward(tree.tokens, tree.parents)
        rows = self._scores(fwd, ends)                          # [B, C] after each prefix
        last = [fwd.nodes[e] for e in ends]
        out: list[list[int]] = [[] for _ in prefixes]
        for step in range(max(lengths, default=0)):
            live = [j for j in range(len(prefixes)) if lengths[j] > step]
            toks = [int(self._ids(rows[j].argmax())) for j in live]
            for j, t in zip(live, toks):
                out[j].append(t)
            if step + 1 == max(lengths):
                break
            fwd = self.lm.forward(toks, [last[j] for j in live])
            new_rows = self._scores(fwd, slice(None))
            rows = rows.clone()
            for i, j in enumerate(live):
                rows[j] = new_rows[i]
                last[j] = fwd.nodes[i]
        self.lm.rollback()
        return out


class PardDrafter(_CausalDrafter):
    name = "pard"

    def __init__(self, model, mask_token_id: int, vocab_size: int | None = None,
                 draft_vocab: torch.Tensor | None = None):
        super().__init__(model, vocab_size, draft_vocab, mask_token_id)   # a vocabulary never holds the mask
        self.mask_token_id = int(mask_token_id)
        self.block_size = getattr(model.config, "pard_block_size", None)   # trained block (adapted drafters)

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        logits = super()._logits(logits).clone()
        if self.mask_token_id < logits.shape[-1]:
            logits[..., self.mask_token_id] = float("-inf")    # a mask is never a draft
        return logits

    def propose(self, root: int, n: int, top_k: int) -> Proposal:
        # One pass: [pending..., root, mask x (n-1)]; the root and each mask predict one block token.
        rows = self._feed_root(root, [self.mask_token_id] * (n - 1))   # [n, C]
        self.lm.rollback()                                      # mask rows never stay in the cache
        cols, logp = top_k_logprobs(rows, top_k)
        ids = self._ids(cols)
        return Proposal(tokens=ids[:, 0].tolist(), top_ids=ids, top_logprobs=logp)

    def redraft(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
        # One batched pass over the trie of [prefix_j, mask x (L_j - 1)]: the substituted token and
        # the masks after it predict branch j's suffix.
        tree = DraftTree()
        spans = []
        for j, (p, n) in enumerate(zip(prefixes, lengths)):
            nodes = tree.add_path(list(p) + [self.mask_token_id] * max(n - 1, 0), branch=j)
            spans.append(nodes[len(p) - 1: len(p) - 1 + n] if n > 0 else [])
        if len(tree) == 0:
            return [[] for _ in prefixes]
        fwd = self.lm.forward(tree.tokens, tree.parents)
        self.lm.rollback()
        flat = [i for span in spans for i in span]
        toks = self._ids(self._scores(fwd, flat).argmax(-1)).tolist()   # one argmax over every suffix row
        out, at = [], 0
        for span in spans:
            out.append(toks[at: at + len(span)])
            at += len(span)
        return out
