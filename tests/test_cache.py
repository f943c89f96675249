"""KV compaction: after keeping only the accepted nodes, the cache is as if freshly computed."""
import torch

from cure_core.lm import CachedLM
from cure_core.tree import DraftTree


def test_compaction_equals_fresh_forward(target):
    torch.manual_seed(0)
    ctx = torch.randint(0, 256, (20,)).tolist()
    lm = CachedLM(target)
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


def test_rollback_restores_the_committed_prefix(target):
    lm = CachedLM(target)
    lm.prefill([1, 2, 3])
    before = lm.forward([4], [-1]).logits[0]
    lm.rollback()
    lm.forward([9, 9, 9], [-1, 0, 1])
    lm.rollback()
    after = lm.forward([4], [-1]).logits[0]
    assert torch.allclose(before, after, atol=1e-6)
