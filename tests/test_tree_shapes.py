"""benchmarks/tree_shapes.py: exact offline replay of tree shapes on recorded blocks (tiny models)."""
from conftest import benchmark_script


def test_replay_is_exact_and_orders_the_shapes(tmp_path):
    with benchmark_script("tree_shapes") as mod:
        rep = mod.main(["--tiny", "--max-new-tokens", "24", "--budgets", "1,2,4,8,16,64", "--redrafts", "1,4",
                        "--check", "--threads", "1", "--json", str(tmp_path / "shapes.json")])
    n = rep["blocks"]
    assert n > 10
    # Exact: the chain rebuilt from a recorded proposal accepts what the engine accepted, and every replayed
    # tree (re-drafts answered from the recording) equals the tree built with the live drafter.
    assert rep["replay_matches_engine"] == n
    assert rep["check"]["trees"] == n * 5 * 6 and rep["check"]["differ"] == 0
    acc = rep["accepted"]
    assert set(acc) == {"chain", "ddtree", "cure-paper", "cure-best-first-r1", "cure-best-first-r4"}
    assert len({a[0] for a in acc.values()}) == 1                              # one node: y_1 for all
    for j in range(len(rep["budgets"])):
        assert acc["chain"][j] <= acc["ddtree"][j] + 1e-9
    for name in ("chain", "ddtree"):                                           # nested shapes: a(V) grows
        assert acc[name] == sorted(acc[name])
    assert acc["cure-best-first-r4"][0] == acc["ddtree"][0]                    # one node: no substitution below
    # positions drafted a block: the budget's (a block-parallel drafter never stops), one at budget 1
    assert all(d[0] == 1 and d == sorted(d) for d in rep["drafted"].values())
    assert (tmp_path / "shapes.json").exists()


def test_accept_walks_the_known_truth_and_flags_censoring():
    from cure_core.tree import DraftTree
    tree = DraftTree()
    tree.add_path([5, 6, 7], branch=0)
    tree.add_path([5, 9], branch=1)
    with benchmark_script("tree_shapes") as mod:
        assert mod.accept(tree, (5, 9), complete=True) == (2, False)       # the repair path, to its leaf
        assert mod.accept(tree, (5, 6), complete=False) == (2, True)      # node 6 has a child past the output's end
        assert mod.accept(tree, (5, 6), complete=True) == (2, False)      # known truth: 7 was simply not next
        assert mod.accept(tree, (4,), complete=True) == (0, False)


def test_short_blocks_record_what_a_block_of_v_masks_would_propose():
    """--short-blocks (#13 item 2): for every V below the block, the proposal of [root, mask x V], recorded
    beside the full block's; replayed only by the -short shapes; nothing for a drafter without a block forward."""
    import torch
    from cure_core.config import DecodeConfig
    from cure_core.drafters.base import Proposal

    class BlockDrafter:                                 # logits depend on the block's length, as DFlash's do
        mask_token_id = 99

        def __init__(self):
            self.blocks = []

        def forward_blocks(self, blocks):
            self.blocks += blocks
            return [torch.arange(12, dtype=torch.float32).repeat(len(b), 1) * len(b) for b in blocks]

        def to_target_ids(self, cols):
            return cols

    with benchmark_script("tree_shapes") as mod:
        inner = BlockDrafter()
        rec = mod.Recorder(inner, [mod.Shape("chain")], [3, 5, 8], DecodeConfig(k=8), short=True)
        got = rec.short_blocks(7, 7)
        assert sorted(got) == [3, 5] and inner.blocks == [[7] + [99] * 3, [7] + [99] * 5]
        assert got[3].top_ids.shape == (3, 8) and got[3].top_logprobs[0, 0] > got[3].top_logprobs[0, 1]
        assert mod.Recorder(object(), [], [3], DecodeConfig(k=8), short=True).short_blocks(7, 7) == {}
        full = Proposal([1] * 7, torch.zeros(7, 8, dtype=torch.long), torch.zeros(7, 8))
        r = mod.Recorded(full, {}, (1,) * 7, True, 0, 7, "x", got)
        assert mod.proposal_for(mod.Shape("chain-short", short=True), r, 3) is got[3]
        assert mod.proposal_for(mod.Shape("chain"), r, 3) is full
        assert mod.proposal_for(mod.Shape("chain-short", short=True), r, 8) is full


def test_draft_stop_replay_builds_the_engines_tree():
    """--draft-stop: the cure-best-first-stopP shape, replayed from a full-depth proposal, is the tree the
    engine builds when an AR chain drafter stops drafting below P (propose with stop_logp, its re-drafts
    made in the chain's own steps), at budgets below, at and above the rows it drafts."""
    import math

    import torch
    from cure_core.config import DecodeConfig
    from cure_core.drafters.causal import ArDrafter
    from cure_core.strategies import build_tree, propose
    from cure_core.tiny import perturbed_copy, tiny_target

    torch.manual_seed(0)
    target = tiny_target(seed=3, logit_scale=40.0)
    draft = perturbed_copy(target, noise=0.3, seed=4).eval()
    context, root, n = [5, 17, 42, 9, 77, 3], 11, 7
    probe = ArDrafter(draft, vocab_size=target.config.vocab_size)
    probe.reset(context)
    full = probe.propose(root, n, 64)
    cum = full.top_logprobs[:, 0].cumsum(0)
    assert cum[-1] < cum[0]                             # the chain gets less likely: the stop bites somewhere
    seen = set()
    with benchmark_script("tree_shapes") as mod:
        for rows in range(1, n):                        # a stop just below each row's joint prob
            stop = math.exp(float(cum[rows - 1])) * 1.0001
            if stop >= 1.0 or float(cum[rows - 1]) == float(cum[rows - 2] if rows > 1 else 0.0):
                continue
            assert mod.stop_rows(full, n, stop) == rows
            for v in (2, 5, 12, 24):
                # as the engine's block config: budgets below the block draft (and keep) v positions
                cfg = DecodeConfig(strategy="cure", cure_tree="best-first", k=min(v, n) + 1, v_max=v, lookup=0)
                live = ArDrafter(draft, vocab_size=target.config.vocab_size)
                live.reset(context)
                p = propose(cfg, live, root, min(v, n), math.log(stop))
                engine = build_tree(cfg, p, live).tree
                replayed = mod.shape_tree(mod.Shape("s", 3, stop=stop), cfg.with_(lookup=0), full, v, probe)
                assert (replayed.tokens, replayed.parents) == (engine.tokens, engine.parents), (rows, v)
                # the replay's drafted positions (its report's `drafted`) are the engine's sequential steps
                assert mod.shape_rows(mod.Shape("s", 3, stop=stop), full, v, probe) == len(p.tokens)
                seen.add(max(engine.depths) if len(engine) else 0)
    assert len(seen) >= 3                               # trees of several depths were compared


def test_a_bad_draft_stop_is_a_usage_error():
    import pytest
    with benchmark_script("tree_shapes") as mod:
        for bad in ("abc", "1.5", "0", "0.2@x"):
            with pytest.raises(SystemExit) as e:
                mod.parse_args(["--tiny", "--draft-stop", bad])
            assert e.value.code == 2
        assert mod.parse_args(["--tiny", "--draft-stop", "0.1,0.3@2"]).draft_stop == "0.1,0.3@2"
