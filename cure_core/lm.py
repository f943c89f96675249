"""A Hugging Face causal LM with a tree-aware KV cache.

The cache holds a committed prefix (the verified context) followed by uncommitted "scratch"
nodes: tokens forwarded speculatively, each with a parent. A forward over new nodes attends to
the whole committed prefix plus each node's own scratch ancestors (an ancestor-only 4D mask) at
position id = committed length + depth. `commit()` keeps exactly a chosen chain of scratch nodes
by gathering their K/V rows (no re-prefill); `rollback()` drops every scratch node.

Two cache layouts (the output is the same; only speed differs):
- "dynamic": HF's DynamicCache; every forward concatenates the new rows (the whole cache is copied)
  and compaction gathers a new tensor.
- "static": K/V rows preallocated once per capacity ([B, H, capacity, D] per layer, reused across
  generations); forwards write their rows in place and compaction moves the kept rows down in place.
  Past its capacity it doubles (rows copied once), except with static shapes, where it refuses.
  With `static_shapes`, every forward also has a fixed shape: the node count is padded up to one of
  PAD_SIZES with dummy nodes and attention always spans the whole capacity, so `torch.compile`
  (CUDA graphs on a GPU) sees a handful of shapes instead of one per tree size.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from .attention import use_grouped_attention
from .config import KV_LAYOUTS
from .cpu_kernels import INT8_MAX_ROWS, is_packed
from .int8_decoder import Int8Decoder, unsupported as int8_decoder_unsupported
from .tree import fill_ancestors


_UNRESOLVED = object()      # CachedLM.int8 before its first forward

# Node counts a static-shape forward is padded up to (beyond the last: multiples of 128).
PAD_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


def padded_size(n: int) -> int:
    for s in PAD_SIZES:
        if n <= s:
            return s
    return -(-n // 128) * 128


def _per_device(t: torch.Tensor):
    """device -> `t` on that device (None: as it is), copied once per device, not once per layer
    (device_map spreads layers over devices)."""
    copies: dict = {None: t}

    def on(device):
        if device not in copies:
            copies[device] = t.to(device)
        return copies[device]
    return on


class RowLayer(StaticLayer):
    """One layer's preallocated K/V rows [B, H, capacity, D]. A forward writes its rows in place at
    the current end; `full` returns the whole buffer (static shapes), else a view of the rows in use."""

    def __init__(self, capacity: int, full: bool):
        super().__init__(max_cache_len=capacity)
        self.full = full
        self.used = 0                           # rows in use (host mirror of cumulative_length)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        # Rule: new rows go at the end; the position comes from a device tensor (no host sync, graph-safe).
        pos = self.cumulative_length + torch.arange(n, device=self.device)
        self.cumulative_length.add_(n)
        self.keys.index_copy_(2, pos, key_states)
        self.values.index_copy_(2, pos, value_states)
        if self.full:
            return self.keys, self.values
        end = self.used + n
        return self.keys[:, :, :end], self.values[:, :, :end]

    def set_used(self, n: int) -> None:
        self.used = n
        if self.is_initialized:
            self.cumulative_length.fill_(n)

    def keep_rows(self, start: int, src: torch.Tensor) -> None:
        """Rows src (ascending, all >= start; on this layer's device) move down to start.. in place; the
        rest is dropped."""
        if self.is_initialized and len(src):
            self.keys[:, :, start:start + len(src)] = self.keys.index_select(2, src)
            self.values[:, :, start:start + len(src)] = self.values.index_select(2, src)
        self.set_used(start + len(src))


@dataclass(frozen=True)
class Forward:
    logits: torch.Tensor | None     # [N, V] float32, one row per new node; None without the head (or not asked)
    last: torch.Tensor | None       # [N, H] the decoder's output (before the head); only without the head
    hidden: torch.Tensor | None     # [N, L*H] selected layers' hidden states, concatenated; None if not asked
    nodes: list[int]                # scratch indices given to the new nodes


class CachedLM:
    def __init__(self, model, hidden_layers: Sequence[int] = (), kv: str = "dynamic",
                 static_shapes: bool = False, compile: bool = False, capacity: int = 1024, head: bool = True):
        if kv not in KV_LAYOUTS:
            raise ValueError(f"unknown KV cache layout {kv!r}; choose one of {', '.join(KV_LAYOUTS)}")
        if (static_shapes or compile) and kv != "static":
            raise ValueError("static shapes and compile need the static KV cache")
        self.model = model
        use_grouped_attention(model)                # masked tree forwards on CPU without K/V copies
        self.config = model.config
        self.device = next(model.parameters()).device
        self.hidden_layers = tuple(hidden_layers)   # hidden_states indices to return (0 = embeddings)
        self.kv = kv
        self.static_shapes = static_shapes or compile   # compiled graphs want a few fixed shapes
        # head=False: forwards stop at the decoder's output (`Forward.last`), for a caller that applies
        # its own head over a few rows (a drafter's DraftVocab), instead of V logits for every node.
        if not head and compile:
            raise ValueError("compile runs the whole model, head included")
        self.head = head
        self.eager = model if head else model.get_decoder()
        # a prefill asks for no logits: the head then runs over one row instead of every prompt row
        self._keeps_logits = head and "logits_to_keep" in inspect.signature(model.forward).parameters
        self.run = self.eager
        # an int8 drafter's short passes run the flat int8 forward (int8_decoder.py); None: transformers' always.
        # Resolved on the first forward (`int8_decoder`): load_pair packs a drafter's layers after building it.
        self.int8: Int8Decoder | None | object = None if compile else _UNRESOLVED
        if compile and is_packed(model):
            raise ValueError("`compile` cannot trace packed CPU layers (inductor packs weights itself); "
                             "load the model with `kernels` eager")
        self.graphs = compile and self.device.type == "cuda"     # compiled forwards replay CUDA graphs
        if compile:
            # On a GPU "reduce-overhead" replays CUDA graphs: one per padded size.
            mode = "reduce-overhead" if self.graphs else "default"
            self.run = torch.compile(model, mode=mode, dynamic=False)
            # Rule: every padded size is one compilation (x2 with hidden states, per model); past dynamo's
            # recompile limit (8) it would silently fall back to eager forwards.
            dyn = torch._dynamo.config
            dyn.recompile_limit = max(dyn.recompile_limit, 64)
        self.capacity = 0
        self.cache = None
        self.reset(capacity)

    @torch.inference_mode()
    def reset(self, capacity: int | None = None) -> None:
        """Drop everything cached. A static cache keeps its buffers when they already hold
        `capacity` rows (default: what they hold now, or 1024 the first time)."""
        if self.kv == "dynamic":
            self.cache = DynamicCache(config=self.config)
        else:
            need = capacity or self.capacity or 1024
            if self.cache is None or need > self.capacity:
                n_layers = int(self.config.num_hidden_layers)
                self.capacity = need
                self.cache = Cache(layers=[RowLayer(need, full=self.static_shapes) for _ in range(n_layers)])
                if self.static_shapes:
                    # Rule: compiled forwards need the K/V buffers allocated OUTSIDE the graph. Allocated
                    # lazily inside it, they would live in the CUDA-graph pool (overwritten by the next
                    # replay) and miss mark_static_address (cudagraphs skipped: "mutated inputs").
                    cfg, p = self.config, next(self.model.parameters())
                    heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
                    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
                    self.cache.early_initialization(1, heads, head_dim, p.dtype, self.device)
            for layer in self.cache.layers:
                layer.set_used(0)
        self.committed = 0                              # tokens of verified context in the cache
        self.scratch_tokens: list[int] = []
        self.scratch_depth: list[int] = []              # [S] depth below the committed end (1-based)
        # ancestor-or-self among scratch nodes: rows/columns [:S] of a buffer reused across forwards and
        # blocks, all False outside them (fill_ancestors writes rows into False ones; commit clears them)
        self._anc = np.zeros((64, 64), dtype=bool)

    def int8_decoder(self) -> Int8Decoder | None:
        """The Int8Decoder this model's short passes run, or None (not an int8 Llama-style model, or compiled)."""
        if self.int8 is _UNRESOLVED:
            self.int8 = Int8Decoder(self.model) if int8_decoder_unsupported(self.model) is None else None
        return self.int8

    @property
    def scratch(self) -> int:
        return len(self.scratch_tokens)

    @torch.inference_mode()
    def forward(self, tokens: Sequence[int], parents: Sequence[int], logits: bool = True) -> Forward:
        """Forward new scratch nodes.

        parents[j] is the scratch index of node j's parent: an existing scratch node, an earlier
        new node (existing count + its position among the new ones), or -1 for "right after the
        committed prefix". Parents must come before children. `logits=False`: no logits wanted
        (`Forward.logits` None), so an eager forward runs the head over one row, not all N.
        """
        n = len(tokens)
        s_old = self.scratch
        s_new = s_old + n
        old_depth = self.scratch_depth
        new_depth: list[int] = []                            # plain ints; parents come before children
        for p in parents:
            new_depth.append(1 if p < 0 else (old_depth[p] if p < s_old else new_depth[p - s_old]) + 1)
        if s_new > len(self._anc):                           # grow the buffer: used rows copied once
            grown = np.zeros((2 * s_new, 2 * s_new), dtype=bool)
            grown[:s_old, :s_old] = self._anc[:s_old, :s_old]
            self._anc = grown
        # rows s_old.. are False (past the scratch nodes); written, they take effect when `scratch` grows
        fill_ancestors(self._anc, parents, s_old)
        end = self.committed + s_new                         # cache rows in use after this forward
        # Static shapes: pad to n_pad nodes with dummies (depth 1, seeing the prefix and themselves;
        # no real node sees them) and span the whole capacity; their rows are dropped right after.
        n_pad = padded_size(n) if self.static_shapes else n
        width = self.capacity if self.static_shapes else end
        if self.kv == "static" and self.committed + s_old + n_pad > self.capacity:
            if self.static_shapes:                           # compiled graphs hold the buffers' addresses
                self._clear_rows(s_old, s_new)
                raise RuntimeError(f"KV cache capacity {self.capacity} exceeded "
                                   f"({self.committed} committed + {s_old + n_pad} scratch rows)")
            self._grow(self.committed + s_old + n_pad)
        # Mask: [1, 1, N_pad, width]; every new node sees the committed prefix and exactly its own
        # scratch ancestors (itself included). Built in numpy: per-call costs dominate at these sizes.
        mask = np.zeros((n_pad, width), dtype=bool)
        mask[:, :self.committed] = True
        mask[:n, self.committed:end] = self._anc[s_old:s_new, :s_new]
        # Rule: position id = committed length + depth - 1 (a node right after the prefix sits at `committed`).
        pos = np.full(n_pad, self.committed, dtype=np.int64)
        pos[:n] = new_depth
        pos[:n] += self.committed - 1
        toks = list(tokens)
        if n_pad > n:
            dummy = np.arange(n, n_pad)
            mask[dummy, end - n + dummy] = True
            toks += [toks[-1]] * (n_pad - n)
        ids = torch.tensor([toks], dtype=torch.long, device=self.device)
        mask, pos = torch.from_numpy(mask), torch.from_numpy(pos)
        # Rule: only tree-sized forwards (<= PAD_SIZES[-1] nodes) run compiled; a prefill runs eagerly
        # (into the same buffers), so prompt lengths never add compilations.
        run = self.run if n_pad <= PAD_SIZES[-1] else self.eager
        graphs = self.graphs and run is self.run
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()       # the previous replay's outputs are dead
        # Rule: a compiled forward keeps its signature (another one would be another compilation)
        skip_head = {"logits_to_keep": 1} if not logits and self._keeps_logits and run is self.eager else {}
        # Rule: an int8 drafter's pass of up to INT8_MAX_ROWS rows (a chain step) runs Int8Decoder; the same
        # rows the int8 layers would run, without transformers' casts (int8_decoder.py). An int8 target
        # (`exact`) runs every pass there: one forward for every row count.
        dec = self.int8_decoder()
        flat = dec is not None and (dec.exact or (n_pad <= INT8_MAX_ROWS and not self.hidden_layers))
        try:
            if flat:
                last, flat_hidden = dec(ids, mask[None, None], pos[None], self.cache, self.hidden_layers)  # [N_pad, H]
            else:
                out = run(input_ids=ids, attention_mask=mask[None, None].to(self.device),
                          position_ids=pos[None].to(self.device), cache=self.cache, use_cache=True,
                          output_hidden_states=bool(self.hidden_layers), **skip_head)
        except BaseException:
            self._clear_rows(s_old, s_new)                   # the nodes never entered the scratch
            raise
        if self.kv == "static":
            for layer in self.cache.layers:
                if n_pad > n:
                    layer.set_used(end)                      # drop the dummies' rows (overwritten next time)
                else:
                    layer.used = end                         # update() already advanced cumulative_length
        hidden = None
        if self.hidden_layers:
            hidden = flat_hidden[:n] if flat else torch.cat([out.hidden_states[i][0, :n] for i in self.hidden_layers], dim=-1)
        rows = None
        if flat:
            last = last[:n]
            if self.head:
                rows = self.model.get_output_embeddings()(last).float() if logits else None   # [N, V]
                last = None
        elif self.head:
            last = None
            if logits:
                rows = out.logits[0, :n].float()             # [N, V]
                if graphs:
                    rows = rows.clone()                      # CUDA-graph outputs are overwritten by the next replay
        else:
            last = out.last_hidden_state[0, :n]              # [N, H]
        self.scratch_tokens.extend(int(t) for t in tokens)
        self.scratch_depth = old_depth + new_depth
        return Forward(logits=rows, last=last, hidden=hidden, nodes=list(range(s_old, s_old + n)))

    def prefill(self, ids: Sequence[int]) -> Forward | None:
        """Forward a chain of tokens and commit it. Rule: no logits (`Forward.logits` None). Nothing reads a
        prompt row's logits (the first root's come with block 0's forward), and the head over every row is
        a [rows, vocab] matmul: 151,936 ids on the embedded Qwen pairs."""
        if len(ids) == 0:
            return None
        fwd = self.forward(ids, [-1] + list(range(self.scratch, self.scratch + len(ids) - 1)), logits=False)
        self.commit(fwd.nodes)
        return fwd

    @torch.inference_mode()
    def commit(self, keep: Sequence[int]) -> None:
        """Make scratch nodes `keep` (a root-to-leaf chain, shallow to deep) part of the committed
        prefix and drop every other scratch node: the cache is gathered to exactly those rows."""
        keep = list(keep)
        if keep:
            assert [self.scratch_depth[i] for i in keep] == list(range(1, len(keep) + 1)), \
                "commit() needs a chain from depth 1"
        s = self.scratch
        if s == 0:
            return
        if keep == list(range(len(keep))):
            # Fast path: the kept chain is a prefix of the scratch rows; crop the rest.
            self._crop(self.committed + len(keep))
        elif self.kv == "static":
            src = _per_device(torch.tensor([self.committed + i for i in keep], dtype=torch.long))
            for layer in self.cache.layers:
                layer.keep_rows(self.committed, src(layer.keys.device) if layer.is_initialized else src(None))
        else:
            idx = _per_device(torch.tensor(list(range(self.committed)) + [self.committed + i for i in keep],
                                           dtype=torch.long))
            for layer in self.cache.layers:
                if type(layer) is not DynamicLayer:
                    raise NotImplementedError(f"KV compaction does not support {type(layer).__name__} (sliding window)")
                if not layer.is_initialized:
                    continue
                dev_idx = idx(layer.keys.device)
                layer.keys = layer.keys.index_select(-2, dev_idx)   # [B, H, T, D]
                layer.values = layer.values.index_select(-2, dev_idx)
        self._clear_rows(0, s)
        self.committed += len(keep)
        self.scratch_tokens = []
        self.scratch_depth = []

    def _clear_rows(self, start: int, stop: int) -> None:
        """Ancestor rows start..stop-1 back to False (their columns stop before `stop`)."""
        self._anc[start:stop, :stop] = False

    @property
    def scratch_anc(self) -> np.ndarray:
        """[S, S] ancestor-or-self among the scratch nodes (a view of the buffer)."""
        return self._anc[: self.scratch, : self.scratch]

    def rollback(self) -> None:
        """Drop every scratch node."""
        self.commit([])

    @torch.inference_mode()
    def truncate(self, n: int) -> None:
        """Keep the first n committed rows (a prefix of the context, both KV layouts) and drop the rest and
        every scratch row: K/V rows depend only on the tokens before them, so the kept rows are exactly
        what a fresh prefill of those n tokens would write (the cross-turn cache, engine.py)."""
        if not 0 <= n <= self.committed:
            raise ValueError(f"truncate({n}): the cache holds {self.committed} committed rows")
        self.rollback()
        self._crop(n)
        self.committed = n

    def _grow(self, rows: int) -> None:
        """Static rows without static shapes (drafters; a target whose caller sized it too small):
        reallocate to max(rows, 2 x capacity) and copy the rows in use, so growth costs O(1) per row."""
        cap = max(rows, 2 * self.capacity)
        old = self.cache
        self.cache = Cache(layers=[RowLayer(cap, full=False) for _ in old.layers])
        for o, n in zip(old.layers, self.cache.layers):
            if o.is_initialized:
                n.lazy_initialization(o.keys, o.values)
                n.keys[:, :, :o.used] = o.keys[:, :, :o.used]
                n.values[:, :, :o.used] = o.values[:, :, :o.used]
            n.set_used(o.used)
        self.capacity = cap

    def _crop(self, length: int) -> None:
        if self.kv == "static":
            for layer in self.cache.layers:
                layer.set_used(length)
            return
        for layer in self.cache.layers:
            if layer.is_initialized and layer.keys.shape[-2] > length:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]
