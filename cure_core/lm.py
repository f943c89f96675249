"""A Hugging Face causal LM with a tree-aware KV cache.

The cache holds a committed prefix (the verified context) followed by uncommitted "scratch"
nodes: tokens forwarded speculatively, each with a parent. A forward over new nodes attends to
the whole committed prefix plus each node's own scratch ancestors (an ancestor-only 4D mask) at
position id = committed length + depth. `commit()` keeps exactly a chosen chain of scratch nodes
by gathering their K/V rows (no re-prefill); `rollback()` drops every scratch node.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .tree import extend_ancestors


@dataclass(frozen=True)
class Forward:
    logits: torch.Tensor            # [N, V] float32, one row per new node
    hidden: torch.Tensor | None     # [N, L*H] selected layers' hidden states, concatenated; None if not asked
    nodes: list[int]                # scratch indices given to the new nodes


class CachedLM:
    def __init__(self, model, hidden_layers: Sequence[int] = ()):
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        self.hidden_layers = tuple(hidden_layers)   # hidden_states indices to return (0 = embeddings)
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.config)
        self.committed = 0                              # tokens of verified context in the cache
        self.scratch_tokens: list[int] = []
        self.scratch_depth = np.zeros(0, dtype=np.int64)     # [S] depth below the committed end (1-based)
        self.scratch_anc = np.zeros((0, 0), dtype=bool)      # [S, S] ancestor-or-self among scratch nodes

    @property
    def scratch(self) -> int:
        return len(self.scratch_tokens)

    @torch.inference_mode()
    def forward(self, tokens: Sequence[int], parents: Sequence[int]) -> Forward:
        """Forward new scratch nodes.

        parents[j] is the scratch index of node j's parent: an existing scratch node, an earlier
        new node (existing count + its position among the new ones), or -1 for "right after the
        committed prefix". Parents must come before children.
        """
        n = len(tokens)
        s_old = self.scratch
        dep = self.scratch_depth.tolist()
        for p in parents:                                    # plain ints; parents come before children
            dep.append(dep[p] + 1 if p >= 0 else 1)
        all_depth = np.asarray(dep, dtype=np.int64)
        new_depth = all_depth[s_old:]
        anc = extend_ancestors(self.scratch_anc, parents, new_depth)   # [S_old+N, S_old+N]
        # Mask: [1, 1, N, committed + S_old + N]; every new node sees the committed prefix and
        # exactly its own scratch ancestors (itself included).
        mask = torch.ones((n, self.committed + s_old + n), dtype=torch.bool)
        mask[:, self.committed:] = torch.from_numpy(anc[s_old:])
        # Rule: position id = committed length + depth - 1 (a node right after the prefix sits at `committed`).
        pos = torch.from_numpy(self.committed + new_depth - 1)
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, attention_mask=mask[None, None].to(self.device),
                         position_ids=pos[None].to(self.device), cache=self.cache, use_cache=True,
                         output_hidden_states=bool(self.hidden_layers))
        hidden = None
        if self.hidden_layers:
            hidden = torch.cat([out.hidden_states[i][0] for i in self.hidden_layers], dim=-1)
        self.scratch_tokens.extend(int(t) for t in tokens)
        self.scratch_depth = all_depth
        self.scratch_anc = anc
        return Forward(logits=out.logits[0].float(), hidden=hidden, nodes=list(range(s_old, s_old + n)))

    def prefill(self, ids: Sequence[int]) -> Forward | None:
        """Forward a chain of tokens and commit it."""
        if len(ids) == 0:
            return None
        fwd = self.forward(ids, [-1] + list(range(self.scratch, self.scratch + len(ids) - 1)))
        self.commit(fwd.nodes)
        return fwd

    def commit(self, keep: Sequence[int]) -> None:
        """Make scratch nodes `keep` (a root-to-leaf chain, shallow to deep) part of the committed
        prefix and drop every other scratch node: the cache is gathered to exactly those rows."""
        keep = list(keep)
        if keep:
            depths = self.scratch_depth[keep]
            assert (depths == np.arange(1, len(keep) + 1)).all(), "commit() needs a chain from depth 1"
        s = self.scratch
        if s == 0:
            return
        if keep == list(range(len(keep))):
            # Fast path: the kept chain is a prefix of the scratch rows; crop the rest.
            self._crop(self.committed + len(keep))
        else:
            idx = torch.tensor(list(range(self.committed)) + [self.committed + i for i in keep], dtype=torch.long)
            on: dict = {}                                           # idx per device (device_map spreads layers)
            for layer in self.cache.layers:
                if type(layer) is not DynamicLayer:
                    raise NotImplementedError(f"KV compaction does not support {type(layer).__name__} (sliding window)")
                if not layer.is_initialized:
                    continue
                dev_idx = on.setdefault(layer.keys.device, idx.to(layer.keys.device))
                layer.keys = layer.keys.index_select(-2, dev_idx)   # [B, H, T, D]
                layer.values = layer.values.index_select(-2, dev_idx)
        self.committed += len(keep)
        self.scratch_tokens = []
        self.scratch_depth = np.zeros(0, dtype=np.int64)
        self.scratch_anc = np.zeros((0, 0), dtype=bool)

    def rollback(self) -> None:
        """Drop every scratch node."""
        self.commit([])

    def _crop(self, length: int) -> None:
        for layer in self.cache.layers:
            if layer.is_initialized and layer.keys.shape[-2] > length:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]
