"""DFlash: a block-diffusion drafter conditioned on the target's hidden states (z-lab `*-DFlash-b16`).

How the published drafter works (and how this file maps it onto the engine's drafter protocol):

- Context features. For every committed token, the target's hidden states after decoder layers
  `target_layer_ids` (0-based decoder-layer indices, i.e. HF `output_hidden_states[id + 1]`) are
  concatenated, projected by `fc` ([n_ids * H_target] -> H) and normalised by `hidden_norm`. Each
  draft layer turns those projected rows into context K/V with its own `k_proj`/`v_proj` (no
  input_layernorm on them), per-head `k_norm` and RoPE at the tokens' absolute positions. The draft
  KV cache holds exactly these context rows, never block rows.
- Block. [anchor, mask x n] at positions T..T+n, where T = number of context rows and the anchor is
  the last committed token, whose own features are not in the context yet (they arrive with the
  next verification). Token embeddings come from the TARGET's embedding table; the block attends
  to all context rows and, non-causally, to every block row (bidirectional inside the block).
- Output. Draft layers are Qwen3 decoder layers (q/k RMS-norm per head, SwiGLU MLP), then `norm`;
  the TARGET's lm_head turns mask row i (block index i >= 1) into the prediction of the token AT
  block position i (no shift: the anchor row's output is discarded).
- Resync (advance). The engine hands back the hidden states of [anchor + accepted tokens]; they are
  appended to the context cache at positions T.. and T grows by their count, exactly as the
  reference crops its draft cache to `start` and feeds the accepted rows with the next block.

Repair branches (redraft) are blocks [anchor, prefix..., c, mask x L] forwarded together in one pass
with a block-diagonal mask: every row sees the whole context and its own block only.

Static shapes (`compile_for`, the engine's `compile`): the context K/V rows are preallocated for the
whole generation and every block pass spans all of them under a mask (columns past T masked), with the
block count padded to STATIC_BLOCKS, so the network sees a handful of shapes and `torch.compile` (CUDA
graphs on a GPU) replays them, as the target's verify forward does (lm.py). The embedding lookup and the
target's head stay eager: one kernel each, and the head reads what it reads whatever runs it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError
from .base import Drafter, Proposal, proposals, top_k_logprobs
from .vocab import DraftVocab

DEFAULT_BLOCK_SIZE = 16
# Block counts a static-shape pass is padded up to (a proposal: 1; best-first cure's re-draft pass: its
# substitutions); more blocks than the last run eagerly.
STATIC_BLOCKS = (1, 2, 4, 8)


# --------------------------------------------------------------------------------------------
# Config helpers: the published checkpoint keeps mask_token_id / target_layer_ids inside
# `dflash_config` and block_size at the top level; other releases move them around, so each is
# looked up in dflash_config first, then at the top level.
# --------------------------------------------------------------------------------------------

def dflash_config_get(cfg, name: str, default=None):
    sub = _as_dict(getattr(cfg, "dflash_config", None) if not isinstance(cfg, dict) else cfg.get("dflash_config"))
    if name in sub and sub[name] is not None:
        return sub[name]
    val = cfg.get(name) if isinstance(cfg, dict) else getattr(cfg, name, None)
    return default if val is None else val


def _as_dict(x) -> dict:
    if x is None:
        return {}
    if isinstance(x, dict):
        return x
    return dict(getattr(x, "__dict__", {}))


def is_dflash_config(cfg) -> bool:
    """A DFlash drafter's config: a DFlash architecture name, or a `dflash_config` section."""
    archs = cfg.get("architectures") if isinstance(cfg, dict) else getattr(cfg, "architectures", None)
    if any("DFlash" in a for a in (archs or [])):
        return True
    return bool(_as_dict(cfg.get("dflash_config") if isinstance(cfg, dict) else getattr(cfg, "dflash_config", None)))


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference's fallback when a config names no layers: one tap in the middle for a 1-layer
    drafter, else `num_draft_layers` taps evenly spaced over decoder layers 1 .. L_target - 3."""
    if num_draft_layers <= 1:
        return [num_target_layers // 2]
    lo, hi = 1, num_target_layers - 3
    return [int(round(lo + i * (hi - lo) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


# --------------------------------------------------------------------------------------------
# The network. Module names mirror the published state dict (unprefixed):
#   fc.weight [H, n_ids*H_t]   hidden_norm.weight [H]   norm.weight [H]
#   layers.{i}.self_attn.{q,k,v,o}_proj.weight   layers.{i}.self_attn.{q,k}_norm.weight [head_dim]
#   layers.{i}.mlp.{gate,up,down}_proj.weight    layers.{i}.{input,post_attention}_layernorm.weight
# --------------------------------------------------------------------------------------------

def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half convention). x [..., N, D]; cos/sin [N, D]."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class DFlashAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
        h = config.hidden_size
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.n_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, H] rows -> K [n_kv, N, D] (k_norm, RoPE), V [n_kv, N, D]."""
        n = x.shape[0]
        k = self.k_norm(self.k_proj(x).view(n, self.n_kv, self.head_dim)).transpose(0, 1)
        v = self.v_proj(x).view(n, self.n_kv, self.head_dim).transpose(0, 1)
        return _rotate(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        """x [N, H] block rows (already input-normed); ctx_k/ctx_v [n_kv, T, D]; mask [N, T+N] bool or None."""
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.n_heads, self.head_dim)).transpose(0, 1)
        q = _rotate(q, cos, sin)
        k, v = self.kv(x, cos, sin)
        k = torch.cat([ctx_k, k], dim=1)
        v = torch.cat([ctx_v, v], dim=1)
        out = F.scaled_dot_product_attention(q[None], k[None], v[None],
                                             attn_mask=None if mask is None else mask[None, None],
                                             scale=self.head_dim ** -0.5, enable_gqa=self.n_heads != self.n_kv)
        return self.o_proj(out[0].transpose(0, 1).reshape(n, self.n_heads * self.head_dim))


class DFlashLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashModel(nn.Module):
    """The drafter's own weights (no embedding, no lm_head: those are the target's)."""

    def __init__(self, config, n_features: int, target_hidden_size: int):
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding
        self.config = config
        self.layers = nn.ModuleList([DFlashLayer(config) for _ in range(config.num_hidden_layers)])
        self.fc = nn.Linear(n_features * target_hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)     # inv_freq is a non-persistent buffer

    def rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rotary_emb(like, positions[None])
        return cos[0], sin[0]                                 # [N, D]

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """[N, n_ids*H_t] concatenated target features -> per layer (K, V), each [n_kv, N, D]."""
        ctx = self.hidden_norm(self.fc(features))
        cos, sin = self.rope(positions, ctx)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def forward(self, embeds, positions, ctx_kv, mask) -> torch.Tensor:
        """Block rows [N, H] at `positions` [N] -> final-normed hidden [N, H]."""
        cos, sin = self.rope(positions, embeds)
        x = embeds
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)


# --------------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------------

class DFlashDrafter(Drafter):
    """The engine's Drafter over a DFlash network, sharing the target's embedding and lm_head."""
    name = "dflash"

    def __init__(self, model: DFlashModel, target: nn.Module, *, target_layer_ids: Sequence[int], mask_token_id: int,
                 block_size: int = DEFAULT_BLOCK_SIZE, vocab_size: int | None = None,
                 input_embedding_scale: float = 1.0, output_multiplier: float = 1.0,
                 final_logit_softcapping: float | None = None, draft_vocab: torch.Tensor | None = None):
        self.model = model.eval()
        self.target = target
        self.target_layer_ids = tuple(int(i) for i in target_layer_ids)
        # DFlash ids count decoder layers from 0; HF hidden_states[0] is the embeddings.
        self.target_layers = tuple(i + 1 for i in self.target_layer_ids)
        self.mask_token_id = int(mask_token_id)
        self.block_size = int(block_size)
        self.vocab_size = vocab_size
        self.input_embedding_scale = float(input_embedding_scale)
        self.output_multiplier = float(output_multiplier)
        self.final_logit_softcapping = final_logit_softcapping
        self.vocab = DraftVocab(draft_vocab, self.mask_token_id, vocab_size) if draft_vocab is not None else None
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self._root = 0
        cfg = model.config
        n_kv = cfg.num_key_value_heads
        d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        # Context K/V rows per layer, [n_kv, capacity, D]: kept across generations, grown by doubling.
        self._rows = [(torch.zeros((n_kv, 256, d), device=self.device, dtype=self.dtype),
                       torch.zeros((n_kv, 256, d), device=self.device, dtype=self.dtype)) for _ in model.layers]
        self.static = False               # block passes over fixed shapes (compile_for)
        self.net = self.model             # the network a static pass runs: compiled by compile_for(compile=True)
        self.graphs = False               # `net` replays CUDA graphs (its outputs are overwritten by the next)
        self._blockdiag: dict[tuple[int, int], torch.Tensor] = {}     # (blocks, rows each) -> [N, N] bool
        self.reset([], None)

    def compile_for(self, capacity: int | None, compile: bool = True) -> None:
        """Block passes over static shapes for a generation of up to `capacity` context rows (None: back to
        plain passes). The context buffers grow to `capacity` once, here (a compiled graph holds their
        addresses, so they never move inside a generation); with `compile`, the network runs through
        torch.compile over those shapes ("reduce-overhead", CUDA graphs, on a GPU). Speed only: a static
        pass computes the same rows (masked columns weigh exactly 0), so proposals match a plain pass's up
        to float rounding and every strategy stays lossless."""
        if capacity is None:
            self.static = False
            return
        if capacity > self._rows[0][0].shape[1]:
            self._resize(capacity)
        if compile and self.net is self.model:
            self.graphs = self.device.type == "cuda"
            self.net = torch.compile(self.model, mode="reduce-overhead" if self.graphs else "default", dynamic=False)
            dyn = torch._dynamo.config                    # a shape per block count and capacity (see lm.py)
            dyn.recompile_limit = max(dyn.recompile_limit, 64)
        if compile:
            for k, v in self._rows:                       # inputs at fixed addresses, not copied per replay
                torch._dynamo.mark_static_address(k)
                torch._dynamo.mark_static_address(v)
        self.static = True

    # Rule: the target's embedding and head are looked up on every use, never kept: loading may swap
    # the target's modules afterwards (cpu_kernels.pack_linears replaces lm_head by a packed one), and
    # a stale reference would run the old, unpacked head (measured: 100 ms a proposal instead of 30).
    @property
    def embed(self) -> nn.Module:
        return self.target.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        head = getattr(self.target, "lm_head", None)
        return head if head is not None else self.target.get_output_embeddings()

    # ---- context cache ----

    @property
    def context_len(self) -> int:
        """T: positions 0..T-1 hold context rows (pending ones included); the next anchor sits at T."""
        return self._len + sum(h.shape[0] for h in self._pending)

    @property
    def ctx_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the context K, V [n_kv, T, D]: views of the preallocated rows (pending rows projected first)."""
        self._flush()
        return [(k[:, :self._len], v[:, :self._len]) for k, v in self._rows]

    def reset(self, context: Sequence[int], hidden: torch.Tensor | None) -> None:
        self._len = 0
        self._pending: list[torch.Tensor] = []
        self._context: list[int] = []          # the tokens of the context rows (projected, then pending)
        if self.vocab is not None:
            self.vocab.reset()
        if len(context):
            self.advance(context, hidden)

    def truncate(self, n: int) -> None:
        """Keep the first n context rows (projected or pending), drop the rest; the vocabulary's context ids
        are rebuilt from the kept tokens. Context rows depend only on their own token's target features
        and position, so the kept ones are exactly a fresh reset's."""
        if not 0 <= n <= len(self._context):
            raise ValueError(f"truncate({n}): the drafter holds {len(self._context)} context rows")
        if n <= self._len:
            self._len, self._pending = n, []
        else:
            self._pending = [torch.cat(self._pending)[: n - self._len]]
        self._context = self._context[:n]
        if self.vocab is not None:
            self.vocab.reset()
            self.vocab.add(self._context)

    def advance(self, tokens: Sequence[int], hidden: torch.Tensor | None) -> None:
        """tokens = [anchor] + accepted path; their target features join the context. Lazily: rows are
        checked here and projected at the next draft, in one pass however many blocks skipped drafting
        (budget 0 verifies the root alone, block after block)."""
        if not len(tokens):
            return
        if hidden is None:
            raise ValueError("the DFlash drafter needs the target's hidden states (target_layers) for every "
                             "committed token")
        if hidden.shape[0] != len(tokens):
            raise ValueError(f"got {hidden.shape[0]} hidden rows for {len(tokens)} tokens")
        if hidden.shape[-1] != self.model.fc.in_features:
            raise ValueError(f"hidden rows have width {hidden.shape[-1]}; the drafter's fc expects "
                             f"{self.model.fc.in_features} ({len(self.target_layer_ids)} target layers)")
        self._pending.append(hidden)
        self._context.extend(int(t) for t in tokens)
        if self.vocab is not None:
            self.vocab.add(tokens)

    def prefill(self) -> None:
        self._flush()                           # the pending context rows projected now, not at the next draft

    @torch.inference_mode()
    def _flush(self) -> None:
        """Project the pending hidden rows into context K/V rows, written in place after the first T."""
        if not self._pending:
            return
        hidden = torch.cat(self._pending).to(self.device, self.dtype)     # [n, n_ids*H_t]
        self._pending = []
        n = hidden.shape[0]
        end = self._len + n
        if end > self._rows[0][0].shape[1]:
            self._resize(max(end, 2 * self._rows[0][0].shape[1]))
        pos = torch.arange(self._len, end, device=self.device)
        for (k, v), (k1, v1) in zip(self._rows, self.model.context_kv(hidden, pos)):
            k[:, self._len:end] = k1
            v[:, self._len:end] = v1
        self._len = end

    def _resize(self, cap: int) -> None:
        """Context buffers of `cap` rows, the rows in use copied (a static pass then spans the new size)."""
        grown = []
        for k, v in self._rows:
            k2, v2 = k.new_zeros((k.shape[0], cap, k.shape[2])), v.new_zeros((v.shape[0], cap, v.shape[2]))
            k2[:, :self._len], v2[:, :self._len] = k[:, :self._len], v[:, :self._len]
            grown.append((k2, v2))
        self._rows = grown

    # ---- blocks ----

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] final-normed rows -> [N, V'] float32 logits: over the draft vocabulary when the
        checkpoint has one (column c is target id `to_target_ids(c)`), else over every target id."""
        if self.vocab is not None:
            logits = self.vocab.logits(hidden, self.lm_head) * self.output_multiplier
        else:
            logits = self.lm_head(hidden).float() * self.output_multiplier
        if self.final_logit_softcapping:
            cap = float(self.final_logit_softcapping)
            logits = torch.tanh(logits / cap) * cap
        if self.vocab is not None:
            return logits                                      # holds no mask id and no id past vocab_size
        if self.vocab_size:
            logits = logits[..., : self.vocab_size]
        if self.mask_token_id < logits.shape[-1]:
            logits = logits.clone()
            logits[..., self.mask_token_id] = float("-inf")   # a mask is never a draft
        return logits

    def to_target_ids(self, cols: torch.Tensor) -> torch.Tensor:
        """Columns of `_logits` -> target token ids (the identity without a draft vocabulary)."""
        return cols if self.vocab is None else self.vocab.to_target(cols)

    @torch.inference_mode()
    def forward_blocks(self, blocks: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Forward blocks (token lists, `mask_token_id` at masked slots; block[0] is the anchor at
        position T) in ONE pass. Each row sees the whole context and its own block (bidirectional).
        Returns per block the [len(block), V] float32 logits of every row (row 0's is unused by
        DFlash: row i >= 1 predicts the token at block position i)."""
        if self.static and blocks and len(blocks) <= STATIC_BLOCKS[-1] and len({len(b) for b in blocks}) == 1:
            return self._static_blocks(blocks)
        ctx_kv = self.ctx_kv                                    # projects rows advance() left pending
        toks, pos, seg = [], [], []
        for j, b in enumerate(blocks):
            toks.extend(int(t) for t in b)
            pos.extend(range(self._len, self._len + len(b)))
            seg.extend([j] * len(b))
        if not toks:
            return [torch.zeros((0, 0)) for _ in blocks]
        ids = torch.tensor(toks, dtype=torch.long, device=self.device)
        seg_t = torch.tensor(seg, device=self.device)
        mask = None                                                      # one block: every row sees every key
        if len(blocks) > 1:
            mask = torch.cat([torch.ones((len(toks), self._len), dtype=torch.bool, device=self.device),
                              seg_t[:, None] == seg_t[None, :]], dim=1)  # [N, T + N] block-diagonal
        embeds = self.embed(ids).to(self.dtype) * self.input_embedding_scale
        hidden = self.model(embeds, torch.tensor(pos, device=self.device), ctx_kv, mask)
        logits = self._logits(hidden.to(self.lm_head.weight.dtype))
        return list(logits.split([len(b) for b in blocks]))

    @torch.inference_mode()
    def _static_blocks(self, blocks: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """forward_blocks over static shapes: B blocks of L rows padded to b in STATIC_BLOCKS blocks (dummy
        blocks of masks that only they see), every row attending to all `capacity` context rows with those
        past T masked, and to its own block: [b L, capacity + b L] mask."""
        self._flush()                                           # the pending context rows, eagerly
        count, rows = len(blocks), len(blocks[0])
        b = next(s for s in STATIC_BLOCKS if s >= count)
        n, cap, t = b * rows, self._rows[0][0].shape[1], self._len
        toks = [int(x) for blk in blocks for x in blk] + [self.mask_token_id] * ((b - count) * rows)
        ids = torch.tensor(toks, dtype=torch.long, device=self.device)                      # [N]
        pos = torch.arange(t, t + rows, device=self.device).repeat(b)                       # [N]
        diag = self._blockdiag.get((b, rows))
        if diag is None:
            seg = torch.arange(b, device=self.device).repeat_interleave(rows)
            diag = self._blockdiag[(b, rows)] = seg[:, None] == seg[None, :]               # [N, N]
        seen = (torch.arange(cap, device=self.device) < t).expand(n, cap)                  # [N, cap]
        mask = torch.cat([seen, diag], dim=1)                                                # [N, cap + N]
        embeds = self.embed(ids).to(self.dtype) * self.input_embedding_scale
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()          # the previous replay's outputs are dead
        hidden = self.net(embeds, pos, self._rows, mask)[: count * rows]
        if self.graphs:
            hidden = hidden.clone()                             # CUDA-graph outputs are overwritten next replay
        logits = self._logits(hidden.to(self.lm_head.weight.dtype))
        return list(logits.split([rows] * count))

    def propose(self, root: int, n: int, top_k: int) -> Proposal:
        # Rule: the block is always the trained one, [root, mask x (block_size - 1)] (longer only when more
        # tokens are asked for): attention inside a block is bidirectional, so drafting fewer masks would
        # change every logit. A small budget cuts the tree, never the drafted block.
        self._root = int(root)                              # redraft() branches hang off this anchor
        if self.vocab is not None:
            self.vocab.add([root])                          # the anchor is context too
        masks = max(n, self.block_size - 1)
        rows = self.forward_blocks([[root] + [self.mask_token_id] * masks])[0][1:1 + n]    # [n, V']
        cols, logp = top_k_logprobs(rows, top_k)
        ids = self.to_target_ids(cols)
        return Proposal(tokens=ids[:, 0].tolist(), top_ids=ids, top_logprobs=logp)

    def redraft_topk(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int], top_k: int) -> list[Proposal]:
        # Branch j = [root, prefix_j..., mask x M_j], padded with masks to the trained block size (the same
        # rule as propose); its first L_j masks predict the next L_j tokens. The root is the anchor
        # propose() last used; the context has not moved since.
        live = [j for j, n in enumerate(lengths) if n > 0]
        rows: list[torch.Tensor] = [torch.zeros((0, 1)) for _ in prefixes]
        if live:
            blocks = [[self._root] + list(prefixes[j])
                      + [self.mask_token_id] * max(lengths[j], self.block_size - 1 - len(prefixes[j])) for j in live]
            for j, lg in zip(live, self.forward_blocks(blocks)):
                start = 1 + len(prefixes[j])
                rows[j] = lg[start:start + lengths[j]]
        return proposals(rows, top_k, self.to_target_ids)

    def redraft(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
        return [p.tokens for p in self.redraft_topk(prefixes, lengths, 1)]


# --------------------------------------------------------------------------------------------
# Loading the published checkpoint layout: config.json + model.safetensors (or shards)
# --------------------------------------------------------------------------------------------

def read_config(path: str | Path) -> dict:
    f = Path(path) / "config.json"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read DFlash config {f}: {e}") from None
    except RecursionError:
        raise ModelLoadError(f"cannot read DFlash config {f}: JSON nested too deeply") from None


def read_dflash_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({str(v) for v in weight_map.values()})
        except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"cannot read DFlash weight index {index}: {type(e).__name__}: {e}") from None
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise ModelLoadError(f"no model.safetensors in {path}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            state.update(load_file(str(path / name)))
        except (SafetensorError, OSError, ValueError) as e:   # truncated file, bad header, missing shard
            raise ModelLoadError(f"cannot read DFlash weights {path / name}: {e}") from None
    # Some exports prefix the drafter's own weights with "model."; the published one does not.
    return {(k[len("model."):] if k.startswith("model.") else k): v for k, v in state.items()}


def check_dflash_config(raw: dict) -> None:
    """Types and ranges of the DFlash fields load_dflash reads, each failure one ModelLoadError.

    Rule: counts and ids are JSON integers (never bools, strings or floats: "01" must not become [0, 1]),
    target_layer_ids a non-empty list of them, layer_types one entry per draft layer.
    """
    def integer(name: str, value, lo: int) -> None:
        if type(value) is not int or value < lo:
            raise ModelLoadError(f"DFlash {name} must be an integer >= {lo}, got {value!r}"[:200])

    def number(name: str, value) -> None:
        if type(value) not in (int, float):
            raise ModelLoadError(f"DFlash {name} must be a number, got {value!r}"[:200])

    n_layers = raw.get("num_hidden_layers")
    integer("num_hidden_layers", n_layers, 1)
    layer_types = raw.get("layer_types")
    if layer_types is not None and (type(layer_types) is not list or len(layer_types) != n_layers
                                    or not all(type(t) is str for t in layer_types)):
        raise ModelLoadError(f"DFlash layer_types must list one attention type per draft layer "
                             f"({n_layers}), got {layer_types!r}"[:200])
    ids = dflash_config_get(raw, "target_layer_ids")
    if ids is not None:
        if type(ids) is not list or not ids:
            raise ModelLoadError(f"DFlash target_layer_ids must be a non-empty list of layer numbers, "
                                 f"got {ids!r}"[:200])
        for i in ids:
            integer("target_layer_ids entry", i, 0)
    mask_id = dflash_config_get(raw, "mask_token_id")
    if mask_id is not None:
        integer("mask_token_id", mask_id, 0)
    for name, lo in (("block_size", 2), ("num_target_layers", 1), ("target_hidden_size", 1)):
        if dflash_config_get(raw, name) is not None:
            integer(name, dflash_config_get(raw, name), lo)
    for name in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"):
        if dflash_config_get(raw, name) is not None:
            number(name, dflash_config_get(raw, name))


def load_dflash_model(path: str | Path, target_model: nn.Module,
                      dtype: torch.dtype | None = None) -> tuple[DFlashModel, torch.Tensor | None]:
    """A DFlash checkpoint folder, checked against the loaded target -> (its network on the target's
    device, in `dtype` (default: the target's), its draft vocabulary or None). models.build_pair makes
    the drafter."""
    from transformers import Qwen3Config
    path = Path(path)
    raw = read_config(path)
    if not is_dflash_config(raw):
        raise ModelLoadError(f"{path} is not a DFlash checkpoint (no DFlash architecture, no dflash_config)")
    check_dflash_config(raw)
    try:
        config = Qwen3Config.from_dict(raw)
    except Exception as e:  # noqa: BLE001 - transformers validates with several exception types
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"{path}: the DFlash config is not a valid Qwen3 config ({reason.strip()})") from None
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or dflash_config_get(raw, "causal"):
        raise ModelLoadError("this DFlash checkpoint uses sliding-window or causal draft layers, which are not "
                             "supported (only the non-causal full-attention DFlash layout is)")
    tcfg = target_model.config
    n_target = int(getattr(tcfg, "num_hidden_layers"))
    ids = dflash_config_get(raw, "target_layer_ids")
    if ids is None:
        ids = default_target_layer_ids(int(dflash_config_get(raw, "num_target_layers", n_target)), config.num_hidden_layers)
    ids = list(ids)
    mask_id = dflash_config_get(raw, "mask_token_id")
    if mask_id is None:
        raise ModelLoadError("the DFlash config names no mask_token_id (dflash_config.mask_token_id)")
    if max(ids) >= n_target:
        raise ModelLoadError(f"DFlash target_layer_ids {ids} do not fit the target's {n_target} decoder layers")
    th = int(dflash_config_get(raw, "target_hidden_size", tcfg.hidden_size))
    if th != tcfg.hidden_size:
        raise ModelLoadError(f"the DFlash drafter expects a target hidden size of {th}; the target has "
                             f"{tcfg.hidden_size}")
    emb = target_model.get_input_embeddings()
    if emb.weight.shape[1] != config.hidden_size:
        raise ModelLoadError(f"the DFlash drafter's hidden size {config.hidden_size} differs from the target's "
                             f"embedding width {emb.weight.shape[1]} (it embeds with the target's table)")
    if int(mask_id) >= emb.weight.shape[0]:
        raise ModelLoadError(f"DFlash mask_token_id {mask_id} is outside the target's embedding table "
                             f"({emb.weight.shape[0]} rows)")

    model = DFlashModel(config, len(ids), tcfg.hidden_size)
    state = read_dflash_weights(path)
    for k in [k for k in state if k.startswith(("embed_tokens.", "lm_head."))]:
        del state[k]                              # the target's embedding/lm_head are used instead
    draft_vocab = state.pop("draft_vocab", None)  # optional: frequency-ranked ids (DraftVocab)
    if draft_vocab is not None and (draft_vocab.dim() != 1 or draft_vocab.is_floating_point()):
        raise ModelLoadError(f"DFlash draft_vocab must be a 1-D integer tensor, got {draft_vocab.dtype} "
                             f"{tuple(draft_vocab.shape)}")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ModelLoadError(f"DFlash checkpoint {path} does not match the DFlash layout: "
                             f"missing {missing[:4]}{'...' if len(missing) > 4 else ''}, "
                             f"unexpected {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}")
    bad = [k for k, v in state.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if bad:
        k = bad[0]
        raise ModelLoadError(f"DFlash weight {k} has shape {tuple(state[k].shape)}, expected "
                             f"{tuple(expected[k].shape)} (config/target mismatch)")
    model.load_state_dict(state, strict=True)
    p = emb.weight
    model = model.to(device=p.device, dtype=dtype or p.dtype).eval()
    model.rotary_emb.float()                      # RoPE frequencies stay float32, as in HF loading
    return model, None if draft_vocab is None else draft_vocab.long()


def drafter_from_model(model: DFlashModel, target: nn.Module, vocab_size: int | None = None,
                       draft_vocab: torch.Tensor | None = None) -> DFlashDrafter:
    """A DFlashDrafter over a built network; its config (a loaded checkpoint's, or training's) names the
    target layers, the mask token and the block size."""
    raw = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(model.config)
    ids = dflash_config_get(raw, "target_layer_ids")
    if ids is None:
        ids = default_target_layer_ids(int(dflash_config_get(raw, "num_target_layers", target.config.num_hidden_layers)),
                                       len(model.layers))
    return DFlashDrafter(model, target, target_layer_ids=[int(i) for i in ids],
                         mask_token_id=int(dflash_config_get(raw, "mask_token_id")),
                         block_size=int(dflash_config_get(raw, "block_size", DEFAULT_BLOCK_SIZE)), vocab_size=vocab_size,
                         input_embedding_scale=float(dflash_config_get(raw, "input_embedding_scale", 1.0)),
                         output_multiplier=float(dflash_config_get(raw, "output_multiplier", 1.0)),
                         final_logit_softcapping=dflash_config_get(raw, "final_logit_softcapping"), draft_vocab=draft_vocab)


def load_dflash(path: str | Path, target_model: nn.Module, vocab_size: int | None = None) -> DFlashDrafter:
    """A DFlash checkpoint folder + the loaded target -> DFlashDrafter on the target's device/dtype."""
    model, draft_vocab = load_dflash_model(path, target_model)
    return drafter_from_model(model, target_model, vocab_size=vocab_size, draft_vocab=draft_vocab)
