"""KV compaction: after keeping only the accepted nodes, the cache is as if freshly computed."""
import pytest
import torch

from cure_core.lm import PAD_SIZES, CachedLM, padded_size
from cure_core.tree import DraftTree

LAYOUTS = [dict(kv="dynamic"), dict(kv="static"), dict(kv="static", static_shapes=True)]
LAYOUT_IDS = ["dynamic", "static", "static-shapes"]


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_compaction_equals_fresh_forward(target, layout):
    torch.manual_seed(0)
    ctx = torch.randint(0, 256, (20,)).tolist()
    lm = CachedLM(target, **layout)
    lm.prefill(ctx[:-1])
    tree = DraftTree()
    tree.add_path([5, 6, 7, 8], branch=0)
    tree.add_path([5, 9, 10], branch=1)
    tree.add_path([11, 12, 13, 14, 15], branch=2)
    fwd = lm.forward([ctx[-1]] + tree.tokens, [-1] + [p + 1 for p in tree.parents])
    keep = tree.add_path([5, 9, 10], branch=1)               # existing nodes: the winning path
    lm.commit([0] + [i + 1 for i in keep])
    committed = ctx + [5, 9, 10]
    assert lm.committed == len(committed)
    nxt = lm.forward([42], [-1]).logits[0]
    with torch.no_grad():
        fresh = target(torch.tensor([committed + [42]])).logits[0, -1]
    assert torch.allclose(nxt, fresh, atol=1e-5)
    # the tree forward's logits at each node equal the fresh forward over that node's path
    with torch.no_grad():
        full = target(torch.tensor([ctx + [11, 12, 13, 14, 15]])).logits[0]
    node15 = tree.add_path([11, 12, 13, 14, 15], branch=2)[-1]
    assert torch.allclose(fwd.logits[node15 + 1], full[-1], atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_rollback_restores_the_committed_prefix(target, layout):
    lm = CachedLM(target, **layout)
    lm.prefill([1, 2, 3])
    before = lm.forward([4], [-1]).logits[0]
    lm.rollback()
    lm.forward([9, 9, 9], [-1, 0, 1])
    lm.rollback()
    after = lm.forward([4], [-1]).logits[0]
    assert torch.allclose(before, after, atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_static_cache_matches_dynamic_over_many_blocks(target, layout):
    """Random trees and commits, block after block: the static layouts give the dynamic cache's
    logits (the static buffers are also reused across a reset)."""
    gen = torch.Generator().manual_seed(3)
    dyn, sta = CachedLM(target), CachedLM(target, **layout)
    for round_ in range(2):
        ctx = torch.randint(0, 256, (9 + round_,), generator=gen).tolist()
        for lm in (dyn, sta):
            lm.reset(capacity=128)
            lm.prefill(ctx)
        for _ in range(6):
            n = int(torch.randint(1, 12, (1,), generator=gen))
            toks = torch.randint(0, 256, (n,), generator=gen).tolist()
            parents = [-1] + [int(torch.randint(-1, j, (1,), generator=gen)) for j in range(n - 1)]
            a, b = dyn.forward(toks, parents), sta.forward(toks, parents)
            assert torch.allclose(a.logits, b.logits, atol=1e-5)
            leaf = int(torch.randint(0, n, (1,), generator=gen))
            chain = [leaf]
            while parents[chain[-1]] >= 0:
                chain.append(parents[chain[-1]])
            for lm in (dyn, sta):
                lm.commit(chain[::-1])
        assert dyn.committed == sta.committed


def test_static_cache_grows_but_static_shapes_refuse_to_overflow(target):
    """Plain static rows double when full (the drafters' caches); compiled static shapes cannot move
    their buffers, so they refuse. The grown cache still gives the fresh forward's logits."""
    lm = CachedLM(target, kv="static", capacity=8, static_shapes=True)
    lm.prefill([1, 2, 3, 4, 5])
    with pytest.raises(RuntimeError, match="capacity"):
        lm.forward([1, 2, 3, 4], [-1, 0, 1, 2])
    lm = CachedLM(target, kv="static", capacity=8)
    ctx = list(range(1, 30))
    lm.prefill(ctx[:6])
    lm.forward([7, 9, 8], [-1, 0, 0])
    lm.commit([0])                                            # keep 7 (scratch rows then grow past 8)
    for t in ctx[7:]:
        lm.prefill([t])
    assert lm.capacity >= 29 and lm.committed == 29
    nxt = lm.forward([42], [-1]).logits[0]
    with torch.no_grad():
        fresh = target(torch.tensor([ctx + [42]])).logits[0, -1]
    assert torch.allclose(nxt, fresh, atol=1e-5)


def test_padded_sizes():
    assert [padded_size(n) for n in (1, 3, 16, 17, 64, 65, 129)] == [1, 4, 16, 24, 64, 96, 256]


def test_compiled_forwards_keep_graph_safe_buffers_and_run_prefills_eagerly(target):
    """--compile rules that a GPU depends on (CUDA graphs cannot be exercised on this CPU):
    the K/V buffers exist before the first forward (allocated inside a graph they would live in its
    pool), only tree-sized forwards (<= the largest padded size) go through the compiled function,
    and dynamo may compile every padded size instead of falling back to eager after 8."""
    lm = CachedLM(target, kv="static", compile=True, capacity=512)
    heads, head_dim = target.config.num_key_value_heads, target.config.head_dim
    for layer in lm.cache.layers:
        assert layer.is_initialized and tuple(layer.keys.shape) == (1, heads, 512, head_dim)
    assert torch._dynamo.config.recompile_limit >= 2 * len(PAD_SIZES)
    compiled_calls = []
    compiled = lm.run
    lm.run = lambda **kw: compiled_calls.append(kw["input_ids"].shape[1]) or target(**kw)
    torch.manual_seed(0)
    ctx = torch.randint(0, 256, (200,)).tolist()
    lm.prefill(ctx)                                          # 200 nodes: eager, into the same buffers
    assert compiled_calls == []
    fwd = lm.forward([7, 8, 9], [-1, 0, 0])                 # a tree: compiled, padded to 4 nodes
    assert compiled_calls == [padded_size(3)]
    with torch.no_grad():
        fresh = target(torch.tensor([ctx + [7, 8]])).logits[0, -1]
    assert torch.allclose(fwd.logits[1], fresh, atol=1e-4)
    lm.run = compiled


def test_scratch_ancestors_over_forwards_growth_commits_and_a_refused_forward(target):
    """The scratch ancestor rows live in a buffer reused across forwards and blocks: after every forward
    (several per block, the buffer growing past its first 64 rows), commit, rollback and a forward the
    cache refuses, they equal the brute-force ancestors of the parents given, and the buffer is False
    everywhere else (fill_ancestors writes new rows into False ones)."""
    gen = torch.Generator().manual_seed(5)
    lm = CachedLM(target, kv="static", capacity=256, static_shapes=True)

    def check(parents):
        s = len(parents)
        want = torch.zeros((s, s), dtype=torch.bool)
        for i in range(s):
            j = i
            while j >= 0:
                want[i, j] = True
                j = parents[j]
        assert lm.scratch == s and torch.equal(torch.from_numpy(lm.scratch_anc.copy()), want)
        rest = lm._anc.copy()
        rest[:s, :s] = False
        assert not rest.any()
        # the depths the positions come from agree with the parents
        assert lm.scratch_depth == [1 if p < 0 else lm.scratch_depth[p] + 1 for p in parents]

    lm.prefill([1, 2, 3])
    for block in range(3):
        parents: list[int] = []
        for _ in range(4):                                     # 4 forwards, 5-24 nodes each: > 64 scratch rows
            n = int(torch.randint(5, 25, (1,), generator=gen))
            new = [int(torch.randint(-1, len(parents) + j, (1,), generator=gen)) for j in range(n)]
            lm.forward(torch.randint(0, 256, (n,), generator=gen).tolist(), new)
            parents += new
            check(parents)
        leaf, chain = len(parents) - 1, []
        while leaf >= 0:
            chain.append(leaf)
            leaf = parents[leaf]
        lm.commit(chain[::-1]) if block < 2 else lm.rollback()
        check([])
    lm.forward([7, 8], [-1, 0])
    with pytest.raises(RuntimeError, match="capacity"):
        lm.forward([9] * 200, [-1] + list(range(2, 201)))      # past the static capacity: refused
    check([-1, 0])


@pytest.mark.parametrize("layout", ["static", "dynamic"])
def test_prefill_runs_the_head_over_one_row_and_changes_nothing_after(target, layout):
    """A prefill returns no logits and runs the output head over one row, not every prompt row (the
    [rows, vocab] matmul is the part of a prefill nothing reads); the cache it leaves is the same, so the
    next forward's logits equal those after a prefill through forward() with every row's logits."""
    ids = [(7 * i + 3) % 200 for i in range(40)]
    rows_seen = []
    hook = target.get_output_embeddings().register_forward_hook(lambda m, args, out: rows_seen.append(args[0].shape[-2]))
    try:
        lm = CachedLM(target, kv=layout)
        pre = lm.prefill(ids)
        assert pre.logits is None and rows_seen == [1]
        ref = CachedLM(target, kv=layout)
        full = ref.forward(ids, [-1] + list(range(len(ids) - 1)))
        assert full.logits.shape[0] == len(ids) and rows_seen[-1] == len(ids)
        ref.commit(full.nodes)
        assert torch.equal(lm.forward([5, 6, 7], [-1, 0, 1]).logits, ref.forward([5, 6, 7], [-1, 0, 1]).logits)
    finally:
        hook.remove()
