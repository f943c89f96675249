"""benchmarks/tree_shapes.py: offline replay of tree shapes on recorded blocks (tiny models)."""
from conftest import benchmark_script


def test_replay_reproduces_the_engine_and_orders_the_shapes(tmp_path):
    with benchmark_script("tree_shapes") as mod:
        rep = mod.main(["--tiny", "--max-new-tokens", "24", "--budgets", "1,2,4,8,64",
                        "--json", str(tmp_path / "shapes.json")])
    n = rep["blocks"]
    assert n > 10
    # The replay is exact: the recorded ddtree rebuilt from its proposal accepts what the engine
    # accepted, and branch 0 whole accepts the engine's a(pi_0), on every block.
    assert rep["replay_matches_engine"] == n and rep["chain_matches_branch0"] == n
    acc = rep["accepted"]
    assert set(acc) == {"chain", "best-first", "gated-1@1", "gated-2@1", "gated-8@2"}
    assert len({a[0] for a in acc.values()}) == 1                             # one node: y_1 for all
    for name in acc:                                                          # nested shapes: a(V) grows
        assert acc[name] == sorted(acc[name])
    for j in range(len(rep["budgets"])):
        assert acc["chain"][j] <= acc["best-first"][j] + 1e-9                 # on these blocks, here
        assert acc["gated-1@1"][j] <= acc["gated-8@2"][j] + 1e-9 <= acc["best-first"][j] + 2e-9
    assert acc["best-first"][-1] > acc["chain"][-1]                           # alternatives really won
    assert (tmp_path / "shapes.json").exists()


def test_accept_walks_the_known_truth_and_flags_censoring():
    from cure_core.tree import DraftTree
    tree = DraftTree()
    tree.add_path([5, 6, 7], branch=0)
    tree.add_path([5, 9], branch=1)
    with benchmark_script("tree_shapes") as mod:
        assert mod.accept(tree, (5, 9)) == (2, False)        # the repair path, to its leaf
        assert mod.accept(tree, (5, 6)) == (2, True)         # node 6 has a child past the known truth
        assert mod.accept(tree, (4,)) == (0, False)
