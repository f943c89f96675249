"""Int8Decoder: an int8 drafter's short passes run a flat float32 forward instead of transformers'. It must
write the same K/V rows and give the same decoder output as transformers' forward over the same int8 layers
(up to float rounding), on chains and trees, and hand long passes back to transformers on the same cache."""
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import cure_core.cpu_kernels as K
from cure_core.config import DecodeConfig
from cure_core.engine import generate_ids
from cure_core.int8_decoder import Int8Decoder, unsupported
from cure_core.lm import CachedLM
from cure_core.tiny import perturbed_copy, tiny_target

from conftest import make_pair

pytestmark = pytest.mark.skipif(not K.int8_kernels(), reason="this torch build has no fbgemm int8 matmuls")

SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, attn_implementation="sdpa")


def qwen2(**kw):
    return Qwen2ForCausalLM(Qwen2Config(**SMALL, **kw)).eval()


def llama(**kw):
    return LlamaForCausalLM(LlamaConfig(**SMALL, **kw)).eval()


def qwen3(**kw):
    return tiny_target(seed=3, **kw)


def int8_model(build, dtype=torch.float32, **kw):
    torch.manual_seed(0)
    m = build(**kw).to(dtype)
    K.pack_linears(m, int8=True)
    return m


def forwards(lm: CachedLM, flat: bool) -> list[torch.Tensor]:
    """Logits of a prefill, then chain steps, a 3-node tree under a scratch node, a commit and one more step."""
    keep = lm.int8_decoder()
    lm.int8 = keep if flat else None
    try:
        lm.reset()
        lm.prefill(list(range(5, 45)))                                  # 40 rows: transformers' forward
        out = [lm.forward([7], [-1]).logits, lm.forward([9], [0]).logits]
        out.append(lm.forward([11, 12, 13], [1, 0, 2]).logits)          # siblings under nodes 1 and 0
        lm.commit([0, 1])
        out.append(lm.forward([17, 18], [-1, 0]).logits)
        out.append(lm.forward(list(range(50, 70)), [-1] + list(range(2, 21))).logits)   # 20 rows: transformers'
        return out
    finally:
        lm.int8 = keep


@pytest.mark.parametrize("build", [qwen2, llama, qwen3])
def test_flat_forward_equals_transformers_forward_on_int8_layers(build):
    m = int8_model(build)
    lm = CachedLM(m, kv="static", capacity=64)
    assert lm.int8_decoder() is not None
    ref, got = forwards(lm, flat=False), forwards(lm, flat=True)
    for r, g in zip(ref, got):
        assert r.shape == g.shape
        assert (r - g).abs().max() < 1e-4 * max(1.0, r.abs().max())    # float32 both: rounding only


def test_flat_forward_runs_the_rows_it_is_given_only_and_the_dynamic_cache_too():
    m = int8_model(qwen2)
    static, dynamic = CachedLM(m, kv="static", capacity=64), CachedLM(m, kv="dynamic")
    for r, g in zip(forwards(static, flat=True), forwards(dynamic, flat=True)):
        assert (r - g).abs().max() < 1e-4 * max(1.0, r.abs().max())
    with pytest.raises(ValueError, match="up to 16 rows"):
        static.int8(torch.zeros((1, 17), dtype=torch.long), torch.ones((1, 1, 17, 17), dtype=torch.bool),
                    torch.arange(17)[None], static.cache)


@pytest.mark.skipif(not K.bf16_kernels(), reason="this CPU has no oneDNN bfloat16 kernels")
def test_flat_forward_of_a_bfloat16_network_stays_close_and_writes_bfloat16_rows():
    """A bfloat16 int8 network (what `--draft-dtype int8` loads where oneDNN runs bfloat16): the flat
    forward keeps a float32 residual stream, so it differs from transformers' by bfloat16 rounding only."""
    m = int8_model(qwen2, torch.bfloat16)
    lm = CachedLM(m, kv="static", capacity=64, head=False)
    lm.prefill(list(range(5, 25)))
    a = lm.forward([7, 8], [-1, 0]).last
    lm.rollback()
    lm.int8, keep = None, lm.int8_decoder()
    b = lm.forward([7, 8], [-1, 0]).last
    assert a.dtype == b.dtype == torch.bfloat16 and lm.cache.layers[0].keys.dtype == torch.bfloat16
    assert torch.nn.functional.cosine_similarity(a.float(), b.float()).min() > 0.99
    lm.int8 = keep


def test_which_models_it_runs():
    assert unsupported(int8_model(qwen2)) is None
    assert "not all Int8Linear" in unsupported(qwen2())                  # float layers: transformers' forward
    packed = qwen2()
    K.pack_linears(packed)
    assert "not all Int8Linear" in unsupported(packed)
    assert "sliding-window" in unsupported(int8_model(qwen2, use_sliding_window=True, max_window_layers=0))
    assert "hidden_act" in unsupported(int8_model(llama, hidden_act="gelu"))
    with pytest.raises(ValueError, match="Int8Decoder"):
        Int8Decoder(qwen2())
    assert CachedLM(qwen2(), kv="static").int8_decoder() is None
    late = qwen2()
    lm = CachedLM(late, kv="static")                  # load_pair packs a drafter after building it
    K.pack_linears(late, int8=True)
    assert lm.int8_decoder() is not None


@pytest.mark.parametrize("build", [qwen2, qwen3])
def test_every_strategy_equals_ar_with_a_flat_int8_drafter(build):
    """The drafter's chain steps and re-draft rows run Int8Decoder; the output stays the target's."""
    target = build()
    draft = perturbed_copy(target, noise=0.2)
    pair = make_pair(copy.deepcopy(target), draft)
    K.pack_linears(draft, int8=True)                  # after the drafters exist, as load_pair does
    assert pair.drafter.lm.int8_decoder() is not None and pair.ar_drafter.lm.int8_decoder() is not None
    for prompt in (list(range(10, 20)), [1, 2, 3, 4], list(range(100, 130, 3))):
        for k, v_max, auto in ((4, 3, False), (8, 12, False), (6, 30, True)):
            base = DecodeConfig.of(strategy="ar", k=k, v_max=v_max, auto_budget=auto, max_new_tokens=20, tau_margin=1.0)
            ref = generate_ids(pair, base, prompt)
            for strategy in ("sd", "parallel", "cure", "ddtree"):
                assert generate_ids(pair, base.with_(strategy=strategy), prompt) == ref, (strategy, prompt, k)


def test_an_ar_chain_redrafts_nothing_once_its_steps_run_int8():
    """ArDrafter.redraft_policy: 3 re-drafts where its steps run packed layers (4 rows cost about one), none
    where they run int8 layers (rows cost more there); a config's `redrafts` still overrides it."""
    from cure_core.drafters.causal import ArDrafter
    from cure_core.strategies import redraft_policy
    model = qwen2()
    K.pack_linears(model)
    assert ArDrafter(model).redraft_policy.count == 3
    model = int8_model(qwen2)
    chain = ArDrafter(model)
    assert chain.redraft_policy.count == 0
    assert redraft_policy(DecodeConfig.of(strategy="cure", redrafts=2), chain).count == 2


def test_the_peers_variant_int8_decoder_off_runs_transformers_forward_then_restores():
    """benchmarks/peers.py `STRATEGY:int8_decoder=off`: within a generation the drafters run transformers'
    forward (CachedLM.int8 None), and their Int8Decoder is back after it, also after an error."""
    from conftest import benchmark_script
    target = qwen2()
    draft = perturbed_copy(target, noise=0.2)
    pair = make_pair(target, draft)
    K.pack_linears(draft, int8=True)
    decs = [pair.drafter.lm.int8_decoder(), pair.ar_drafter.lm.int8_decoder()]
    with benchmark_script("peers") as peers:
        with peers.without_int8_decoder(pair, off=True):
            assert pair.drafter.lm.int8 is None and pair.ar_drafter.lm.int8 is None
            assert pair.ar_drafter.redraft_policy.count == 0      # the layers still run int8: only the forward A/Bs
            ref = generate_ids(pair, DecodeConfig.of(strategy="sd", k=6, max_new_tokens=12), [5, 6, 7])
        assert [pair.drafter.lm.int8, pair.ar_drafter.lm.int8] == decs
        with pytest.raises(RuntimeError), peers.without_int8_decoder(pair, off=True):
            raise RuntimeError("a failed generation")
        assert [pair.drafter.lm.int8, pair.ar_drafter.lm.int8] == decs
        with peers.without_int8_decoder(pair, off=False):
            assert pair.ar_drafter.lm.int8 is decs[1]
    assert generate_ids(pair, DecodeConfig.of(strategy="sd", k=6, max_new_tokens=12), [5, 6, 7]) == ref
