"""Losslessness: every strategy emits exactly ar's tokens at temperature 0 in float32."""
import dataclasses
import itertools
import math
import time
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cure_core.config import DecodeConfig
from cure_core.engine import Engine, generate_ids

from conftest import make_pair

SPECULATIVE = ("sd", "parallel", "cure", "ddtree")


def run(pair, cfg, prompt):
    blocks = list(Engine(pair, cfg).generate(prompt))
    return [t for b in blocks for t in b.emitted], blocks


def tuner_block(accepted, size, draft_ms, index=1, drafted=0):
    """A verified block for the budget tuner: `size` depth-1 nodes, `accepted` of them accepted; block
    `index` of its generation (not the first: that one's drafting cost is not a sample); `drafted`
    positions in branch 0 (what a sequential drafter's cost is learnt per)."""
    from cure_core.block import Block, Resync, Timings, TreeNode
    nodes = tuple(TreeNode(token=i, parent=-1, depth=1, branch=0, accepted=i in accepted) for i in range(size))
    return Block(index=index, strategy="cure", context_len=0, root=0, draft=tuple(range(drafted)), margins=(), ufps=(),
                 nodes=nodes, accepted=tuple(accepted), winner=0, branch0_accepted=len(accepted), bonus=0, emitted=(),
                 resync=Resync("none", ()), timings=Timings(draft_ms=draft_ms), stop=None)


@st.composite
def configs(draw):
    k = draw(st.integers(2, 12))
    b_max = draw(st.integers(1, 5))
    return dict(
        k=k,
        max_new_tokens=draw(st.integers(1, 40)),
        tau_margin=draw(st.sampled_from([0.0, 0.3, 1.0, 3.0, 100.0])),
        b_min=draw(st.integers(0, b_max)),
        b_max=b_max,
        max_ufps=draw(st.integers(0, 3)),
        v_max=draw(st.integers(k - 1, 64)),
        keep_branch0=draw(st.booleans()),
        resync=draw(st.booleans()),
        auto_budget=draw(st.booleans()),
        kv_cache=draw(st.sampled_from(["static", "dynamic"])),
        cure_tree=draw(st.sampled_from(["best-first", "paper"])),
        redrafts=draw(st.integers(0, 4)),
        acceptance=draw(st.booleans()),
        alt_floor=draw(st.booleans()),
        draft_stop=draw(st.booleans()),
    )


prompts = st.lists(st.integers(0, 255), min_size=1, max_size=24)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(prompt=prompts, conf=configs(), noise=st.sampled_from(["mild", "strong"]))
def test_every_strategy_equals_ar(target, drafts, prompt, conf, noise):
    """60 examples x 5 speculative runs (cure over the block drafter and over the chain) = 300 (prompt,
    config) cases against ar (which always runs on transformers' DynamicCache: the static cache must not
    change a token either)."""
    pair = make_pair(target, drafts[noise])
    # cure again over the chain drafter (ModelPair.chain_strategies, as catalog.CURE_OVER_CHAIN sets it)
    chained = dataclasses.replace(pair, chain_strategies=frozenset({"sd", "cure"}))
    ref, _ = run(pair, DecodeConfig.of(strategy="ar", **dict(conf, kv_cache="dynamic")), prompt)
    for strategy, on in [(s, pair) for s in SPECULATIVE] + [("cure", chained)]:
        out, blocks = run(on, DecodeConfig.of(strategy=strategy, **conf), prompt)
        assert out == ref, f"{strategy} diverged from ar with {conf}"
        assert all(b.tree_size <= conf["v_max"] for b in blocks)
        if conf["auto_budget"]:
            assert all(b.tree_size <= b.meta["v_max"] for b in blocks)      # the tuner's budget bounds the tree


@pytest.mark.parametrize("strategy", SPECULATIVE)
def test_paper_defaults_lossless_and_partial_acceptance(pair, strategy):
    """K=16, tau_margin=1, b 1..5, beam 5, one UFP: identical output, acceptance neither 0 nor all."""
    prompt = list(b"def fibonacci(n):\n    ")
    cfg = DecodeConfig.of(strategy=strategy, max_new_tokens=96)
    ref, _ = run(pair, cfg.with_(strategy="ar"), prompt)
    out, blocks = run(pair, cfg, prompt)
    assert out == ref
    tau = len(out) / len(blocks)
    assert 1.0 < tau < 16.0
    assert any(b.accept_length < len(b.draft) for b in blocks)  # some drafted tokens are rejected


def test_cure_repairs_win_sometimes(pair):
    prompts = [list(f"prompt {i}: x = {i * 7}".encode()) for i in range(6)]
    wins = 0
    for p in prompts:
        _, blocks = run(pair, DecodeConfig.of(strategy="cure", max_new_tokens=48), p)
        wins += sum(b.repair_won for b in blocks)
        for b in blocks:
            if b.repair_won:
                assert b.winner != 0 and b.delta_a > 0
    assert wins > 0


@pytest.mark.parametrize("strategy", SPECULATIVE)
def test_stops_match_ar_at_eos_and_context_end(target, drafts, strategy):
    prompt = list(b"hello world")
    # eos: pick a token ar emits mid-way, so the cut happens inside a block
    free = generate_ids(make_pair(target, drafts["mild"]), DecodeConfig.of(strategy="ar", max_new_tokens=30), prompt)
    eos = free[7]
    pair = make_pair(target, drafts["mild"], eos_ids=[eos])
    ref = generate_ids(pair, DecodeConfig.of(strategy="ar", max_new_tokens=30), prompt)
    assert ref[-1] == eos and len(ref) == free.index(eos) + 1
    assert generate_ids(pair, DecodeConfig.of(strategy=strategy, max_new_tokens=30), prompt) == ref
    # context end: 13 tokens of room in a 24-token context
    pair = make_pair(target, drafts["mild"], max_context=len(prompt) + 13)
    ref = generate_ids(pair, DecodeConfig.of(strategy="ar", max_new_tokens=100), prompt)
    assert len(ref) == 13
    out, blocks = run(pair, DecodeConfig.of(strategy=strategy, max_new_tokens=100), prompt)
    assert out == ref and blocks[-1].stop == "context"


def test_ablations_really_change_the_mechanism(pair):
    prompt = list(b"for i in range(10):")
    # the ablations are the paper tree's (Table 4): branch 0 and UFP repairs are its notions
    cfg = DecodeConfig.of(strategy="cure", cure_tree="paper", max_new_tokens=64, tau_margin=3.0)
    _, full = run(pair, cfg, prompt)
    _, no_b0 = run(pair, cfg.with_(keep_branch0=False), prompt)
    _, no_resync = run(pair, cfg.with_(resync=False), prompt)
    # without branch 0, blocks with repairs hold no branch-0 node below the UFP
    for b in no_b0:
        if b.ufps:
            pos = min(u.position for u in b.ufps)
            assert all(n.depth <= pos for n in b.nodes if n.branch == 0)
    assert any(b.resync.mode == "branch0" for b in no_resync)
    # no-resync feeds branch 0's tokens when a repair won
    for b in no_resync:
        if b.repair_won:
            assert b.resync.tokens != tuple(b.nodes[i].token for i in b.accepted)
    assert all(b.resync.tokens == tuple(b.nodes[i].token for i in b.accepted) for b in full)


def test_auto_budget_learns_a_budget_and_predicts_speedup(pair):
    from cure_core.budget import BudgetTuner, CostCurve
    prompt = list(b"while True:\n    ")
    cfg = DecodeConfig.of(strategy="cure", max_new_tokens=80, auto_budget=True, tau_margin=3.0)
    engine = Engine(pair, cfg)
    ref = generate_ids(pair, cfg.with_(strategy="ar", auto_budget=False), prompt)
    blocks = list(engine.generate(prompt))
    assert [t for b in blocks for t in b.emitted] == ref
    assert engine.tuner is not None and engine.tuner.curve.sizes[0] == 0
    assert {b.meta["v_max"] for b in blocks} <= set(engine.tuner.candidates)
    assert any(b.meta["predicted_speedup"] is not None for b in blocks)


def test_budget_tuner_prefers_small_trees_when_verification_is_steep():
    from cure_core.budget import BudgetTuner, CostCurve

    def block(accepted, size):
        return tuner_block(accepted, size, draft_ms=1.0)
    # acceptance comes from the first 3 nodes only; bigger trees add nothing
    steep = CostCurve((0, 15, 64), (10.0, 30.0, 200.0))
    flat = CostCurve((0, 15, 64), (10.0, 10.5, 11.0))
    for curve in (steep, flat):
        t = BudgetTuner(curve, [15, 32, 64])
        for _ in range(10):
            t.observe(block([0, 1, 2], 64), 64)
        t.blocks = 1                                       # past the exploration tick
        assert t.choose() == 15
    # acceptance that needs deep repair nodes (index 40) pays on a flat curve, not on a steep one
    flat_t, steep_t = BudgetTuner(flat, [15, 32, 64]), BudgetTuner(steep, [15, 32, 64])
    for t in (flat_t, steep_t):
        for _ in range(10):
            t.observe(block([0, 1, 40, 41, 42, 43, 44, 45], 64), 64)
    assert flat_t.rate(64) > flat_t.rate(15)
    assert steep_t.rate(15) > steep_t.rate(64)


def test_nodes_past_the_budget_tell_the_tuner_nothing():
    """A block's tree larger than its budget is learnt as the budget's tree, cut there: its extra nodes must
    not rate the budgets above."""
    from cure_core.budget import BudgetTuner, CostCurve
    t = BudgetTuner(CostCurve((0, 64), (10.0, 74.0)), [4, 8, 16])
    t.observe(tuner_block([0, 1, 2, 3, 4, 5], 8, draft_ms=1.0), 4)     # 8 nodes under a budget of 4, 6 accepted
    assert t.history[-1] == ([0, 1, 2, 3, 4, 5], 4, True)
    assert t.expected_accept(4) == 4 and t.expected_accept(8) is None     # nothing tells a(8)


def test_budget_tuner_costs_the_tree_a_budget_would_really_hold():
    from cure_core.budget import BudgetTuner, CostCurve

    b = tuner_block([0, 1], 20, draft_ms=0.0)
    t = BudgetTuner(CostCurve((0, 64), (10.0, 74.0)), [15, 32, 64])
    t.observe(b, 64)                                       # a natural 20-node tree under a budget of 64
    assert t.expected_size(64) == 20 and t.expected_size(15) == 15
    assert t.rate(32) == t.rate(64)                        # bigger budgets change nothing for such trees
    t.observe(b, 20)                                       # the same tree, cut at its budget of 20
    assert t.expected_size(64) == (20 + 64) / 2


@pytest.mark.parametrize("cure_tree", ["paper", "best-first"])
def test_compiled_static_shapes_equal_ar(target, drafts, cure_tree):
    """--compile: torch.compile over padded static shapes (CUDA graphs on a GPU; inductor on this
    CPU) emits ar's tokens. The dummy padding nodes must never be accepted or seen."""
    pair = make_pair(target, drafts["mild"])
    prompt = list(b"def f(x):\n")
    conf = dict(max_new_tokens=14, k=5, v_max=12, tau_margin=3.0)
    ref, _ = run(pair, DecodeConfig.of(strategy="ar", kv_cache="dynamic", **conf), prompt)
    out, blocks = run(pair, DecodeConfig.of(strategy="cure", compile=True, cure_tree=cure_tree, **conf), prompt)
    assert out == ref
    # repair branches (paper) / trees wider than a chain (best-first) really went through the padded path
    assert any(b.ufps for b in blocks) if cure_tree == "paper" else \
        any(len({n.depth for n in b.nodes}) < b.tree_size for b in blocks)


def test_budget_tuner_skips_drafting_when_no_tree_pays():
    """A CPU-like linear curve (2 tokens cost twice 1) and weak acceptance: budget 0 (a plain ar
    step, no drafting cost) beats every tree; strong acceptance on a GPU-like flat curve brings the
    trees back (on a linear curve no tree can ever pay: tau would have to exceed V + 1)."""
    from cure_core.budget import BudgetTuner, CostCurve

    def block(accepted, size):
        return tuner_block(accepted, size, draft_ms=20.0)
    linear = CostCurve((0, 1, 7, 16), (100.0, 200.0, 800.0, 1700.0))
    flat = CostCurve((0, 1, 7, 16), (100.0, 105.0, 120.0, 140.0))
    weak, strong = BudgetTuner(linear, [0, 1, 4, 7, 16]), BudgetTuner(flat, [0, 1, 4, 7, 16])
    for i in range(10):
        weak.observe(block([0] if i % 5 == 0 else [], 16), 16)           # 20% of blocks accept 1 token
        strong.observe(block(list(range(12)), 16), 16)                  # 12 of 16 every block
    weak.blocks = strong.blocks = 1
    assert weak.choose() == 0 and weak.predicted_speedup(0) == pytest.approx(1.0)
    assert strong.choose() == 16 and strong.predicted_speedup(16) > 1


@pytest.mark.parametrize("strategy", ["sd", "parallel", "cure"])
def test_blocks_without_a_draft_keep_the_drafter_in_sync(target, strategy, monkeypatch):
    """Budget 0 skips propose(); the drafter must still see every emitted token (the root included).
    With the target itself as the drafter every drafted token is accepted iff the drafter's context
    is exactly the emitted text."""
    from cure_core.drafters.causal import ArDrafter, PardDrafter
    from cure_core.engine import ModelPair
    from cure_core.tiny import BYTE_VOCAB, MASK_ID

    class Alternate:                                   # budgets 0, 4, 0, 4, ...
        def __init__(self):
            self.n, self.last_prediction, self.last_phase = 0, None, "settled"
            self.candidates = [0, 4]
            self.last_choice = 0                       # the drafter is not prefilled: its first pass catches up

        def choose(self):
            self.n += 1
            return 0 if self.n % 2 else 4

        def observe(self, block, budget, clipped=False, chain_logp=None):
            pass

        def best_tree(self):                           # what budget 0 was chosen over: nothing measured
            return None

        def redraft_pays(self, v):
            return True

        def alt_floor(self, v):                        # every alternative the budget holds
            return -math.inf

    monkeypatch.setattr(Engine, "_make_tuner", lambda self, cfg: Alternate())
    if strategy == "sd":
        pair = ModelPair(target=target, ar_drafter=ArDrafter(target, vocab_size=BYTE_VOCAB))
    else:
        # the target as a PARD drafter drafts right at offset 1 only; accept >= 1 per drafting block
        pair = ModelPair(target=target, drafter=PardDrafter(target, MASK_ID, vocab_size=BYTE_VOCAB))
    prompt = list(b"def g(a):\n    ")
    # lookup 0: a grafted lookup path may outscore this drafter's (right but unsure) depth-1 token, and the
    # check below reads "drafter in sync" from that token being accepted
    cfg = DecodeConfig.of(strategy=strategy, k=5, max_new_tokens=40, auto_budget=True, tau_margin=0.0, lookup=0)
    out, blocks = run(pair, cfg, prompt)
    assert out == generate_ids(pair, cfg.with_(strategy="ar", auto_budget=False), prompt)
    drafting = [b for b in blocks if b.draft]
    assert drafting and len(drafting) < len(blocks)
    for b in drafting[:-1]:                            # the last block may be cut by max_new_tokens
        if strategy == "sd":
            assert len(b.accepted) == len(b.draft), b.index
        else:
            assert len(b.accepted) >= 1, b.index


@pytest.mark.parametrize("strategy", ["parallel", "cure", "sd"])
def test_the_drafter_takes_in_the_prompt_in_the_prefill_step(target, drafts, strategy, monkeypatch):
    """The engine's prefill step prefills the drafter too: its first pass is over the prompt (but its last
    token, the first root) before block 0, and block 0's drafting pass feeds the root (and masks) only.
    The output still equals ar's."""
    pair = make_pair(target, drafts["mild"])
    drafter = pair.ar_drafter if strategy == "sd" else pair.drafter
    calls, forward = [], drafter.lm.forward
    monkeypatch.setattr(drafter.lm, "forward",
                        lambda tokens, parents, **kw: calls.append(len(tokens)) or forward(tokens, parents, **kw))
    prompt = list(b"def fib(n):\n    ")
    cfg = DecodeConfig.of(strategy=strategy, k=8, max_new_tokens=24)
    gen = Engine(pair, cfg).generate(prompt)
    first = next(gen)
    assert calls[0] == len(prompt) - 1 and first.timings.prefill_tokens == len(prompt) - 1
    assert 1 <= calls[1] <= cfg.k - 1                                # block 0: root (+ masks), no prompt
    out = list(first.emitted) + [t for b in gen for t in b.emitted]
    assert out == generate_ids(pair, cfg.with_(strategy="ar"), prompt)


def test_budget_tuner_explores_ever_more_rarely_while_the_best_stays_put():
    """Settled at budget 0 (weak drafts, steep curve): the first explorations probe the warm-up budget
    every 8th block until `probe_min` blocks tell every budget up to it; from then on exploration blocks
    get rarer (8, 16, 32, 64 blocks apart, then 64). When the drafts become good, an exploration that beats
    its estimate brings exploration back to every 8th block and the tuner leaves 0 within a few explorations."""
    from cure_core.budget import BudgetTuner, CostCurve

    def block(accepted, size):
        return tuner_block(accepted, size, draft_ms=20.0)
    curve = CostCurve((0, 1, 7, 16), (100.0, 130.0, 180.0, 260.0))
    t = BudgetTuner(curve, [0, 1, 4, 7, 16])
    explored, probed = [], []
    for i in range(200):
        v = t.choose()
        if i >= t.warmup and v > 0:
            explored.append(i)
            probed.append(v)
        t.observe(block([], min(v, 16)), v)                # nothing is ever accepted
    gaps = [b - a for a, b in zip(explored, explored[1:])]
    assert explored[0] == t.warmup + t.explore_every - 1
    probes = t.probe_min - t.warmup                        # the warm-up blocks tell every budget up to 7
    assert gaps == [8] * probes + [16, 32, 64]                 # 200 blocks: the next would be at 233
    assert probed[:probes] == [t.warmup_budget] * probes and probed[probes:probes + 3] == [1, 1, 1]
    assert len(explored) <= probes + 6                     # every 8th block would be 24
    choices = []
    for _ in range(150):                                   # the drafts suddenly become perfect
        v = t.choose()
        choices.append(v)
        t.observe(block(list(range(min(v, 16))), min(v, 16)), v)
    first = next(i for i, v in enumerate(choices) if v > 0)
    assert first <= 64                                     # the next scheduled exploration at the latest
    assert all(v > 0 for v in choices[first + 40:])        # ...and a few explorations later trees win


def test_budget_tuner_learns_the_drafting_cost_per_budget():
    """An AR-like drafter pays 80 ms per drafted token; the target verifies any tree in 100 ms and
    accepts exactly two drafted tokens. Priced per budget, 2 nodes win (3 tokens / 260 ms, against 1 / 100
    ms for no draft); one mean drafting cost for every budget (240 ms, the old rule) prices 2 nodes like 5
    and skips drafting altogether (3 / 340 ms)."""
    from cure_core.budget import BudgetTuner, CostCurve

    t = BudgetTuner(CostCurve((0, 8), (100.0, 100.0)), [0, 1, 2, 3, 4, 5])
    for _ in range(4):
        for v in (1, 2, 4, 5):
            t.observe(tuner_block([0, 1][:v], v, draft_ms=80.0 * v), v)
    assert t.drafting_ms(0) == 0.0
    assert t.drafting_ms(2) == pytest.approx(160.0) and t.drafting_ms(3) == pytest.approx(240.0)   # interpolated
    t.blocks = 1
    assert t.choose() == 2
    flat = BudgetTuner(CostCurve((0, 8), (100.0, 100.0)), [0, 1, 2, 3, 4, 5])
    for _ in range(4):
        for v in (1, 2, 4, 5):
            flat.observe(tuner_block([0, 1][:v], v, draft_ms=240.0), v)     # the same mean, any budget
    flat.blocks = 1
    assert flat.choose() == 0 and flat.rate(5) == pytest.approx(flat.rate(2))


def test_budget_tuner_prices_unsampled_short_chains_per_drafted_step():
    """A tuner settled on wide trees over an AR drafter (K-1 = 7 steps of 40 ms, 280 ms a block) has drafting
    samples at budgets 16 and 24 only. When the text turns hard (2 tokens accepted a block), a 2-token chain costs 2
    steps, not 7: priced per step it wins (3 tokens / 217 ms); priced like the nearest sampled budget (the
    block-parallel rule) every tree costs 280 ms and the tuner stops drafting (1 token / 135 ms beats
    3 / 417). Explorations only go up, so that budget 0 would stay."""
    from cure_core.budget import BudgetTuner, CostCurve

    curve = CostCurve((0, 24), (135.0, 135.0 + 24 * 2.0))
    cands = [0, 1, 2, 3, 4, 5, 7, 16, 24]
    ar = BudgetTuner(curve, cands, steps=lambda v: min(v, 7))
    parallel = BudgetTuner(curve, cands)
    for t in (ar, parallel):
        for v in (16, 24, 16, 24):
            t.observe(tuner_block([0, 1], v, draft_ms=280.0, drafted=7), v)
        t.blocks = 1
    assert ar.drafting_ms(2) == pytest.approx(80.0) and ar.drafting_ms(7) == pytest.approx(280.0)
    assert ar.drafting_ms(20) == pytest.approx(280.0)                # between samples: interpolated
    assert parallel.drafting_ms(2) == pytest.approx(280.0)           # one pass at any budget
    assert ar.choose() == 2 and parallel.choose() == 0


def test_budget_tuner_explores_down_where_a_block_parallel_drafters_cost_is_unsampled():
    """A block-parallel drafter whose drafting grows with the budget (cure's re-drafts): 50 / 60 / 120 / 140 ms
    at budgets 4 / 8 / 12 / 16; the target accepts nodes 0, 1, 5 and 9, so budget 8 is best (4 tokens / 200
    ms). The warm-up samples drafting at 16 only, so every budget is priced at 140 ms and 12 wins; from 12,
    budget 8 is priced at 12's 120 ms. Explorations that only went up never sampled 8 and stayed on 12 (the
    control); exploring down while the budget below is unsampled finds 8 at the first exploration."""
    from cure_core.budget import BudgetTuner, CostCurve

    class UpOnly(BudgetTuner):                         # the rule before: explore one step up only
        def exploration(self, best):
            bigger = [v for v in self.candidates if v > best]
            return bigger[0] if bigger else None

    curve = CostCurve((0, 16), (100.0, 180.0))                       # C_v = 100 + 5 V
    cost = {4: 50.0, 8: 60.0, 12: 120.0, 16: 140.0}

    def run(tuner):
        choices = []
        for _ in range(60):
            v = tuner.choose()
            choices.append(v)
            tuner.observe(tuner_block([i for i in (0, 1, 5, 9) if i < v], v, draft_ms=cost.get(v, 0.0)), v)
        return choices

    down, up = run(BudgetTuner(curve, [0, 4, 8, 12, 16])), run(UpOnly(curve, [0, 4, 8, 12, 16]))
    assert up[3:].count(12) >= 50 and 8 not in up                   # the control: stuck on 12
    first = down.index(8)
    assert first == 2 + 8 - 1                                        # the first exploration: one step down
    assert down[first:].count(8) >= 45                               # ...and 8 wins from then on
    assert 4 in down[first:]                                         # whose own budget below gets sampled


def test_budget_tuner_does_not_price_a_budget_by_one_block_drafted_in_a_burst():
    """A budget is priced by its own samples alone once it holds `cost_min` (3); with fewer, by the priced
    budgets, or by its own mean where lower. Why: one block drafted in a burst of other load (238 ms here, where
    the settled budget 2 drafts in 65) would price its budget until the sample left the window (the control,
    cost_min=1). Here the target accepts
    nodes 0, 1 and 2, so 4 nodes (4 tokens / 370 ms) beat 2 (3 / 365) and 8 (whose forward costs 500)."""
    from cure_core.budget import BudgetTuner, CostCurve

    curve = CostCurve((0, 2, 4, 8), (300.0, 300.0, 305.0, 500.0))

    def settled(cost_min):
        t = BudgetTuner(curve, [0, 2, 4, 8], cost_min=cost_min)
        t.observe(tuner_block([0, 1, 2], 8, draft_ms=65.0, index=0), 8)         # a generation's first: no sample
        for i in range(40):
            t.observe(tuner_block([0, 1], 2, draft_ms=65.0), 2)
            if i in (10, 30):
                t.observe(tuner_block([0, 1, 2], 8, draft_ms=66.0), 8)          # explorations: a(4), a(8)
        t.observe(tuner_block([0, 1, 2], 4, draft_ms=238.0), 4)                 # the burst
        t.blocks = 1                                                            # past the exploration tick
        return t

    new, old = settled(3), settled(1)
    assert old.drafting_ms(4) == pytest.approx(238.0) and old.choose() == 2     # the control: stuck on 2
    assert new.drafting_ms(4) == pytest.approx(65.0) and new.choose() == 4
    assert new.drafting_ms(8) == pytest.approx(65.0)                            # its own 66 is not lower
    for _ in range(2):                                                          # three samples: its own price
        new.observe(tuner_block([0, 1, 2], 4, draft_ms=238.0), 4)
    assert new.drafting_ms(4) == pytest.approx(238.0) and new.choose() == 2

    # one sample below the best is enough to stop exploring down: its own mean already lowers its price
    # (asking for cost_min there sent a tuner settled at 2 down to 1 at three explorations running)
    below = BudgetTuner(curve, [0, 1, 2, 4, 8])
    for v in [2] * 20 + [1]:
        below.observe(tuner_block([0, 1][:v], v, draft_ms=65.0), v)
    assert below.exploration(2) != 1


def test_budget_tuner_probes_the_warm_up_budget_where_budgets_above_the_best_are_unrated():
    """Settled at budget 0 through a hard opening (nothing accepted), the tuner's window forgets the warm-up
    blocks: budgets above 0 are unrated. Then the drafts improve, but only beyond the first nodes (the target
    takes nodes 2, 3, 5 and 6: a repair tree's siblings), on a curve with a step at the low end. Explorations
    one step up try budget 1 forever (it accepts nothing, so 0 stays best: the control); a probe at the
    warm-up budget tells a(V) for every V up to it at once, and budget 8 (5 tokens / 120 ms) wins."""
    from cure_core.budget import BudgetTuner, CostCurve

    class UpOnly(BudgetTuner):                         # the rule before: explore one step up only
        def wide_probe(self, best):
            return False

    curve = CostCurve((0, 1, 2, 8, 16), (100.0, 100.0, 110.0, 110.0, 120.0))

    def run(tuner):
        choices = []
        for i in range(300):
            v = tuner.choose()
            choices.append(v)
            good = i >= 100                            # the hard opening ends at block 100
            tuner.observe(tuner_block([j for j in (2, 3, 5, 6) if good and j < v], v, draft_ms=10.0 if v else 0.0), v)
        return choices

    wide, up = run(BudgetTuner(curve, [0, 1, 2, 4, 8, 16])), run(UpOnly(curve, [0, 1, 2, 4, 8, 16]))
    assert wide[0] == 16 and up[0] == 16                             # both warm up at the warm-up budget
    assert set(up[100:]) == {0, 1}                                   # the control: never sees past budget 1
    first = wide.index(8, 100)
    # the second exploration at the latest: the first may still see the last thin probe (block 49) in its
    # window and step up to 1
    assert first <= 100 + 2 * 64
    assert wide[first:].count(8) >= 0.9 * len(wide[first:])          # ...and 8 wins from then on
    # before: probes at 16 (and at 8 while a(8)'s bound could still beat budget 0: `could_win`), else budget 0
    assert 16 in wide[:100] and set(wide[:100]) <= {0, 1, 8, 16}


def test_budget_tuner_rates_trees_above_the_best_on_several_probes_not_one():
    """Half the blocks are hard (nothing accepted); in the others the target takes nodes 0, 2 and 3 (a repair
    tree's siblings), so a(1) = a(2) = 0.5 but a(4) = 1.5, and 4-node trees win by far on a curve with a step
    at the low end. Rated on the one or two probes the window held (`probe_min` 1, no `could_win` probes: the
    rule before), a run whose first probes fell on hard blocks stayed on 1-node trees for most of 200 blocks,
    in 10 of 40 seeds; with the defaults in none."""
    several = [_share_of_big_trees(seed, 0.5) for seed in range(40)]
    one = [_share_of_big_trees(seed, 0.5, probe_min=1, probe_max=1) for seed in range(40)]
    assert sum(f < 0.3 for f in one) >= 5                            # the control: stuck on 1-node trees
    assert sum(f < 0.5 for f in several) <= 2
    assert sum(several) / 40 >= 0.9 > sum(one) / 40 + 0.15


def _share_of_big_trees(seed, p_good, **tuner):
    """Share of 200 modelled blocks a tuner verifies at 4+ nodes where a block is good with probability
    `p_good` (the target takes nodes 0, 2 and 3, else nothing) and 4-node trees win by far."""
    import random

    from cure_core.budget import BudgetTuner, CostCurve

    curve = CostCurve((0, 1, 2, 4, 16), (100.0, 100.0, 115.0, 115.0, 125.0))
    rng, t, big = random.Random(seed), BudgetTuner(curve, [0, 1, 2, 4, 8, 16], **tuner), 0
    for _ in range(200):
        v = t.choose()
        big += v >= 4
        good = rng.random() < p_good
        t.observe(tuner_block([j for j in (0, 2, 3) if good and j < v], v, draft_ms=10.0), v)
    return big / 200


def test_budget_tuner_probes_on_while_a_bigger_tree_could_still_win():
    """As above, but only 3 blocks in 10 are good (a(1) = 0.3, a(4) = 0.9: 4 nodes still win by far). Four
    telling blocks that were all hard (a quarter of runs) rated every tree above 1 node at a(1): with
    `probe_min` 4 alone (`probe_max` 4, the rule before) 11 of 40 runs stayed on 1-node trees. Probing on
    while a(4) plus 1.5 standard errors of its gain could beat 1-node trees (`could_win`; four blocks that
    gained nothing still leave a count's spread) leaves 4 there (2 standard errors: 1, at a higher probing
    cost)."""
    before = [_share_of_big_trees(seed, 0.3, probe_max=4) for seed in range(40)]
    bound = [_share_of_big_trees(seed, 0.3) for seed in range(40)]
    assert sum(f < 0.5 for f in before) >= 9                         # the control
    assert sum(f < 0.5 for f in bound) <= 5
    assert sum(bound) / 40 >= 0.83 > sum(before) / 40 + 0.1


def test_budget_tuner_stops_probing_where_bigger_trees_plainly_lose():
    """The target takes node 0 in 6 blocks of 10 and nothing beyond it. Where a 16-node tree costs two one-token
    steps, the tuner probes 16 nodes no more often than with `probe_min` alone (`probe_max` 4: the rule
    before), since a(16) plus its bound cannot pay for the second step; where 16 nodes cost 5% more than 1,
    it probes on to `probe_max` telling blocks (each probe costs little there)."""
    import random

    from cure_core.budget import BudgetTuner, CostCurve

    def wide_probes(curve, **tuner):
        rng, t, probes = random.Random(0), BudgetTuner(curve, [0, 1, 2, 4, 8, 16], **tuner), 0
        for _ in range(200):
            v = t.choose()
            # (`probing`: a thin or could-win probe, not one that freshens a window that forgot the budget)
            probes += t.last_phase == "explore" and v == t.warmup_budget and t.probing
            t.observe(tuner_block([0] if v and rng.random() < 0.6 else [], v, draft_ms=5.0), v)
        assert t.warmup_budget == 16
        return probes
    steep = CostCurve((0, 1, 16), (100.0, 100.0, 200.0))
    assert wide_probes(steep) == wide_probes(steep, probe_max=4)
    flat = CostCurve((0, 1, 16), (100.0, 100.0, 105.0))
    assert wide_probes(flat) >= wide_probes(flat, probe_max=4) + 6


def test_budget_tuner_drops_a_cached_cost_curve_that_verification_times_disown(private_cost_curves):
    """A cached curve measured under other load (4x today's verification times, and so maybe the wrong shape)
    is dropped from the disk cache after 32 blocks, so the next process measures it again; one within 2x
    of what verification costs now stays. Neither tuner changes its own curve mid-answer."""
    import dataclasses
    import json

    from cure_core.block import Timings
    from cure_core.budget import BudgetTuner, CostCurve

    private_cost_curves.write_text(json.dumps({k: {"sizes": [0, 8], "verify_ms": [400.0, 440.0]}
                                               for k in ("stale", "fresh")}))
    stale = BudgetTuner(CostCurve((0, 8), (400.0, 440.0), key="stale"), [0, 4, 8])
    fresh = BudgetTuner(CostCurve((0, 8), (400.0, 440.0), key="fresh"), [0, 4, 8])
    for i in range(40):
        for t, ms in ((stale, 105.0), (fresh, 290.0)):
            b = tuner_block([0], 4, draft_ms=5.0)
            t.observe(dataclasses.replace(b, timings=Timings(draft_ms=5.0, verify_ms=ms)), 4)
        if i == 30:
            assert set(json.loads(private_cost_curves.read_text())) == {"stale", "fresh"}   # 31 blocks: kept
    assert stale.curve_forgotten and not fresh.curve_forgotten
    assert set(json.loads(private_cost_curves.read_text())) == {"fresh"}
    assert stale.curve.verify(0) == 400.0 and stale.verify_ms(0) == pytest.approx(100.0)     # rescaled, kept


def test_budget_tuner_keeps_a_sequential_drafter_off_budget_0_until_drafting_is_priced():
    """With fewer than 3 blocks pricing a chain drafter's cost, budget 0 would rest on a guessed cost line
    and, drafting nothing, never correct it: the tuner drafts at its best-rated non-zero budget instead
    (phase "unpriced"). A block-parallel drafter's tuner and a priced one take budget 0 when it rates best."""
    from cure_core.budget import BudgetTuner, CostCurve

    curve = CostCurve((0, 1, 2, 4), (100.0, 200.0, 300.0, 500.0))          # CPU-like: no tree pays
    chain = BudgetTuner(curve, [0, 1, 2, 4], steps=lambda v: v)
    parallel = BudgetTuner(curve, [0, 1, 2, 4])
    for t in (chain, parallel):
        t.observe(tuner_block([], 2, draft_ms=60.0, index=0, drafted=2), 2)         # the prompt's catch-up
        t.observe(tuner_block([0], 2, draft_ms=60.0, index=1, drafted=2), 2)
        t.observe(tuner_block([], 2, draft_ms=60.0, index=2, drafted=2), 2)
        t.blocks = 1
    assert len(chain.costs) == 2
    assert parallel.choose() == 0
    best = chain.best_tree()[0]
    assert best > 0 and chain.choose() == best and chain.last_phase == "unpriced"
    chain.observe(tuner_block([], 2, draft_ms=60.0, index=3, drafted=2), best)
    assert len(chain.costs) == 3 and chain.choose() == 0 and chain.last_phase == "settled"


def test_budget_tuner_does_not_price_the_drafters_prompt_catch_up_or_clipped_blocks():
    """Drafters take in the prompt at their first pass of a generation (block 0, or the first drafting block
    after budget-0 blocks): that block's draft time is not what its budget costs. A block clipped by the
    generation's end drafts less than its budget and offers fewer nodes: no cost sample, and its tree is
    censored (it tells a(V) only for V up to its size)."""
    from cure_core.budget import BudgetTuner, CostCurve

    t = BudgetTuner(CostCurve((0, 8), (100.0, 110.0)), [0, 1, 2, 4], steps=lambda v: v)
    t.observe(tuner_block([0, 1], 2, draft_ms=340.0, index=0, drafted=2), 2)        # the prompt's catch-up
    for i in range(1, 4):
        t.observe(tuner_block([0, 1], 2, draft_ms=90.0, index=i, drafted=2), 2)
    assert t.drafting_ms(2) == pytest.approx(90.0)
    t.observe(tuner_block([], 0, draft_ms=0.0, index=0), 0)              # a new generation opens at budget 0
    t.observe(tuner_block([0], 4, draft_ms=500.0, index=1, drafted=4), 4)            # its first drafting block
    t.observe(tuner_block([0, 1, 2, 3], 4, draft_ms=180.0, index=2, drafted=4), 4)
    assert t.drafting_ms(4) == pytest.approx(180.0)
    before = (t.expected_size(4), list(t.costs))
    t.observe(tuner_block([], 1, draft_ms=45.0, index=3, drafted=1), 4, clipped=True)    # room for 1 node only
    assert (t.expected_size(4), t.costs) == before
    assert t.expected_accept(1) == pytest.approx(6 / 7)                    # ...which V = 1 learns
    # a(4) chained: a(1) over the 7 blocks that tell it, + a(2) - a(1) over the 6 with 2 nodes or more, +
    # a(4) - a(2) over the 2 with 4; read as an uncut tree the clipped block would tell a(4) = 0 instead
    assert t.expected_accept(4) == pytest.approx(6 / 7 + 5 / 6 + 2 / 2)


def test_budget_tuner_draft_stop_prices_one_more_position_at_the_predicted_rate():
    """theta = rate(V) x (drafting ms per drafted position + verify ms per node): a chain whose joint
    probability is below theta cannot add as many tokens as that time earns at the current rate."""
    import math

    from cure_core.budget import BudgetTuner, CostCurve

    curve = CostCurve((0, 8), (100.0, 140.0))                         # 5 ms a node
    t = BudgetTuner(curve, [0, 1, 2, 4, 8], steps=lambda v: v)
    assert t.draft_stop(4) is None                                    # nothing measured yet
    for i in range(1, 5):                                             # 4 positions drafted at 40 ms each
        t.observe(tuner_block([0, 1], 4, draft_ms=160.0, index=i, drafted=4), 4)
    rate = t.rate(4)                                                  # 3 tokens / (160 + 120 ms)
    assert rate == pytest.approx(3 / 280)
    assert math.exp(t.draft_stop(4)) == pytest.approx(rate * (40.0 + 5.0))
    assert BudgetTuner(curve, [0, 4]).draft_stop(4) is None            # block-parallel: one pass anyway
    assert t.draft_stop(0) is None


def test_budget_tuner_alt_floor_prices_one_more_verified_node_at_the_predicted_rate():
    """alt_floor: p^gamma >= rate(V) x verify ms per node, as a log-prob: an alternative whose calibrated
    acceptance is below that cannot add as many tokens as its row's time earns; -inf before a rate exists
    and at budget 0; for block-parallel drafters too (a row costs the same whoever drafted it)."""
    import math

    from cure_core.budget import BudgetTuner, CostCurve

    curve = CostCurve((0, 8), (100.0, 140.0))                         # 5 ms a node
    for steps in (lambda v: v, None):
        t = BudgetTuner(curve, [0, 1, 2, 4, 8], steps=steps)
        assert t.alt_floor(4) == -math.inf                             # nothing measured yet
        for i in range(1, 5):
            t.observe(tuner_block([0, 1], 4, draft_ms=160.0, index=i, drafted=4), 4)
        assert t.alt_floor(4) == pytest.approx(math.log(t.rate(4) * 5.0) / t.calibration())
        assert t.alt_floor(0) == -math.inf


def test_budget_tuner_prices_a_chain_per_block_and_per_position():
    """An AR drafter's block costs 150 ms plus 50 ms a drafted position (its catch-up on the accepted tokens
    is paid whatever it drafts); the target verifies any tree in 200 ms and accepts 6 nodes a block. From
    samples at budgets 8 and 15 the line is learnt exactly, so 4 positions cost 350 ms and 8 win (7 tokens /
    750 ms against 5 / 550). Priced in proportion to the steps (the old rule) 4 positions cost half of 8's
    550 ms and the tuner settled on 4 (5 / 475)."""
    import math

    from cure_core.budget import BudgetTuner, CostCurve

    t = BudgetTuner(CostCurve((0, 16), (200.0, 200.0)), [0, 2, 4, 8, 15], steps=lambda v: min(v, 15))
    t.observe(tuner_block(list(range(6)), 8, draft_ms=999.0, drafted=8), 8)   # the prompt's catch-up: no sample
    for v in (8, 15, 8, 15):
        t.observe(tuner_block(list(range(6)), v, draft_ms=150.0 + 50.0 * v, drafted=v), v)
    assert t.cost_line() == pytest.approx((150.0, 50.0))
    assert t.drafting_ms(4) == pytest.approx(350.0) and t.drafting_ms(15) == pytest.approx(900.0)
    t.blocks = 1
    assert t.choose() == 8
    # one more position costs c1, not the block's mean per position (68.75 ms at 8): what stopping saves
    assert math.exp(t.draft_stop(8)) == pytest.approx(t.rate(8) * 50.0)


def test_budget_tuner_cost_line_is_not_set_by_one_slow_block():
    """A chain's block costs 10 ms plus 70 a position, but the run's first full chain (15 positions) ran at
    1987 ms (shapes the kernels had not met). Least squares through those 7 blocks gives c1 near 132 and a
    negative c0 (so a line through 0 at 122 ms a position, the old rule), pricing 4 positions at 490 ms;
    the median slope over pairs and the median residual give the line of the other six."""
    from cure_core.budget import BudgetTuner, CostCurve

    t = BudgetTuner(CostCurve((0, 16), (200.0, 200.0)), [0, 1, 2, 4, 8, 15], steps=lambda v: min(v, 15))
    t.observe(tuner_block([0], 15, draft_ms=3000.0, index=0, drafted=15), 15)     # the prompt's catch-up
    for v, ms in ((15, 1987.0), (1, 80.0), (1, 80.0), (2, 150.0), (2, 150.0), (4, 290.0), (4, 290.0)):
        t.observe(tuner_block([0], v, draft_ms=ms, drafted=v), v)
    assert t.cost_line() == pytest.approx((10.0, 70.0))
    assert t.drafting_ms(4) == pytest.approx(290.0)
    alone = BudgetTuner(CostCurve((0, 16), (200.0, 200.0)), [0, 1, 2, 4, 8, 15], steps=lambda v: min(v, 15))
    alone.observe(tuner_block([0], 15, draft_ms=3000.0, index=0, drafted=15), 15)
    for v, ms in ((15, 1987.0), (1, 80.0), (1, 60.0), (1, 86.0)):      # one block alone would set the slope
        alone.observe(tuner_block([0], v, draft_ms=ms, drafted=v), v)
    assert alone.cost_line() == pytest.approx((0.0, 83.0))               # through 0: median ms per position


def test_budget_tuner_learns_how_deep_a_stopped_chain_drafts():
    """A draft stop ends some chains before their budget does: under budget 16, chains of 2 and 6 positions
    (stopped); under budget 4, two chains of 4 (they reached the budget: their stop lies deeper, unknown).
    Kaplan-Meier over the stop depths: P(draft more than 1) = 1, more than 2..5 = 3/4, more than 6 = 0, so
    budget 16 drafts 1 + 1 + 4 x 3/4 = 5 positions on average and budget 2 drafts 2. A drafter without a stop
    (sd: every chain reaches its budget) drafts min(V, K-1)."""
    from cure_core.budget import BudgetTuner, CostCurve

    curve = CostCurve((0, 16), (200.0, 200.0))
    t = BudgetTuner(curve, [0, 2, 4, 8, 16], steps=lambda v: min(v, 15))
    for budget, p in ((16, 1), (4, 4), (16, 2), (4, 4), (16, 6)):       # the first: the prompt's catch-up
        t.observe(tuner_block([0], budget, draft_ms=100.0 + 25.0 * p, drafted=p), budget)
    assert t.drafted_survival() == pytest.approx([1, 1, 0.75, 0.75, 0.75, 0.75, 0])
    assert t.expected_drafted(16) == pytest.approx(5.0) and t.expected_drafted(8) == pytest.approx(5.0)
    assert t.expected_drafted(4) == pytest.approx(3.5) and t.expected_drafted(2) == pytest.approx(2.0)
    assert t.drafting_ms(16) == pytest.approx(100.0 + 25.0 * 5.0)          # not 15 steps' worth
    sd = BudgetTuner(curve, [0, 2, 4, 8, 16], steps=lambda v: min(v, 15))
    for budget in (4, 4, 8, 4, 8):
        sd.observe(tuner_block([0], budget, draft_ms=100.0 + 25.0 * budget, drafted=budget), budget)
    assert [sd.expected_drafted(v) for v in (2, 8, 16)] == [2, 8, 15]
    assert sd.drafting_ms(16) == pytest.approx(100.0 + 25.0 * 15)


def test_budget_tuner_chains_a_large_budgets_acceptance_over_the_smaller_ones():
    """The only blocks that tell a(4) are the three warm-up blocks of a hard opening (nothing accepted) and
    one exploration (4 of 4); twenty settled budget-2 blocks accept 2 of 2. Averaged over its own four
    blocks a(4) = 1 < a(2) = 1.75 and the tuner stays on 2. Chained, a(4) = a(2) over every block + the
    increment a(4) - a(2) over the four (0, 0, 0, 2) = 2.25, and 4 wins (3.25 tokens / 160 ms against
    2.75 / 155)."""
    from cure_core.budget import BudgetTuner, CostCurve

    t = BudgetTuner(CostCurve((0, 4), (100.0, 110.0)), [0, 1, 2, 4])
    for accepted, v in [([], 4)] * 3 + [([0, 1], 2)] * 20 + [([0, 1, 2, 3], 4)]:
        t.observe(tuner_block(accepted, v, draft_ms=50.0), v)
    assert t.expected_accept(2) == pytest.approx(42 / 24)
    assert t.expected_accept(4) == pytest.approx(42 / 24 + 2 / 4)
    t.blocks = 1
    assert t.choose() == 4


@settings(max_examples=60, deadline=None, derandomize=True)
@given(blocks=st.lists(st.tuples(st.integers(0, 20), st.sets(st.integers(0, 20), max_size=8)), min_size=1, max_size=30),
       v=st.integers(0, 24))
def test_the_chained_acceptance_is_the_plain_mean_when_every_block_tells_every_budget(blocks, v):
    """Uncut trees tell a(V) for every V, and then the chained increments telescope to the plain mean."""
    from cure_core.budget import BudgetTuner, CostCurve

    t = BudgetTuner(CostCurve((0, 16), (100.0, 120.0)), [0, 1, 2, 4, 8, 16, 24])
    t.history = [(sorted(acc), size, False) for size, acc in blocks]
    assert t.expected_accept(v) == pytest.approx(sum(sum(1 for i in acc if i < v) for _, acc in blocks) / len(blocks))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(samples=st.lists(st.tuples(st.sampled_from([1, 2, 4, 8, 16]), st.integers(0, 15)), min_size=1, max_size=40))
def test_the_survival_curve_equals_the_written_out_kaplan_meier_rule(samples):
    """drafted_survival's one-pass counts equal the rule written out depth by depth: at depth d, the blocks
    at risk drafted d positions and could have drafted more; those that stopped there drafted exactly d."""
    from cure_core.budget import BudgetTuner, CostCurve, DraftCost

    t = BudgetTuner(CostCurve((0, 16), (100.0, 120.0)), [0, 1, 2, 4, 8, 16], steps=lambda v: min(v, 15))
    t.costs = [DraftCost(b, min(p, min(b, 15)), 100.0) for b, p in samples]
    recent = [(c.positions, min(c.budget, 15)) for c in t.costs]
    want, s = [1.0], 1.0
    for d in range(1, max(p for p, _ in recent) + 1):
        at_risk = [p for p, cap in recent if p >= d and cap > d]
        if at_risk:
            s *= 1 - sum(1 for p in at_risk if p == d) / len(at_risk)
        want.append(s)
    assert t.drafted_survival() == pytest.approx(want)


def test_budget_tuner_calibrates_the_draft_stop_to_what_the_target_accepts():
    """The target accepts a chain through depth d with probability p_d^0.5 (p_d: its joint draft probability;
    an unsure draft model of a right chain). Fitted over 64 blocks, gamma comes out near 0.5, and the stop
    keeps drafting down to p = theta^2: p^gamma is what the next position can add, p alone undersold it."""
    import math
    import random

    from cure_core.budget import BudgetTuner, CostCurve

    rng = random.Random(0)
    t = BudgetTuner(CostCurve((0, 8), (100.0, 140.0)), [0, 2, 4, 8], steps=lambda v: v)
    assert t.calibration() == 1.0                                      # nothing seen: p itself
    for i in range(64):
        step_lp = [math.log(rng.uniform(0.3, 1.0)) for _ in range(6)]
        u = rng.random()                                               # accepted through d iff u < p_d^0.5
        accepted = sum(1 for lp in itertools.accumulate(step_lp) if u < math.exp(0.5 * lp))
        t.observe(tuner_block(list(range(accepted)), 8, draft_ms=300.0, index=i + 1, drafted=6), 8,
                  chain_logp=step_lp)
        if i == 6:
            assert t.calibration() == 1.0                              # 7 blocks: too few to fit
    assert 0.4 < t.calibration() < 0.63
    theta = t.rate(8) * (t.cost_line()[1] + 5.0)
    assert t.draft_stop(8) == pytest.approx(math.log(theta) / t.calibration())


def test_budget_tuner_warms_up_with_the_largest_tree_costing_two_tokens():
    from cure_core.budget import BudgetTuner, CostCurve
    cands = [0, 1, 4, 7, 16, 32, 64]
    cpu = BudgetTuner(CostCurve((0, 16, 64), (100.0, 190.0, 400.0)), cands)
    gpu = BudgetTuner(CostCurve((0, 16, 64), (10.0, 10.5, 11.0)), cands)
    linear = BudgetTuner(CostCurve((0, 1, 64), (100.0, 200.0, 6500.0)), cands)
    assert cpu.warmup_budget == 16 and gpu.warmup_budget == 64 and linear.warmup_budget == 1
    assert [cpu.choose() for _ in range(cpu.warmup)] == [16] * cpu.warmup


def test_the_tuner_measures_its_curve_through_the_engines_own_execution_path(pair, monkeypatch):
    """The cost curve is timed with the KV layout and compile setting the engine decodes with (on a
    GPU, CUDA graphs make a forward ~4x cheaper than eager), and cached under a key that says so."""
    import cure_core.engine as engine_mod
    from cure_core.budget import CostCurve, _model_key
    seen = []

    def fake(model, **kw):
        seen.append(kw)
        return CostCurve((0, 1, 4), (10.0, 10.0, 12.0))
    monkeypatch.setattr(engine_mod, "measure_cost_curve", fake)
    for kv, compile in (("static", False), ("dynamic", False), ("static", True)):
        cfg = DecodeConfig.of(strategy="cure", auto_budget=True, kv_cache=kv, compile=compile)
        Engine(pair, cfg)._make_tuner(cfg)
        assert seen[-1]["kv"] == kv and seen[-1]["compile"] == compile
    keys = {_model_key(pair.target, 128, kv, c) for kv, c in (("static", False), ("dynamic", False), ("static", True))}
    assert len(keys) == 3


def test_budget_tuner_skips_a_redraft_pass_that_does_not_pay():
    """Blocks accept 2 tokens (+1 bonus) in 100 + 20 + 5 V ms, about 0.022 tokens/ms at budget 4. A 30 ms
    re-draft pass pays only if it wins more than ~0.66 tokens: after 8 passes that won 0.375 on average it runs
    again after 8 blocks (the probe that keeps its gain measured), and each probe that changes nothing doubles
    the interval up to 256 (control: a probe that wins 2 tokens by itself brings it back to 8); after passes
    that win a token each, on every block. Before 8 passes at a budget, while its gain could still beat the
    price (three passes that won nothing cannot: skipped at once); a budget with fewer than 3 passes of its
    own follows every budget's passes pooled, and runs where there are none."""
    from cure_core.budget import BudgetTuner, CostCurve

    t = BudgetTuner(CostCurve((0, 16), (100.0, 180.0)), [0, 4, 8])
    for _ in range(10):
        t.observe(tuner_block([0, 1], 4, draft_ms=20.0), 4)
    for g in (1, 1, 1, 0, 0, 0, 0):
        t.observe_redraft(4, g, 30.0)
        assert t.redraft_pays(4)                                      # fewer than 8 and the bound beats 0.66: run
    t.observe_redraft(4, 0, 30.0)                                     # 8 passes, mean 0.375 < 0.66
    runs = [t.redraft_pays(4) for _ in range(8 + 16 + 32 + 64 + 128 + 256 + 256)]
    probes = [i + 1 for i, run in enumerate(runs) if run]
    assert probes == [8, 24, 56, 120, 248, 504, 760]                  # skipped; probes after 8, 16, ..., 256, 256
    t.observe_redraft(4, 2, 30.0)                                     # the last probe won 2 tokens > 0.66
    assert [t.redraft_pays(4) for _ in range(8)] == [False] * 7 + [True]   # back to one in 8
    t.observe_redraft(4, 0, 30.0)                                     # that probe won nothing: 16 next
    assert [t.redraft_pays(4) for _ in range(16)] == [False] * 15 + [True]
    assert t.redraft_pays(8)                                          # no pass and no rate at 8: run it
    for _ in range(10):
        t.observe(tuner_block([0, 1], 8, draft_ms=20.0), 8)
    assert [t.redraft_pays(8) for _ in range(8)] == [False] * 7 + [True]   # rated: 4's passes decide; a probe
    for _ in range(32):
        t.observe_redraft(4, 1, 30.0)                                 # each pass now wins a token
    assert all(t.redraft_pays(4) for _ in range(16))
    fresh = BudgetTuner(CostCurve((0, 16), (100.0, 180.0)), [0, 4, 8])
    for _ in range(10):
        fresh.observe(tuner_block([0, 1], 4, draft_ms=20.0), 4)
    assert fresh.redraft_pays(8)                                      # no pass anywhere: it runs, to be priced
    for _ in range(3):
        fresh.observe_redraft(4, 0, 30.0)
    assert not fresh.redraft_pays(4)                                  # nothing in 3: the bound cannot reach 0.66


def test_budget_tuner_runs_no_unpriced_redraft_pass_on_warm_up_or_exploration_blocks():
    """A warm-up or exploration block rates a tree: at a budget whose pass has fewer than 8 samples it skips
    the pass (a settled block at the same budget runs it, to price it); once priced, the price decides there
    too."""
    from cure_core.budget import BudgetTuner, CostCurve

    t = BudgetTuner(CostCurve((0, 16), (100.0, 180.0)), [0, 4, 8])
    for _ in range(10):
        t.observe(tuner_block([0, 1], 4, draft_ms=20.0), 4)
    for phase, want in [("warmup", False), ("explore", False), ("settled", True)]:
        t.last_phase = phase
        assert t.redraft_pays(8) is want
    for _ in range(8):
        t.observe_redraft(8, 3, 30.0)                                 # each pass wins 3 tokens: it pays
    t.last_phase = "explore"
    assert t.redraft_pays(8)


def slow_redraft_pass(drafter, monkeypatch) -> list:
    """Make the drafter's re-draft pass cost 40 ms; the list returned grows by one per call."""
    calls, redraft_topk = [], drafter.redraft_topk

    def slow(*args, **kw):
        calls.append(1)
        time.sleep(0.04)
        return redraft_topk(*args, **kw)
    monkeypatch.setattr(drafter, "redraft_topk", slow)
    return calls


def test_cure_skips_a_redraft_pass_that_wins_nothing_and_stays_lossless(pair, monkeypatch):
    """Best-first cure over a block-parallel drafter whose re-draft pass costs 40 ms (a slow drafter) and
    wins next to nothing on the tiny pair, the tuner held at budget 16 (it would leave for budget 0 on
    these drafts): once 3 passes bound its gain below its price the tuner skips the pass (block meta
    `redraft: skipped`, no drafter call), probes it now and then, and the output still equals ar."""
    import cure_core.engine
    from cure_core.budget import BudgetTuner

    class Held(BudgetTuner):
        def choose(self):
            super().choose()
            self.last_choice, self.last_phase = 16, "settled"   # held there: no warm-up or exploration blocks
            return 16
    monkeypatch.setattr(cure_core.engine, "BudgetTuner", Held)
    calls = slow_redraft_pass(pair.drafter, monkeypatch)
    prompt = list(b"def fib(n):\n    ")
    cfg = DecodeConfig.of(strategy="cure", k=8, v_max=16, max_new_tokens=120, auto_budget=True, redrafts=2)
    engine = Engine(pair, cfg)
    blocks, passes_in = [], []                          # per block: the drafter's re-draft calls during it
    for b in engine.generate(prompt):
        passes_in.append(len(calls) - sum(passes_in))
        blocks.append(b)
    assert [t for b in blocks for t in b.emitted] == generate_ids(pair, cfg.with_(strategy="ar"), prompt)
    skipped = [b for b in blocks if b.meta.get("redraft") == "skipped"]
    assert skipped and all(passes_in[b.index] == 0 for b in skipped)   # a skipped pass calls no drafter
    passes = engine.tuner.redraft.samples[16]
    assert len(passes) >= 3 and len(calls) >= len(passes)
    first = next(b.index for b in skipped)
    assert sum(passes_in[:first]) == 3                                # 3 passes bound it, then the first skip
    assert len(calls) - 3 <= (len(blocks) - first) // 8 + 1           # after the first skip: probes only


def test_redraft_price_measures_the_rate_of_a_fixed_budget():
    """At a fixed budget the pass is priced at the rate the recent blocks measured: 3 tokens in 150 ms is
    0.02 tokens/ms, so a 30 ms pass pays only if it wins more than 0.6 tokens."""
    from cure_core.redraft_price import RedraftPrice

    p = RedraftPrice()
    assert p.measured_rate() is None
    for _ in range(8):
        p.observe_block(3, 150.0)
        p.observe(16, 0, 30.0)
    assert p.measured_rate() == pytest.approx(0.02)
    assert [p.pays(16, p.measured_rate) for _ in range(8)] == [False] * 7 + [True]
    for _ in range(32):
        p.observe(16, 1, 30.0)                                 # 1 token for 30 ms beats 0.6
    assert p.pays(16, p.measured_rate)
    for _ in range(100):
        p.observe_block(3, 15000.0)                            # the window forgets the fast blocks
    assert p.measured_rate() == pytest.approx(3 * 64 / (15000.0 * 64))


def test_redraft_price_stops_a_pass_early_only_where_its_bound_cannot_beat_the_price():
    """Before 8 passes the mean is not trusted, but from 3 passes the pass stops once its mean gain plus 1.5
    standard errors (spread floored at a count's) is below the price: at rate 0.02 tokens/ms a 30 ms pass
    costs 0.6 tokens, and three passes that won nothing bound it at 0.43. A pass that won once (bound 0.94),
    or one that costs a tenth of a token (6 ms at 0.02), keeps running until the mean decides at 8."""
    from cure_core.redraft_price import RedraftPrice

    def runs(gains: list[int], ms: float, price: RedraftPrice | None = None) -> list[bool]:
        p, out = price or RedraftPrice(), []
        for g in gains:
            out.append(p.pays(16, lambda: 0.02))
            if out[-1]:
                p.observe(16, g, ms)
        return out

    assert runs([0] * 4, 30.0) == [True, True, True, False]          # stopped at the third pass, not the eighth
    assert runs([1, 0, 0, 0], 30.0) == [True] * 4                     # one win: the bound stays above 0.6
    assert runs([0] * 4, 10.0) == [True] * 4                          # 10 ms costs 0.2: the bound 0.43 beats it
    assert runs([0] * 9, 6.0) == [True] * 8 + [False]                 # a cheap pass: the mean decides, at 8
    assert runs([0] * 9, 30.0, RedraftPrice(early=8)) == [True] * 8 + [False]   # the rule before: 8, then the mean


def test_cure_at_a_fixed_budget_skips_a_redraft_pass_that_wins_nothing_and_stays_lossless(pair, monkeypatch):
    """Without the tuner (`v_max` 16 fixed) the same rule prices the pass at the rate the blocks measure:
    a 40 ms pass that wins next to nothing is skipped once 3 passes have been seen (no drafter call on a
    skipped block, meta `redraft: skipped`), the price is kept across generations, the output equals ar,
    and the price is the policy's own."""
    calls = slow_redraft_pass(pair.drafter, monkeypatch)
    prompt = list(b"def fib(n):\n    ")
    cfg = DecodeConfig.of(strategy="cure", k=8, v_max=16, max_new_tokens=120, redrafts=2)
    engine = Engine(pair, cfg)
    blocks, passes_in = [], []
    for b in engine.generate(prompt):
        passes_in.append(len(calls) - sum(passes_in))
        blocks.append(b)
    assert [t for b in blocks for t in b.emitted] == generate_ids(pair, cfg.with_(strategy="ar"), prompt)
    assert engine.tuner is None
    skipped = [b for b in blocks if b.meta.get("redraft") == "skipped"]
    assert skipped and all(passes_in[b.index] == 0 for b in skipped)
    first = skipped[0].index
    assert sum(passes_in[:first]) == 3                                # 3 passes bound it, then the first skip
    assert len(calls) - 3 <= (len(blocks) - first) // 8 + 1           # after it: probes only
    price = engine.policy_for(cfg).price
    assert len(price.samples[16]) == len(calls) and len(price.blocks) == min(len(blocks), price.blocks.maxlen)
    before = len(calls)
    again = list(engine.generate(prompt))
    assert len(calls) - before <= len(again) // 8 + 1                 # the same price: probes only, from block 0
    assert engine.policy_for(cfg.with_(strategy="ddtree")).timed is False         # ddtree prices no pass


def test_the_policys_learning_is_counted_in_its_blocks_time(target, drafts, monkeypatch):
    """policy.learn runs before the next block can start, so its time is the block's own (Timings.learn_ms,
    in total_ms and so in every tokens/s), and the output is still ar's."""
    from cure_core.metrics import summarize
    from cure_core.policies import BestFirstCure
    learn = BestFirstCure.learn

    def slow(self, plan, block):
        time.sleep(0.02)
        return learn(self, plan, block)
    monkeypatch.setattr(BestFirstCure, "learn", slow)
    pair = make_pair(target, drafts["mild"])
    cfg = DecodeConfig.of(strategy="cure", k=6, max_new_tokens=16)
    out, blocks = run(pair, cfg, list(b"def fib(n):\n    "))
    assert out == generate_ids(pair, cfg.with_(strategy="ar"), list(b"def fib(n):\n    "))
    assert all(b.timings.learn_ms >= 20.0 for b in blocks)
    t = blocks[0].timings
    assert t.total_ms == pytest.approx(t.draft_ms + t.tree_ms + t.verify_ms + t.commit_ms + t.learn_ms)
    assert summarize(blocks).decode_ms >= 20.0 * len(blocks)
