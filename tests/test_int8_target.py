"""`--dtype int8`: an int8 target whose rows do not depend on the other rows of their pass, so every strategy
still equals `ar` token for token in int8 (cpu_kernels.RowInt8Linear, attention.exact_attention)."""
import copy
import dataclasses
import itertools

import pytest
import torch
from typer.testing import CliRunner

from cure_core.attention import EXACT, exact_attention, use_exact_attention
from cure_core.config import DecodeConfig
from cure_core.cpu_kernels import Int8Linear, RowInt8Linear, int8_kernels, int8_target, run_dtype
from cure_core.engine import Engine
from cure_core.errors import ModelLoadError
from cure_core.models import load_pair
from cure_core.tiny import byte_tokenizer, perturbed_copy

from conftest import make_pair

pytestmark = pytest.mark.skipif(not int8_kernels(), reason="this torch build has no fbgemm int8 matmuls")


def test_a_row_of_an_int8_target_layer_does_not_depend_on_its_pass():
    """Each row alone equals the same row in a pass of 2..40 rows, bit for bit, and stays near the float
    result. Control: fbgemm's dynamic linear (Int8Linear: one input scale per pass), which drafters use,
    does change a row with the rows beside it."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 80)
    row, dyn = RowInt8Linear(lin, keep_weight=False), Int8Linear(lin, keep_weight=False)
    x = torch.randn(40, 96) * torch.linspace(0.1, 8, 40)[:, None]      # rows of very different scales
    with torch.inference_mode():
        alone = torch.cat([row(x[i:i + 1]) for i in range(40)])
        for n in (2, 3, 5, 16, 17, 33, 40):
            assert torch.equal(row(x[:n]), alone[:n]), n
        ref = lin(x)
        assert ((alone - ref).norm(dim=1) / ref.norm(dim=1)).max() < 0.05
        dyn_alone = torch.cat([dyn(x[i:i + 1]) for i in range(16)])
        assert not torch.equal(dyn(x[:16]), dyn_alone)


def test_an_int8_target_row_keeps_its_small_channels_beside_an_outlier():
    """row_int8_matmul carries each row in two int8 levels (the row on the grid, then what the grid rounded
    off). Rows with one channel 300x the others (as Qwen2.5's hidden states have): one level's step is larger
    than the small channels and rounds most of them away; two levels keep the product within the int8
    weight's own rounding. Against the dequantized int8 weight, so only the activations' rounding counts."""
    from cure_core.cpu_kernels import ROW_STEP, ROW_ZERO, int8_rows, row_int8_matmul
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    q = int8_rows(w)
    packed = torch.ops.quantized.linear_prepack(q, None)
    x = torch.randn(8, 256) * 0.01
    x[:, 5] = 3.0                                                       # the outlier channel
    ref = x @ q.dequantize().T
    small = x.clone()
    small[:, 5] = 0.0
    small_part = (small @ q.dequantize().T).norm()                     # what the small channels contribute
    with torch.inference_mode():
        two = row_int8_matmul(x, packed)
        scale = x.abs().amax(1, keepdim=True)
        one = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            (x / scale).contiguous(), ROW_STEP, ROW_ZERO, packed) * scale   # the one-level rule
    assert (one - ref).norm() > 0.3 * small_part                      # one level loses most of them
    assert (two - ref).norm() < 0.01 * small_part                     # two keep them


def test_exact_attention_rows_do_not_depend_on_their_pass():
    """A tree's rows (query heads grouped over K/V heads, each row seeing its own keys) equal each row run
    alone over the same keys, bit for bit, and sdpa's result within float32 rounding."""
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 4, 6, 16), torch.randn(1, 2, 30, 16), torch.randn(1, 2, 30, 16)
    mask = torch.zeros(1, 1, 6, 30, dtype=torch.bool)
    mask[..., :24] = True                                   # the committed prefix
    for i, seen in enumerate([[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4], [0, 1, 3, 5]]):
        mask[0, 0, i, [24 + j for j in seen]] = True        # each node sees its ancestors and itself
    module = torch.nn.Module()
    out, _ = exact_attention(module, q, k, v, mask)         # [1, 6, 4, 16]
    for i in range(6):
        one, _ = exact_attention(module, q[:, :, i:i + 1], k, v, mask[:, :, i:i + 1])
        assert torch.equal(one[:, 0], out[:, i]), i
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.allclose(out.transpose(1, 2), ref, atol=1e-6)
    # no mask (transformers leaves out a plainly causal one): causal, the rows being the last of the keys
    out, _ = exact_attention(module, q, k, v, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :6], v[:, :, :6], is_causal=True, enable_gqa=True)
    assert torch.allclose(exact_attention(module, q, k[:, :, :6], v[:, :, :6], None)[0].transpose(1, 2), ref, atol=1e-6)
    assert torch.equal(out, exact_attention(module, q, k, v, torch.ones(6, 30, dtype=torch.bool).tril(24)[None, None])[0])


def _int8(model):
    model = copy.deepcopy(model)
    int8_target(model)
    use_exact_attention(model)
    return model


CONFIGS = [dict(k=4, v_max=3), dict(k=8, v_max=16), dict(k=8, v_max=32, redrafts=2),
           dict(k=6, v_max=12, cure_tree="paper"), dict(k=8, v_max=24, auto_budget=True)]
PROMPTS = [[1, 2, 3], [40, 41, 42, 43, 44, 45], list(range(100, 120)), [7] * 9]


@pytest.mark.parametrize("noise", ["mild", "strong"])
def test_every_strategy_equals_ar_in_int8(target, drafts, noise):
    """Over an int8 target, sd, parallel, cure (over the block drafter and over the chain) and ddtree emit
    ar's int8 tokens, on 4 prompts x 5 configs; and int8 really is another target than float32 (it decodes
    other tokens somewhere)."""
    t8 = _int8(target)
    assert run_dtype(t8) == "int8" and t8.config._attn_implementation == EXACT
    pair = make_pair(t8, drafts[noise])
    chained = dataclasses.replace(pair, chain_strategies=frozenset({"sd", "cure"}))
    differs = False
    for prompt, conf in itertools.product(PROMPTS, CONFIGS):
        conf = dict(conf, max_new_tokens=32)
        ref = [t for b in Engine(pair, DecodeConfig.of(strategy="ar", **conf)).generate(prompt) for t in b.emitted]
        f32 = [t for b in Engine(make_pair(target, drafts[noise]), DecodeConfig.of(strategy="ar", **conf))
               .generate(prompt) for t in b.emitted]
        differs |= f32 != ref
        for strategy, on in [(s, pair) for s in ("sd", "parallel", "cure", "ddtree")] + [("cure", chained)]:
            out = [t for b in Engine(on, DecodeConfig.of(strategy=strategy, **conf)).generate(prompt) for t in b.emitted]
            assert out == ref, f"{strategy} diverged from int8 ar on {prompt} with {conf}"
    assert differs


@pytest.fixture(scope="module")
def saved(target, drafts, tmp_path_factory):
    root = tmp_path_factory.mktemp("int8")
    tok = byte_tokenizer()
    for name, model in (("target", target), ("draft", perturbed_copy(target, noise=0.2, seed=3))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


def test_load_pair_int8_quantizes_the_target_and_refuses_what_cannot_run(saved):
    loaded = load_pair(str(saved / "target"), str(saved / "draft"), drafter="ar", dtype="int8")
    target = loaded.pair.target
    assert run_dtype(target) == "int8"
    assert all(not isinstance(m, torch.nn.Linear) for m in target.modules())   # the head too
    assert isinstance(target.get_output_embeddings(), RowInt8Linear)
    assert loaded.draft_dtype == "int8"                     # a drafter follows the target unless told
    out = loaded.generate([5, 6, 7], strategy="sd", max_new_tokens=12)
    assert out.token_ids == loaded.generate([5, 6, 7], strategy="ar", max_new_tokens=12).token_ids
    with pytest.raises(ModelLoadError, match="int8 targets run on packed kernels"):
        load_pair(str(saved / "target"), dtype="int8", kernels="eager")
    with pytest.raises(ModelLoadError, match="unknown dtype 'int4'; choose one of .*int8"):
        load_pair(str(saved / "target"), dtype="int4")


def test_cli_names_int8_and_refuses_an_unknown_dtype_in_one_line(saved):
    from cure_cli.main import app
    res = CliRunner().invoke(app, ["generate", "hi", "--target", str(saved / "target"), "--dtype", "int4", "-n", "2"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "unknown dtype 'int4'" in res.output and len(res.output.strip().splitlines()) == 1
    assert "int8" in CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"}).output


def test_a_dflash_drafter_under_an_int8_target_runs_its_layers_as_int8_networks_load(tmp_path):
    """--draft-dtype auto under an int8 target: a DFlash drafter's layers load in int8_network_dtype()
    (bfloat16 where oneDNN runs it natively), told dtypes stay as told, and every strategy equals int8 ar."""
    from cure_core.models import int8_network_dtype
    from cure_core.tiny import tiny_target
    from test_dflash import write_dflash
    target = tiny_target(seed=0)
    target.save_pretrained(tmp_path / "target")
    byte_tokenizer().save_pretrained(tmp_path / "target")
    draft = write_dflash(tmp_path / "draft", target)
    loaded = load_pair(str(tmp_path / "target"), str(draft), dtype="int8", draft_dtype="auto")
    assert loaded.draft_dtype == int8_network_dtype()
    assert {p.dtype for p in loaded.pair.drafter.model.layers.parameters()} == {getattr(torch, int8_network_dtype())}
    told = load_pair(str(tmp_path / "target"), str(draft), dtype="int8", draft_dtype="float32")
    assert told.draft_dtype == "float32"
    prompt = list(b"def f(x):\n")
    ref = loaded.generate(prompt, strategy="ar", max_new_tokens=16).token_ids
    for strategy in ("parallel", "cure", "ddtree"):
        assert loaded.generate(prompt, strategy=strategy, k=6, max_new_tokens=16).token_ids == ref, strategy


@pytest.mark.real_models
def test_every_strategy_equals_ar_in_int8_on_the_real_default_pair():
    """The embedded 0.5B in int8 with its shipped DFlash drafter: cure, ddtree and parallel emit int8 ar's
    tokens on three held-out prompts (code, math, prose). This is the check that needs exact_attention:
    with sdpa's one-row and tree kernels, cure left ar within 64 tokens here (the tiny models above do
    not show it)."""
    from cure_core import load
    from cure_core.catalog import DEFAULT_TARGET
    from cure_core.embedded import model_status
    if not model_status(DEFAULT_TARGET).cached:
        pytest.skip(f"{DEFAULT_TARGET} is not cached")
    torch.set_num_threads(2)
    pair = load(dtype="int8")
    assert run_dtype(pair.pair.target) == "int8"
    prompts = ["def running_max(xs: list[int]) -> list[int]:\n    \"\"\"Return the running maximum of xs.\"\"\"\n",
               "A baker sells 14 loaves a day for 6 days and gives away 9. How many loaves did he sell in all?",
               "Explain in two sentences why the sky looks blue."]
    for prompt in prompts:
        ref = pair.generate(prompt, strategy="ar", max_new_tokens=48).token_ids
        for strategy in ("cure", "ddtree", "parallel"):
            assert pair.generate(prompt, strategy=strategy, max_new_tokens=48).token_ids == ref, (strategy, prompt)


def test_an_int8_target_runs_one_flat_forward_for_every_pass(target):
    """CachedLM runs an int8 target through Int8Decoder (exact) for every pass, hidden states (a DFlash
    drafter's features) and prefill included: a chain of 6 rows in one pass gives each row the logits and
    hidden states of six one-row passes, bit for bit, close to transformers' forward of the same layers."""
    from cure_core.lm import CachedLM
    t8 = _int8(target)
    toks = [3, 17, 42, 99, 7, 250]
    whole = CachedLM(t8, hidden_layers=(0, 1, 2))
    assert whole.int8_decoder() is not None and whole.int8_decoder().exact
    whole.prefill([1, 2])
    fw = whole.forward(toks, [-1] + list(range(len(toks) - 1)))
    steps = CachedLM(t8, hidden_layers=(0, 1, 2))
    steps.prefill([1, 2])
    rows, hidden = [], []
    for i, t in enumerate(toks):
        f = steps.forward([t], [i - 1])
        rows.append(f.logits)
        hidden.append(f.hidden)
    assert torch.equal(fw.logits, torch.cat(rows)) and torch.equal(fw.hidden, torch.cat(hidden))
    ids = torch.tensor([[1, 2] + toks])
    with torch.inference_mode():
        ref = t8(input_ids=ids, output_hidden_states=True)         # transformers' forward, same int8 layers
    assert torch.allclose(fw.logits, ref.logits[0, 2:].float(), atol=1e-3)
    assert torch.allclose(fw.hidden, torch.cat([ref.hidden_states[i][0, 2:] for i in (0, 1, 2)], -1), atol=1e-4)
