"""A drafter's restricted vocabulary: the head runs over a subset of ids (lossless: only proposals change)."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError


def lowest_ids(n: int, vocab_size: int) -> torch.Tensor | None:
    """A fixed list for drafters with no ranked one: ids below min(n, vocab_size) (see DraftVocab);
    None for n = 0, the whole vocabulary."""
    return torch.arange(min(n, vocab_size), dtype=torch.long) if n else None


class DraftVocab:
    """The ids a drafter may propose: a fixed list plus every id of the current context (prompts copy
    identifiers). DFlash checkpoints ship a frequency-ranked list (tensor `draft_vocab`: 16384 ids
    cover 92% of Qwen2.5-Coder-0.5B's greedy HumanEval tokens, 96% with the prompt's ids); causal
    drafters take the lowest ids (`lowest_ids`: byte-level BPE ids follow merge order, so the low ones
    are the common ones: 16384 cover 91-92% of the 0.5B's and the 1.5B's greedy tokens). Why: over
    151936 ids the head is a drafter's main cost on a CPU (DFlash on the 0.5B: 28 ms of a ~35 ms
    proposal; over 16384 it is ~3 ms).
    Rule: only proposals change. The target verifies every token, so outputs stay lossless; a token
    outside the vocabulary is simply never drafted. Log-probs are renormalised over the vocabulary
    (margins, l1 - l2, are unchanged)."""

    def __init__(self, ids: torch.Tensor, mask_token_id: int, vocab_size: int | None):
        self.mask_token_id, self.vocab_size = int(mask_token_id), vocab_size
        self.fixed = self._new_ids(ids.flatten().tolist(), set())   # frequency-ranked, fixed for the checkpoint
        if not self.fixed:
            raise ModelLoadError("the draft vocabulary (draft_vocab) holds no usable token id")
        self._fixed_set = set(self.fixed)
        self._head = None                          # (lm_head it was cut from, Linear over the fixed ids)
        self.reset()

    def _new_ids(self, tokens, known: set[int]) -> list[int]:
        """The ids of `tokens` a drafter may propose that `known` lacks, first occurrence order. Rule:
        never the mask, never an id past the target's vocabulary."""
        out: dict[int, None] = {}
        for t in map(int, tokens):
            if t not in known and t != self.mask_token_id and 0 <= t and (self.vocab_size is None or t < self.vocab_size):
                out[t] = None
        return list(out)

    def reset(self) -> None:
        """Forget the context ids (a new generation)."""
        self.extra: list[int] = []                 # context ids outside the fixed list, in arrival order
        self._extra_set: set[int] = set()
        self._extra_rows = None                    # (weight [n_extra, H], bias or None) cut from the head
        self.ids = torch.tensor(self.fixed, dtype=torch.long)   # [V'] column -> target id

    def add(self, tokens: Sequence[int]) -> None:
        new = [t for t in self._new_ids(tokens, self._fixed_set) if t not in self._extra_set]
        if new:
            self.extra += new
            self._extra_set.update(new)
            self._extra_rows = None
            self.ids = torch.cat([self.ids, torch.tensor(new, dtype=torch.long)])

    def to_target(self, cols: torch.Tensor) -> torch.Tensor:
        """Columns of `logits` -> target token ids."""
        return self.ids.to(cols.device)[cols]

    def _fixed_head(self, lm_head: nn.Module) -> nn.Module:
        """A bias-carrying Linear over the fixed ids, cut from `lm_head` once (again if the target's
        head module was swapped, e.g. packed), and packed like it."""
        if self._head is None or self._head[0] is not lm_head:
            from ..cpu_kernels import PackedLinear
            w = lm_head.weight.detach()
            idx = torch.tensor(self.fixed, device=w.device)
            bias = getattr(lm_head, "bias", None)
            cut = nn.Linear(w.shape[1], len(self.fixed), bias=bias is not None, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                cut.weight.copy_(w.index_select(0, idx))
                if bias is not None:
                    cut.bias.copy_(bias.detach().index_select(0, idx))
            cut.requires_grad_(False)
            head = PackedLinear(cut, keep_weight=False) if isinstance(lm_head, PackedLinear) else cut
            self._head = (lm_head, head)
        return self._head[1]

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """[N, H] -> [N, V'] float32 logits, columns in `ids` order."""
        out = self._fixed_head(lm_head)(hidden).float()                    # [N, V_fixed]
        if not self.extra:
            return out
        if self._extra_rows is None:                                       # cut once per new context id
            w, bias = lm_head.weight.detach(), getattr(lm_head, "bias", None)
            idx = torch.tensor(self.extra, device=w.device)
            self._extra_rows = (w.index_select(0, idx), None if bias is None else bias.detach().index_select(0, idx))
        return torch.cat([out, F.linear(hidden, *self._extra_rows).float()], dim=-1)
