"""--draft-dtype: drafters in another dtype than the target (a bfloat16 drafter on a float32 target).
Only proposals change; every strategy still equals ar token for token, packed or not."""
import copy
import json

import pytest
import torch
from typer.testing import CliRunner

import cure_core.cpu_kernels as K
from cure_cli.main import app
from cure_core.config import DecodeConfig
from cure_core.cpu_kernels import is_packed, pack_linears, resolve_kernels
from cure_core.engine import generate_ids
from cure_core.errors import ModelLoadError
import cure_core.models as M
from cure_core.models import auto_draft_dtype, load_pair
from cure_core.options import EngineArgs
from cure_core.tiny import save_tiny_pair, tiny_target

from conftest import make_pair

SPECULATIVE = ("sd", "parallel", "cure", "ddtree")
PROMPTS = (list(b"def f(x):\n"), list(b"import os\n"), [1, 2, 3, 4], list(b"the the the "))


def bf16_copy(model, packed: bool):
    m = copy.deepcopy(model).to(torch.bfloat16)
    if packed:
        pack_linears(m)
    return m


@pytest.mark.parametrize("packed", [False, True])
def test_every_strategy_equals_ar_with_a_bfloat16_drafter(target, drafts, packed):
    if packed and not K.bf16_kernels():
        pytest.skip("this CPU has no oneDNN bfloat16 kernels")
    tgt = copy.deepcopy(target)
    if packed:
        pack_linears(tgt)
    pair = make_pair(tgt, bf16_copy(drafts["mild"], packed))
    assert next(pair.drafter.model.parameters()).dtype == torch.bfloat16
    for prompt in PROMPTS:
        for k, v_max, auto in ((4, 3, False), (6, 12, False), (8, 30, True)):
            base = DecodeConfig.of(strategy="ar", k=k, v_max=v_max, auto_budget=auto, max_new_tokens=24, tau_margin=1.0)
            ref = generate_ids(pair, base, prompt)
            for strategy in SPECULATIVE:
                assert generate_ids(pair, base.with_(strategy=strategy), prompt) == ref, (strategy, prompt, k)


def test_bfloat16_drafter_still_drafts_what_the_float32_one_does_mostly(target, drafts):
    """Not a speed claim: the bfloat16 copy's proposals are the float32 drafter's on this tiny pair, so
    acceptance (tau) stays where it was."""
    f32, b16 = make_pair(target, drafts["mild"]), make_pair(target, bf16_copy(drafts["mild"], False))
    from cure_core.engine import Engine
    cfg = DecodeConfig.of(strategy="parallel", k=6, max_new_tokens=30)
    taus = []
    for pair in (f32, b16):
        blocks = list(Engine(pair, cfg).generate(list(b"def f(x):\n")))
        taus.append(sum(len(b.emitted) for b in blocks) / len(blocks))
    assert taus[1] >= 0.8 * taus[0], taus


def test_load_pair_loads_drafters_in_the_draft_dtype(tmp_path):
    t, d = save_tiny_pair(tmp_path)
    loaded = load_pair(str(t), str(d), draft_dtype="bfloat16", ar_draft=str(d))
    assert loaded.draft_dtype == "bfloat16"
    assert loaded.pair.target.get_output_embeddings().weight.dtype == torch.float32
    assert loaded.pair.drafter.model.get_output_embeddings().weight.dtype == torch.bfloat16
    assert loaded.pair.ar_drafter.model is loaded.pair.drafter.model        # a PARD doubles as the chain draft
    # all or none: both float32 and bfloat16 pack where oneDNN has bfloat16 kernels
    assert loaded.kernels == ("packed" if K.bf16_kernels() else "eager")
    assert is_packed(loaded.pair.target) == K.bf16_kernels()
    prompt = list(b"def g(y):\n")
    ref = generate_ids(loaded.pair, DecodeConfig.of(strategy="ar", max_new_tokens=16), prompt)
    assert generate_ids(loaded.pair, DecodeConfig.of(strategy="cure", k=6, max_new_tokens=16), prompt) == ref
    assert load_pair(str(t), str(d)).draft_dtype == "float32"                 # default: the target's dtype
    assert load_pair(str(t), str(d), draft_dtype="bf16").draft_dtype == "bfloat16"   # an alias: reported by name
    with pytest.raises(ModelLoadError, match="unknown draft dtype 'int4'"):
        load_pair(str(t), str(d), draft_dtype="int4")


def test_bfloat16_packs_only_with_onednn_bfloat16_kernels(monkeypatch):
    b16 = tiny_target(seed=0).to(torch.bfloat16)
    monkeypatch.setattr(K, "bf16_kernels", lambda: False)
    assert resolve_kernels("auto", b16) is False
    with pytest.raises(ValueError, match="no oneDNN bfloat16 kernels"):
        resolve_kernels("packed", b16)
    monkeypatch.setattr(K, "bf16_kernels", lambda: True)
    assert resolve_kernels("auto", b16) is True


def test_auto_is_int8_then_bfloat16_for_causal_drafters_where_a_cpu_packs_it(monkeypatch):
    """--draft-dtype auto: int8 for causal drafters under a float32 target on a CPU with fbgemm int8 matmuls
    and kernels that may pack, else bfloat16 where oneDNN has bfloat16 kernels; the target's dtype anywhere
    else."""
    monkeypatch.setattr(M, "bf16_kernels", lambda: True)
    monkeypatch.setattr(M, "int8_kernels", lambda: True)
    assert auto_draft_dtype("float32", "cpu", None, "auto") == "int8"
    assert auto_draft_dtype("float32", "cpu", None, "packed") == "int8"
    assert auto_draft_dtype("float32", "cpu", None, "eager") == "float32"       # compile turns auto to eager
    assert auto_draft_dtype("float32", "cuda", None, "auto") == "float32"
    assert auto_draft_dtype("float32", "cpu", "auto", "auto") == "float32"      # accelerate's device map
    assert auto_draft_dtype("float16", "cpu", None, "auto") == "float16"
    monkeypatch.setattr(M, "int8_kernels", lambda: False)
    assert auto_draft_dtype("float32", "cpu", None, "auto") == "bfloat16"
    monkeypatch.setattr(M, "bf16_kernels", lambda: False)
    assert auto_draft_dtype("float32", "cpu", None, "auto") == "float32"
    assert EngineArgs().draft_dtype == "auto"                                    # the default: load_pair resolves it


@pytest.mark.parametrize("bf16", [True, False])
def test_load_pair_auto_loads_causal_drafters_by_the_rule(tmp_path, monkeypatch, bf16):
    monkeypatch.setattr(M, "bf16_kernels", lambda: bf16)
    monkeypatch.setattr(M, "int8_kernels", lambda: False)
    t, d = save_tiny_pair(tmp_path)
    loaded = load_pair(str(t), str(d), draft_dtype="auto", ar_draft=str(d))
    want = torch.bfloat16 if bf16 else torch.float32
    assert loaded.draft_dtype == str(want).removeprefix("torch.")
    assert loaded.pair.drafter.model.get_output_embeddings().weight.dtype == want
    assert loaded.pair.target.get_output_embeddings().weight.dtype == torch.float32
    prompt = list(b"def g(y):\n")
    ref = generate_ids(loaded.pair, DecodeConfig.of(strategy="ar", max_new_tokens=16), prompt)
    for strategy in SPECULATIVE:
        assert generate_ids(loaded.pair, DecodeConfig.of(strategy=strategy, k=6, max_new_tokens=16), prompt) == ref
    eager = load_pair(str(t), str(d), draft_dtype="auto", kernels="eager")
    assert eager.draft_dtype == "float32" and eager.kernels == "eager"


@pytest.mark.skipif(not K.int8_kernels(), reason="this torch build has no fbgemm int8 matmuls")
def test_int8_drafters_run_int8_short_passes_and_every_strategy_equals_ar(tmp_path):
    """--draft-dtype int8 (and auto where it resolves to int8): the drafters' layers but the head are
    Int8Linear, the target stays float32 and packed, and every strategy still equals ar."""
    t, d = save_tiny_pair(tmp_path)
    for dd in ("int8", "auto"):
        loaded = load_pair(str(t), str(d), draft_dtype=dd, ar_draft=str(d))
        assert loaded.draft_dtype == "int8" and loaded.kernels == "packed"
        draft, target = loaded.pair.drafter.model, loaded.pair.target
        layers = [m for m in draft.modules() if isinstance(m, K.PackedLinear)]
        assert layers and all(isinstance(m, K.Int8Linear) != (m is draft.get_output_embeddings()) for m in layers)
        assert not any(isinstance(m, K.Int8Linear) for m in target.modules())
        assert target.get_output_embeddings().weight.dtype == torch.float32
        # the drafters' short passes run Int8Decoder (int8_decoder.py); the target's never do
        assert loaded.pair.drafter.lm.int8_decoder() is not None and loaded.pair.ar_drafter.lm.int8_decoder() is not None
        prompt = list(b"def g(y):\n")
        ref = generate_ids(loaded.pair, DecodeConfig.of(strategy="ar", max_new_tokens=16), prompt)
        for strategy in SPECULATIVE:
            for k in (4, 6):
                got = generate_ids(loaded.pair, DecodeConfig.of(strategy=strategy, k=k, max_new_tokens=16), prompt)
                assert got == ref, (dd, strategy, k)
    with pytest.raises(ModelLoadError, match="int8.*packed kernels"):
        load_pair(str(t), str(d), draft_dtype="int8", kernels="eager")
    with pytest.raises(ModelLoadError, match="int8.*CPU only"):
        load_pair(str(t), str(d), draft_dtype="int8", device="cuda")


@pytest.mark.skipif(not K.int8_kernels(), reason="this torch build has no fbgemm int8 matmuls")
def test_int8_linear_is_close_on_short_passes_and_packed_on_long_ones():
    """Int8Linear: up to INT8_MAX_ROWS rows run the int8 matmul (close to the float result, not equal);
    longer passes run the packed weight, bit for bit what a PackedLinear gives."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    int8, packed = K.Int8Linear(lin, keep_weight=False), K.PackedLinear(lin, keep_weight=False)
    with torch.inference_mode():
        short = torch.randn(K.INT8_MAX_ROWS, 64)
        exact = lin(short)
        got = int8(short)
        assert not torch.equal(got, packed(short))                      # it did run the int8 matmul
        assert (got - exact).abs().max() < 0.05 * exact.abs().max()    # per-channel int8: ~1% error
        long = torch.randn(K.INT8_MAX_ROWS + 1, 64)
        assert torch.equal(int8(long), packed(long))
        assert int8(short[:1]).shape == (1, 48) and int8(torch.randn(2, 3, 64)).shape == (2, 3, 48)


def test_cli_draft_dtype_reports_and_refuses(tmp_path):
    t, d = save_tiny_pair(tmp_path)
    runner = CliRunner()
    outs = {}
    for dd in ("float32", "bfloat16", *(("int8",) if K.int8_kernels() else ())):
        res = runner.invoke(app, ["generate", "abc", "-t", str(t), "-d", str(d), "-n", "12", "--raw", "--json",
                                  "--draft-dtype", dd, "--strategy", "cure", "--k", "4"])
        assert res.exit_code == 0, res.output
        obj = json.loads(res.stdout)
        assert obj["draft_dtype"] == dd
        outs[dd] = obj["token_ids"]
    assert all(ids == outs["float32"] for ids in outs.values())
    res = runner.invoke(app, ["generate", "abc", "-t", str(t), "-d", str(d), "-n", "4", "--draft-dtype", "int4"])
    assert res.exit_code == 2 and "unknown draft dtype 'int4'" in res.output and "Traceback" not in res.output


def test_an_adapted_drafter_merges_in_float32_then_casts_once(tmp_path):
    """A LoRA delta is merged into the float32 base and the sum cast to bfloat16 once (not added to
    bfloat16 weights, which would round twice); the drafter still equals ar."""
    from safetensors.torch import save_file

    from cure_core.checkpoints import load_adapted
    t, base = save_tiny_pair(tmp_path)
    lin = "model.layers.0.mlp.up_proj"
    w = dict(load_pair(str(t), str(base), kernels="eager").pair.drafter.model.named_modules())[lin].weight.detach()
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, w.shape[1], generator=gen) * 0.01, torch.randn(w.shape[0], 2, generator=gen) * 0.01
    folder = tmp_path / "adapted"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["CureAdaptedDrafter"], "cure_adapter": {
        "base": str(base), "kind": "pard", "mask_token_id": 0, "rank": 2, "alpha": 4.0, "block_size": 4}}))
    save_file({f"{lin}.lora_A": a, f"{lin}.lora_B": b}, str(folder / "adapter.safetensors"))
    merged = dict(load_adapted(folder, dtype="bfloat16").model.named_modules())[lin].weight
    assert merged.dtype == torch.bfloat16
    assert torch.equal(merged, (w + 2.0 * (b @ a)).to(torch.bfloat16))
    loaded = load_pair(str(t), str(folder), draft_dtype="bfloat16")
    prompt = list(b"x = 1\n")
    ref = generate_ids(loaded.pair, DecodeConfig.of(strategy="ar", max_new_tokens=12), prompt)
    assert generate_ids(loaded.pair, DecodeConfig.of(strategy="cure", k=4, max_new_tokens=12), prompt) == ref


def test_a_pair_can_share_another_pairs_target(tmp_path):
    """load_pair(target_of=...): drafters loaded again in another dtype over the same target object,
    packed as that target is (benchmarks/peers.py's `draft_dtype=` variant)."""
    t, d = save_tiny_pair(tmp_path)
    first = load_pair(str(t), str(d), kernels="eager")
    other = load_pair(str(t), str(d), kernels="eager", draft_dtype="bfloat16", target_of=first)
    assert other.pair.target is first.pair.target and other.tokenizer is first.tokenizer
    assert other.pair.drafter.model is not first.pair.drafter.model and other.draft_dtype == "bfloat16"
    assert other.kernels == "eager" and not is_packed(other.pair.drafter.model)
    prompt = list(b"def h(z):\n")
    ref = generate_ids(first.pair, DecodeConfig.of(strategy="ar", max_new_tokens=12), prompt)
    assert generate_ids(other.pair, DecodeConfig.of(strategy="cure", k=4, max_new_tokens=12), prompt) == ref
