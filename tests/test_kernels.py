"""Packed CPU kernels (cpu_kernels.py): same logits, same tokens, clear refusals."""
import copy
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cure_cli.main import app
from cure_core.config import DecodeConfig
from cure_core.cpu_kernels import PackedLinear, is_packed, pack_linears, resolve_kernels
from cure_core.engine import Engine, generate_ids
from cure_core.lm import CachedLM
from cure_core.models import load_pair
from cure_core.tiny import save_tiny_pair, tiny_target

from conftest import make_pair

SPECULATIVE = ("sd", "parallel", "cure", "ddtree")


def packed_copy(model):
    m = copy.deepcopy(model)
    assert pack_linears(m) == sum(isinstance(x, torch.nn.Linear) for x in model.modules())
    return m


@pytest.fixture(scope="module")
def packed(target, drafts):
    return {"target": packed_copy(target), "mild": packed_copy(drafts["mild"]), "strong": packed_copy(drafts["strong"])}


def test_packed_model_gives_the_eager_logits_on_trees(target, packed):
    """Prefill, then a tree forward through the cache: every node's logits match the eager model."""
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, 256, (17,), generator=gen).tolist()
    outs = []
    for model in (target, packed["target"]):
        lm = CachedLM(model)
        lm.prefill(ctx)
        outs.append(lm.forward([5, 6, 7, 8, 9, 10], [-1, 0, 1, 0, 3, -1]).logits)
    assert torch.allclose(outs[0], outs[1], atol=1e-4)
    assert not any(isinstance(m, torch.nn.Linear) for m in packed["target"].modules())
    head = packed["target"].get_output_embeddings()
    assert isinstance(head, PackedLinear) and head.weight is not None     # drafters read the head's weight
    assert all(m.weight is None for m in packed["target"].modules() if isinstance(m, PackedLinear) and m is not head)


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(prompt=st.lists(st.integers(0, 255), min_size=1, max_size=24),
       k=st.integers(2, 10), v_max_extra=st.integers(0, 30), auto=st.booleans(),
       noise=st.sampled_from(["mild", "strong"]), kv=st.sampled_from(["static", "dynamic"]))
def test_every_strategy_equals_ar_on_packed_models(packed, prompt, k, v_max_extra, auto, noise, kv):
    """Packing changes kernels, never a token: on packed models every strategy equals packed ar."""
    pair = make_pair(packed["target"], packed[noise])
    base = DecodeConfig.of(strategy="ar", k=k, v_max=k - 1 + v_max_extra, auto_budget=auto, max_new_tokens=24,
                        tau_margin=1.0, kv_cache=kv)
    ref = generate_ids(pair, base.with_(kv_cache="dynamic"), prompt)
    for strategy in SPECULATIVE:
        assert generate_ids(pair, base.with_(strategy=strategy), prompt) == ref, strategy


def test_packed_ar_equals_eager_ar(target, drafts, packed):
    """The tiny target's logits are peaked, so packed and eager greedy decoding agree token for token."""
    eager, fast = make_pair(target, drafts["mild"]), make_pair(packed["target"], packed["mild"])
    cfg = DecodeConfig.of(strategy="ar", max_new_tokens=40)
    for prompt in (list(b"def f(x):\n"), list(b"import os\n"), [1, 2, 3, 4]):
        assert generate_ids(fast, cfg, prompt) == generate_ids(eager, cfg, prompt)


def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    """Few rows are padded (MIN_ROWS); padding or not, and however many rows come together, each
    row's output is the same bits: a verify forward's matmuls give every node what a one-token step
    would give it."""
    import cure_core.cpu_kernels as K
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96)
    p = PackedLinear(lin, keep_weight=False)
    x = torch.randn(40, 64)
    with torch.inference_mode():
        alone = torch.cat([p(x[i:i + 1]) for i in range(40)])
        for m in (1, 2, 3, 4, 5, 17, 40):
            assert torch.equal(p(x[:m]), alone[:m]), m
        assert p(x[None, :3]).shape == (1, 3, 96) and p(x[:0]).shape == (0, 96)
        saved = K.MIN_ROWS
        try:
            K.MIN_ROWS = 1
            assert torch.equal(p(x[:1]), alone[:1])
        finally:
            K.MIN_ROWS = saved
    torch.testing.assert_close(alone, lin(x), atol=1e-5, rtol=1e-5)


def test_resolve_kernels_refuses_what_cannot_be_packed():
    half = tiny_target(seed=0).half()
    assert resolve_kernels("auto", half) is False             # auto: only where it applies
    assert resolve_kernels("eager", tiny_target(seed=0)) is False
    assert resolve_kernels("auto", tiny_target(seed=0)) is True
    with pytest.raises(ValueError, match="float16, not float32"):
        resolve_kernels("packed", half)
    with pytest.raises(ValueError, match="unknown kernels"):
        resolve_kernels("fast", half)


def test_autograd_uses_the_kept_head_weight_and_refuses_dropped_ones(packed):
    head = packed["target"].get_output_embeddings()
    x = torch.randn(3, head.in_features, requires_grad=True)
    head(x).sum().backward()                                   # a drafter trained through the target's head
    assert x.grad is not None and torch.allclose(x.grad, head.weight.sum(0).expand(3, -1), atol=1e-5)
    inner = next(m for m in packed["target"].modules() if isinstance(m, PackedLinear) and m is not head)
    with pytest.raises(RuntimeError, match="packed for inference"):
        inner(torch.randn(2, inner.in_features, requires_grad=True))


def test_compile_refuses_packed_layers(packed):
    with pytest.raises(ValueError, match="`kernels` eager"):
        CachedLM(packed["target"], kv="static", compile=True)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("kernels"))


def test_load_pair_packs_target_and_drafter_together(tiny_dirs):
    t, d = tiny_dirs
    loaded = load_pair(str(t), str(d))
    assert loaded.kernels == "packed"
    for model in (loaded.pair.target, loaded.pair.drafter.lm.model):
        assert is_packed(model)
    eager = load_pair(str(t), str(d), kernels="eager")
    assert eager.kernels == "eager"
    assert not is_packed(eager.pair.target)
    half = load_pair(str(t), str(d), dtype="float16")           # auto leaves what it cannot pack alone
    assert half.kernels == "eager"


def test_cli_kernels_flag_reports_and_refuses(tiny_dirs):
    t, d = tiny_dirs
    runner = CliRunner()
    outs = {}
    for kernels in ("packed", "eager"):
        res = runner.invoke(app, ["generate", "abc", "-t", str(t), "-d", str(d), "-n", "12", "--raw", "--json",
                                  "--kernels", kernels, "--strategy", "cure", "--k", "4", "--v-max", "8"])
        assert res.exit_code == 0, res.output
        obj = json.loads(res.stdout)
        assert obj["kernels"] == kernels
        outs[kernels] = obj["token_ids"]
    assert outs["packed"] == outs["eager"]
    res = runner.invoke(app, ["generate", "abc", "-t", str(t), "-n", "4", "--kernels", "packed", "--compile"])
    assert res.exit_code == 2 and "does not combine with --compile" in res.output
    res = runner.invoke(app, ["generate", "abc", "-t", str(t), "-n", "4", "--kernels", "packed", "--dtype", "float16"])
    assert res.exit_code == 2 and "not float32" in res.output


def test_cpu_kernels_benchmark_smoke(tmp_path):
    """benchmarks/cpu_kernels.py on a tiny model: both curves, ratios to the one-token step, JSON out."""
    from conftest import benchmark_script
    with benchmark_script("cpu_kernels") as mod:
        rep = mod.main(["--tiny", "--sizes", "1,4", "--reps", "2", "--ctx", "16", "--out", str(tmp_path / "k.json")])
    assert set(rep["curves"]) == {"eager", "packed"}
    for curve in rep["curves"].values():
        assert curve["x_one_token"]["1"] == 1.0 and curve["ms"]["4"] > 0
    assert json.loads((tmp_path / "k.json").read_text())["sizes"] == [1, 4]


def test_cpu_kernels_benchmark_compares_the_target_in_several_dtypes(tmp_path):
    """--dtypes: one curve per dtype, each target loaded as the engine loads it (bfloat16 where this CPU has its
    kernels)."""
    import cure_core.cpu_kernels as K
    from conftest import benchmark_script
    dtypes = ["float32", "bfloat16"] if K.bf16_kernels() else ["float32"]
    with benchmark_script("cpu_kernels") as mod:
        rep = mod.main(["--tiny", "--dtypes", ",".join(dtypes), "--sizes", "1,4", "--reps", "2", "--ctx", "16"])
    assert rep["dtypes"] == dtypes and list(rep["curves"]) == dtypes
    assert all(c["x_one_token"]["1"] == 1.0 and c["ms"]["4"] > 0 for c in rep["curves"].values())
    assert rep["environment"]["bf16_kernels"] == K.bf16_kernels()


def test_cpu_info_names_the_cpu_and_its_kernels(monkeypatch):
    """Result files record what a timing ran on: the CPU's model name (from /proc/cpuinfo on Linux) and which
    kernels it runs; without /proc/cpuinfo the name is None, not an error."""
    import cure_core.cpu_kernels as K
    info = K.cpu_info()
    assert info["bf16_kernels"] == K.bf16_kernels() and info["int8_kernels"] == K.int8_kernels()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "model name" in cpuinfo.read_text(encoding="utf-8"):
        assert isinstance(info["cpu_model"], str) and info["cpu_model"]
    real_open = open

    def no_cpuinfo(path, *a, **k):
        if path == "/proc/cpuinfo":
            raise FileNotFoundError(path)
        return real_open(path, *a, **k)
    monkeypatch.setattr("builtins.open", no_cpuinfo)
    assert K.cpu_info()["cpu_model"] is None


@pytest.mark.parametrize("flags, torch_says, native", [
    ({"sse2", "avx512f", "avx512bw"}, True, False),             # AVX512 alone: oneDNN would emulate bfloat16
    ({"sse2", "avx512f", "avx512_bf16"}, True, True),
    ({"sse2", "amx_bf16", "amx_tile"}, True, True),
    ({"sse2", "avx512_bf16"}, False, False),                    # torch's build cannot
    (set(), True, True),                                         # no x86 flags (another architecture): torch's word
])
def test_bfloat16_counts_as_native_only_where_the_cpu_has_it(monkeypatch, flags, torch_says, native):
    """bf16_kernels (what auto picks bfloat16 by) asks the CPU for AVX512-BF16 or AMX on x86, not only torch, whose
    check also passes where oneDNN emulates bfloat16 at 1.6x float32's cost."""
    from cure_core import cpu_kernels as K
    monkeypatch.setattr(K, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: torch_says)
    assert K.bf16_kernels.__wrapped__() is native
