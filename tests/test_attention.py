"""cure_core/attention.py: grouped K/V attended without copies, same numbers as transformers' sdpa."""
import pytest
import torch
from transformers.integrations import sdpa_attention

from cure_core.attention import NAME, grouped_sdpa, stock_sdpa
from cure_core.lm import CachedLM
from cure_core.tiny import tiny_target


class Attn(torch.nn.Module):
    num_key_value_groups = 7
    is_causal = True


@pytest.mark.parametrize("q", [1, 4, 16])
def test_grouped_sdpa_equals_transformers_sdpa_and_skips_the_kv_copies(q, monkeypatch):
    gen = torch.Generator().manual_seed(q)
    query = torch.randn(1, 14, q, 64, generator=gen)
    key, value = torch.randn(2, 1, 2, 300, 64, generator=gen)
    mask = torch.rand(1, 1, q, 300, generator=gen) > 0.4
    mask[..., 0] = True                                      # every row sees something
    ref, _ = sdpa_attention.sdpa_attention_forward(Attn(), query, key, value, mask, scaling=0.125)
    copies = []
    repeat_kv = sdpa_attention.repeat_kv

    def counted(*args):
        copies.append(args[0].shape)
        return repeat_kv(*args)
    monkeypatch.setattr(sdpa_attention, "repeat_kv", counted)
    out, _ = grouped_sdpa(Attn(), query, key, value, mask, scaling=0.125)
    assert out.shape == ref.shape == (1, q, 14, 64)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    assert not copies                                        # q = 1: transformers packs; q > 1: enable_gqa


def test_cached_lm_switches_sdpa_models_and_tree_rows_equal_plain_forwards():
    model = tiny_target(seed=3)
    plain = tiny_target(seed=3)                              # the same weights, transformers' sdpa
    lm = CachedLM(model, kv="static", capacity=64)
    assert model.config._attn_implementation == NAME and plain.config._attn_implementation == "sdpa"
    ctx = list(range(10, 50))
    lm.prefill(ctx)
    fwd = lm.forward([5, 6, 7, 8], [-1, 0, 0, 2])            # a tree: 5 -> {6, 7 -> 8}
    for node, path in ((0, [5]), (1, [5, 6]), (2, [5, 7]), (3, [5, 7, 8])):
        want = plain(torch.tensor([ctx + path])).logits[0, -1]
        torch.testing.assert_close(fwd.logits[node], want, rtol=0, atol=1e-5)


def test_stock_sdpa_switches_grouped_models_back_for_its_block_only():
    grouped, eager = tiny_target(seed=0), tiny_target(seed=0)
    CachedLM(grouped, kv="static", capacity=16)
    eager.set_attn_implementation("eager")
    CachedLM(eager, kv="static", capacity=16)               # only sdpa models are switched
    assert eager.config._attn_implementation == "eager"
    with pytest.raises(RuntimeError), stock_sdpa([grouped, eager, None]):
        assert grouped.config._attn_implementation == "sdpa" and eager.config._attn_implementation == "eager"
        raise RuntimeError("a generation that fails")
    assert grouped.config._attn_implementation == NAME
