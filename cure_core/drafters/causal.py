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

from ..cpu_kernels import is_int8
from ..lm import CachedLM, Forward
from ..tree import DraftTree, argmax
from .base import ChainSubstitutions, Drafter, Proposal, RedraftPolicy, proposals, top_k_logprobs
from .vocab import DraftVocab


class _CausalDrafter(Drafter):
    name = "causal"
    block_size: int | None = None       # an AR drafter drafts chains of any length

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
        self.context: list[int] = []    # every token given by reset + advance: the cache's rows, then pending
        self._int8_layers: bool | None = None   # the model's layers are Int8Linear (ArDrafter.redraft_policy)

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
        self.context = list(context)
        self.root_fed = False
        if self.vocab is not None:
            self.vocab.reset()
            self.vocab.add(context)

    def truncate(self, n: int) -> None:
        """Keep the first n context tokens: cached rows cropped, pending tokens cut; the vocabulary's context
        ids rebuilt from what is kept (as reset would have added them)."""
        if not 0 <= n <= len(self.context):
            raise ValueError(f"truncate({n}): the drafter holds {len(self.context)} context tokens")
        held = self.lm.committed
        if n <= held:
            self.lm.truncate(n)
            self.pending = []
        else:
            self.pending = self.pending[: n - held]
        self.context = self.context[:n]
        self.root_fed = False
        if self.vocab is not None:
            self.vocab.reset()
            self.vocab.add(self.context)

    def advance(self, tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        # tokens[0] is the root: in the cache if propose() ran this block (a block can skip drafting:
        # budget 0, or no room left); everything not in the cache is fed at the front of the next pass.
        self.pending = list(tokens[1:]) if self.root_fed else self.pending + list(tokens)
        self.context.extend(int(t) for t in tokens)
        self.root_fed = False
        if self.vocab is not None:
            self.vocab.add(tokens)

    def prefill(self) -> None:
        # the pending tokens (the prompt, at step 0) committed as one chain; the root comes with the next pass
        if self.pending:
            self.lm.prefill(self.pending)
            self.pending = []

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
    sequential = True                   # one forward per drafted token: drafting cost grows with the budget
    redrafts_while_drafting = True      # propose_with_redrafts: substitutions re-drafted in the chain's steps
    # Its re-drafts are its own chains (in distribution): used alone, not blended; 3 of them make 4 rows a
    # step, what packed kernels cost as one.
    PACKED_REDRAFTS = RedraftPolicy(count=3, weight=1.0)
    # Under int8 steps (Int8Linear layers: fbgemm's int8 matmul) a row is no longer free (4 rows cost ~1.3x
    # one), so the chain re-drafts nothing: its tree's width is the chain's own alternatives.
    INT8_REDRAFTS = RedraftPolicy(count=0, weight=1.0)

    @property
    def redraft_policy(self) -> RedraftPolicy:
        """Rule: none where this drafter's layers run int8 matmuls, whichever forward runs them (Int8Decoder or
        transformers'), 3 where they run packed (or eager) ones. Decided on first use: load_pair packs a
        drafter's layers after building it."""
        if self._int8_layers is None:
            self._int8_layers = is_int8(self.model)
        return self.INT8_REDRAFTS if self._int8_layers else self.PACKED_REDRAFTS

    def propose(self, root: int, n: int, top_k: int) -> Proposal:
        return self.propose_with_redrafts(root, n, top_k, 0)

    def propose_with_redrafts(self, root: int, n: int, top_k: int, count: int,
                              stop_logp: float | None = None) -> Proposal:
        """The chain y_1..y_n, one step per token, and under each of its `count` best substitutions
        (base.chain_substitutions) the rest of the block re-drafted greedily, as batched rows of the
        same steps: the substitute at depth d is fed beside y_d, with y_{d-1} as its parent. The
        substitutions are chosen as the rows come (a causal drafter cannot wait for the whole chain);
        one pushed out by a better one later is dropped. A step of 1 + count rows costs about one row
        on packed kernels, so re-drafting adds no sequential step (redraft_topk adds up to n - 1).
        `stop_logp`: draft no further once the chain's joint draft log-prob falls below it (fewer than n
        positions; the re-drafts end at the same depth)."""
        first = self._feed_root(root, [])[-1]                   # [C] after the root
        cols, lp = top_k_logprobs(first[None], top_k)           # [1, k]
        cols = self._ids(cols)
        steps_ids, steps_lp = [cols], [lp]                      # per step [1 + live, k]; row 0: the chain's
        head = (cols[0, : count + 1].tolist(), lp[0, : count + 1].tolist())   # the newest chain row, on the host
        tokens = [head[0][0]]
        subs = ChainSubstitutions(count, n)
        chain_rows, at = [0], 1                                 # the chain's rows in the steps' rows; rows so far
        nodes: list[int] = []                                   # the chain's scratch node at depth 1..
        live: dict[tuple[int, ...], list] = {}                  # substitution -> [its last node, its tokens, its rows]
        entries: list[list] = []                                # live's values, in its order
        feed: list[int] = []                                    # the token each re-draft row feeds next
        for d in range(1, n):                                   # feed depth d, draft row d (depth d + 1)
            changed = subs.add(*head)                           # row d - 1
            if stop_logp is not None and subs.joint < stop_logp:
                break
            if changed:
                # a substitution new in the set has len(p) == d: its substitute enters now, under the chain's
                # node at depth d - 1; older ones feed their last row's top-1
                live = {p: live.get(p) or [nodes[-1] if len(p) > 1 else -1, [], []] for p in subs.best()}
                entries = list(live.values())
                feed = [ts[-1] if ts else p[-1] for p, (_, ts, _) in live.items()]
            fwd = self.lm.forward([tokens[-1]] + feed, [nodes[-1] if nodes else -1] + [e[0] for e in entries])
            nodes.append(fwd.nodes[0])
            cols, lp = top_k_logprobs(self._scores(fwd, slice(None)), top_k)   # [1 + len(live), k]
            cols = self._ids(cols)
            steps_ids.append(cols)
            steps_lp.append(lp)
            best = cols[:, : count + 1].tolist()                # [1 + len(live), count + 1] on the host
            head = (best[0], lp[0, : count + 1].tolist())
            tokens.append(best[0][0])
            chain_rows.append(at)
            for i, entry in enumerate(entries, start=1):
                entry[0] = fwd.nodes[i]
                entry[1].append(best[i][0])
                entry[2].append(at + i)
                feed[i - 1] = best[i][0]
            at += 1 + len(entries)
        self.lm.rollback()
        if not live:                                            # the chain's rows only, in order
            return Proposal(tokens=tokens, top_ids=torch.cat(steps_ids), top_logprobs=torch.cat(steps_lp))
        # Every row in chain-then-re-draft order, gathered once: [rows, k] each, split per proposal. The last
        # step's set is the final one, best first (rows 0 .. n-2 were all drafted), each re-draft complete.
        order = torch.tensor(chain_rows + [i for _, _, rows in entries for i in rows])
        sizes = [len(chain_rows)] + [len(rows) for _, _, rows in entries]
        ids = torch.cat(steps_ids).index_select(0, order).split(sizes)
        lps = torch.cat(steps_lp).index_select(0, order).split(sizes)
        redrafts = {p: Proposal(tokens=ts, top_ids=i, top_logprobs=l)
                    for (p, (_, ts, _)), i, l in zip(live.items(), ids[1:], lps[1:])}
        return Proposal(tokens=tokens, top_ids=ids[0], top_logprobs=lps[0], redrafts=redrafts)

    def redraft_topk(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int], top_k: int) -> list[Proposal]:
        # Every prefix in one pass (a trie), then one batched step per suffix token, greedy on each branch.
        if not prefixes:
            return []
        tree = DraftTree()
        ends = [tree.add_path(p, branch=j)[-1] for j, p in enumerate(prefixes)]
        fwd = self.lm.forward(tree.tokens, tree.parents)
        rows = self._scores(fwd, ends)                          # [B, C] after each prefix
        last = [fwd.nodes[e] for e in ends]
        out: list[list[torch.Tensor]] = [[] for _ in prefixes]
        for step in range(max(lengths, default=0)):
            live = [j for j in range(len(prefixes)) if lengths[j] > step]
            for j in live:
                out[j].append(rows[j])
            if step + 1 == max(lengths):
                break
            toks = [int(self._ids(argmax(rows[j]))) for j in live]
            fwd = self.lm.forward(toks, [last[j] for j in live])
            new_rows = self._scores(fwd, slice(None))
            rows = rows.clone()
            for i, j in enumerate(live):
                rows[j] = new_rows[i]
                last[j] = fwd.nodes[i]
        self.lm.rollback()
        width = rows.new_zeros((0, rows.shape[-1]))
        return proposals([torch.stack(r) if r else width for r in out], top_k, self._ids)

    def redraft(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
        return [p.tokens for p in self.redraft_topk(prefixes, lengths, 1)]


class PardDrafter(_CausalDrafter):
    name = "pard"

    def __init__(self, model, mask_token_id: int, vocab_size: int | None = None,
                 draft_vocab: torch.Tensor | None = None, block_size: int | None = None):
        super().__init__(model, vocab_size, draft_vocab, mask_token_id)   # a vocabulary never holds the mask
        self.mask_token_id = int(mask_token_id)
        self.block_size = block_size        # the K it was trained with, when its config records one

    def chain(self) -> "ArDrafter":
        """The same model as an autoregressive chain drafter (sd), with the same draft vocabulary: a PARD
        checkpoint is a causal LM. Its own KV cache; the weights are shared, not copied."""
        fixed = torch.tensor(self.vocab.fixed, dtype=torch.long) if self.vocab is not None else None
        return ArDrafter(self.model, vocab_size=self.vocab_size, draft_vocab=fixed)

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

    def redraft_topk(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int], top_k: int) -> list[Proposal]:
        # One batched pass over the trie of [prefix_j, mask x (L_j - 1)]: the substituted token and the
        # masks after it predict branch j's next L_j tokens. (Causal: more masks would change nothing.)
        tree = DraftTree()
        spans = []
        for j, (p, n) in enumerate(zip(prefixes, lengths)):
            nodes = tree.add_path(list(p) + [self.mask_token_id] * max(n - 1, 0), branch=j)
            spans.append(nodes[len(p) - 1: len(p) - 1 + n] if n > 0 else [])
        if len(tree) == 0:
            return proposals([torch.zeros((0, 1)) for _ in prefixes], top_k)
        fwd = self.lm.forward(tree.tokens, tree.parents)
        self.lm.rollback()
        scores = self._scores(fwd, [i for span in spans for i in span])           # [sum L_j, C]
        return proposals(list(scores.split([len(span) for span in spans])), top_k, self._ids)

    def redraft(self, prefixes: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[list[int]]:
        return [p.tokens for p in self.redraft_topk(prefixes, lengths, 1)]
