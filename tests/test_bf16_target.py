"""A bfloat16 target whose rows do not depend on their pass (cpu_kernels.row_invariant, attention.exact_attention),
so every strategy equals `ar` token for token in bfloat16 too."""
import copy
import dataclasses
import itertools

import pytest
import torch

from cure_core.attention import EXACT, use_exact_attention
from cure_core.config import DecodeConfig
from cure_core.cpu_kernels import (MIN_ROWS, PackedLinear, bf16_kernels, int8_kernels, invariant_rows, pack_linears,
                                   row_invariant, run_dtype)
from cure_core.engine import Engine
from cure_core.tiny import perturbed_copy, tiny_target

from conftest import make_pair

needs_bf16 = pytest.mark.skipif(not bf16_kernels(), reason="this CPU has no oneDNN bfloat16 kernels")


class KernelChange(PackedLinear):
    """A PackedLinear whose passes of more than `edge` rows round otherwise (as a kernel change does)."""
    edge = 9

    def _pass(self, rows):
        y = super()._pass(rows)
        return y + 1e-3 if rows.shape[0] > self.edge else y


def test_invariant_rows_finds_where_a_kernel_changes_and_row_invariant_cuts_passes_there():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 48)
    layer = KernelChange(lin, keep_weight=False)
    assert invariant_rows(layer) == 9 and invariant_rows(layer, most=6) == 6
    x = torch.randn(30, 32)
    with torch.inference_mode():
        alone = torch.cat([layer(x[i:i + 1]) for i in range(30)])
        assert not torch.equal(layer(x), alone)                       # one pass of 30 rows: another result
        model = torch.nn.Sequential(layer)
        assert row_invariant(model) == 9 and layer.max_rows == 9
        for n in (1, 2, 9, 10, 18, 19, 30):
            assert torch.equal(layer(x[:n]), alone[:n]), n
        assert layer(x[None, :12]).shape == (1, 12, 48)
    assert "passes of <= 9 rows" in repr(layer)
    plain = PackedLinear(lin, keep_weight=False)
    assert invariant_rows(plain, most=2 * MIN_ROWS + 3) == 2 * MIN_ROWS + 3   # float32 packed: no change of kernel


@needs_bf16
def test_packed_bf16_layers_of_qwen_shapes_give_each_row_its_bits_after_row_invariant():
    """On this CPU's oneDNN, for Qwen2.5-0.5B's MLP shapes: after row_invariant, a pass of n rows (1..70) gives
    each row what the row alone gives it, bit for bit; the probe says where one pass would not."""
    torch.manual_seed(0)
    for i, o in ((896, 4864), (4864, 896)):
        layer = PackedLinear(torch.nn.Linear(i, o).to(torch.bfloat16), keep_weight=False)
        x = torch.randn(70, i).to(torch.bfloat16)
        edge = invariant_rows(layer)
        with torch.inference_mode():
            alone = torch.cat([layer(x[j:j + 1]) for j in range(70)])
            if edge < 64:                                             # the probe saw a kernel change:
                assert not torch.equal(layer(x[:edge + 1])[:edge], alone[:edge])   # one pass would round otherwise
            row_invariant(torch.nn.Sequential(layer))
            for n in (2, 5, 16, 17, 32, 33, 47, 64, 70):
                assert torch.equal(layer(x[:n]), alone[:n]), (i, o, n)


def _bf16(model, invariant=True):
    model = copy.deepcopy(model).to(torch.bfloat16)
    pack_linears(model)
    if invariant:
        row_invariant(model)
        use_exact_attention(model)
    return model


CONFIGS = [dict(k=4, v_max=3), dict(k=8, v_max=16), dict(k=8, v_max=48, redrafts=2),
           dict(k=6, v_max=12, cure_tree="paper"), dict(k=16, v_max=64, auto_budget=True)]
PROMPTS = [[1, 2, 3], [40, 41, 42, 43, 44, 45], list(range(100, 120)), [7] * 9]


@pytest.fixture(scope="module")
def wide():
    """A tiny target wide enough (256) for oneDNN to change its bfloat16 kernel with the row count, with flat
    logits (near ties), and two drafters."""
    target = tiny_target(seed=0, logit_scale=1.0, hidden=256, heads=8)
    return target, {"mild": perturbed_copy(target, noise=0.2, seed=1), "strong": perturbed_copy(target, noise=0.6, seed=2)}


def _runs(target, draft, strategies=("sd", "parallel", "cure", "ddtree")):
    """(prompt, config, ar's tokens, {strategy: tokens}) over PROMPTS x CONFIGS; cure also over the chain."""
    pair = make_pair(target, draft)
    chained = dataclasses.replace(pair, chain_strategies=frozenset({"sd", "cure"}))
    for prompt, conf in itertools.product(PROMPTS, CONFIGS):
        conf = dict(conf, max_new_tokens=40)
        run = lambda s, on: [t for b in Engine(on, DecodeConfig.of(strategy=s, **conf)).generate(prompt) for t in b.emitted]
        outs = {s: run(s, pair) for s in strategies}
        outs["cure over the chain"] = run("cure", chained)
        yield prompt, conf, run("ar", pair), outs


@needs_bf16
@pytest.mark.parametrize("noise", ["mild", "strong"])
def test_every_strategy_equals_ar_in_bf16(wide, noise):
    """Over a packed bfloat16 target made row-invariant, sd, parallel, cure (over the block drafter and over the
    chain) and ddtree emit ar's bfloat16 tokens, on 4 prompts x 5 configs (trees up to 65 rows); bfloat16 is
    another target than float32 (it decodes other tokens somewhere)."""
    target, drafts = wide
    t16 = _bf16(target)
    assert run_dtype(t16) == "bfloat16" and t16.config._attn_implementation == EXACT
    differs = False
    for (prompt, conf, ref, outs), (*_, f32, _) in zip(_runs(t16, drafts[noise]), _runs(target, drafts[noise], ())):
        differs |= f32 != ref
        for strategy, out in outs.items():
            assert out == ref, f"{strategy} diverged from bf16 ar on {prompt} with {conf}"
    assert differs


@needs_bf16
def test_without_row_invariant_bf16_strategies_diverge_from_ar(wide):
    """The control: the same packed bfloat16 target with sdpa and one oneDNN pass per forward (no row_invariant)
    diverges from its own ar somewhere, so the test above can fail."""
    target, drafts = wide
    runs = _runs(_bf16(target, invariant=False), drafts["mild"])
    assert any(out != ref for *_, ref, outs in runs for out in outs.values())


@pytest.fixture(scope="module")
def saved(target, tmp_path_factory):
    from cure_core.tiny import byte_tokenizer
    root = tmp_path_factory.mktemp("bf16")
    for name, model in (("target", target), ("draft", perturbed_copy(target, noise=0.2, seed=3))):
        model.save_pretrained(root / name)
        byte_tokenizer().save_pretrained(root / name)
    return root


def test_dtype_auto_is_int8_then_bfloat16_where_the_cpu_runs_them_natively_and_float32_elsewhere():
    from cure_core.cpu_kernels import REDUCE_RANGE
    from cure_core.options import EngineArgs
    native = ("int8" if int8_kernels() and not REDUCE_RANGE else "bfloat16" if bf16_kernels() else "float32")
    assert EngineArgs().dtype == "auto" and EngineArgs().target_dtype() == native
    assert EngineArgs(kernels="eager").target_dtype() == "float32"          # eager: neither int8 nor exact bfloat16
    assert EngineArgs(compile=True).target_dtype() == "float32"             # compile runs eager kernels
    assert EngineArgs(device="cuda").target_dtype() == "float32"
    assert EngineArgs(device_map="auto").target_dtype() == "float32"
    assert EngineArgs(dtype="bfloat16").target_dtype() == "bfloat16"


def test_load_resolves_auto_and_says_where_bfloat16_is_not_exact(saved):
    from cure_core import load
    from cure_core.cpu_kernels import rows_exact
    from cure_core.options import EngineArgs
    auto = load(target=str(saved / "target"), draft=str(saved / "draft"), drafter="ar", strategy="sd")
    assert run_dtype(auto.pair.target) == EngineArgs().target_dtype()
    assert rows_exact(auto.pair.target) and not any("row-invariant" in n for n in auto.notes)
    if bf16_kernels():
        bf16 = load(target=str(saved / "target"), draft=str(saved / "draft"), drafter="ar", strategy="sd",
                    dtype="bfloat16")
        assert run_dtype(bf16.pair.target) == "bfloat16" and rows_exact(bf16.pair.target)
        assert bf16.pair.target.config._attn_implementation == EXACT
        assert bf16.draft_dtype == ("int8" if int8_kernels() else "bfloat16")   # the chain draft, under bf16 too
    eager = load(target=str(saved / "target"), dtype="bfloat16", kernels="eager")
    assert not rows_exact(eager.pair.target)
    assert any("not made row-invariant" in n for n in eager.notes)
