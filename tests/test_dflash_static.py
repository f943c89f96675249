"""DFlash block passes over static shapes (DFlashDrafter.compile_for, run by the engine's compiled generations):
the same rows as plain passes, padded block counts, fixed buffers, the engine's wiring, and (one real
torch.compile on this CPU) the compiled network's proposals."""
import torch

from cure_core.config import DecodeConfig
from cure_core.drafters import dflash as dflash_module
from cure_core.drafters.dflash import STATIC_BLOCKS, load_dflash
from cure_core.engine import ModelPair, generate_ids
from cure_core.tiny import BYTE_VOCAB
from test_dflash import ckpt, dtarget, target_features  # noqa: F401 -- the tiny target and checkpoint fixtures

PROMPT = list(b"def add(a, b):\n    return a")


def fresh(ckpt, dtarget, context=PROMPT):
    d = load_dflash(ckpt, dtarget, vocab_size=BYTE_VOCAB)
    d.reset(context[:-1], target_features(dtarget, context[:-1], d.target_layer_ids))
    return d


def test_static_passes_compute_the_plain_rows(ckpt, dtarget):
    """A proposal and re-draft passes of 1-3 branches (3 pad to 4 blocks) give the plain pass's logits, over
    buffers sized for the generation (capacity >> context: the masked columns weigh nothing)."""
    plain, static = fresh(ckpt, dtarget), fresh(ckpt, dtarget)
    static.compile_for(512, compile=False)
    assert static.static and static._rows[0][0].shape[1] == 512 and plain._rows[0][0].shape[1] == 256
    root = PROMPT[-1]
    a, b = plain.propose(root, 7, 6), static.propose(root, 7, 6)
    assert torch.equal(a.top_ids, b.top_ids) and torch.allclose(a.top_logprobs, b.top_logprobs, atol=1e-5)
    for count in (1, 2, 3):
        prefixes = [[a.top_ids[0, j].item()] for j in range(count)]
        pa = plain.redraft_topk(prefixes, [6] * count, 6)
        pb = static.redraft_topk(prefixes, [6] * count, 6)
        for x, y in zip(pa, pb):
            assert torch.equal(x.top_ids, y.top_ids) and torch.allclose(x.top_logprobs, y.top_logprobs, atol=1e-5)
    assert (3 > STATIC_BLOCKS[1]) and (4, 8) in static._blockdiag          # 3 branches padded to 4 blocks of 8
    # the context grows inside the fixed buffers (no reallocation: a compiled graph holds their addresses)
    buf = static._rows[0][0].data_ptr()
    more = list(b" + b")
    for d in (plain, static):
        d.advance([root] + more, target_features(dtarget, PROMPT + more, d.target_layer_ids)[-len(more) - 1:])
    a, b = plain.propose(more[-1], 7, 6), static.propose(more[-1], 7, 6)
    assert torch.equal(a.top_ids, b.top_ids) and static._rows[0][0].data_ptr() == buf
    static.compile_for(None)
    assert not static.static


def test_the_engine_compiles_the_drafter_for_compiled_generations_only(ckpt, dtarget, monkeypatch):
    """`compile`: the engine sizes the drafter's static passes for the generation and compiles its network
    (torch.compile stood in for by a recorder here: the real one below); other generations run plain passes.
    Every output equals ar's."""
    compiled = []

    def fake_compile(model, **kw):
        compiled.append(kw)
        return lambda *a, **k: model(*a, **k)
    monkeypatch.setattr(torch, "compile", fake_compile)
    drafter = load_dflash(ckpt, dtarget, vocab_size=BYTE_VOCAB)
    pair = ModelPair(target=dtarget, drafter=drafter)
    statics = []
    pass_ = drafter._static_blocks
    monkeypatch.setattr(drafter, "_static_blocks", lambda blocks: statics.append(len(blocks)) or pass_(blocks))
    base = dict(max_new_tokens=24, stop_at_eos=False, k=8)
    ref = generate_ids(pair, DecodeConfig.of(strategy="ar", **base), PROMPT)
    for strategy in ("parallel", "ddtree", "cure"):
        assert generate_ids(pair, DecodeConfig.of(strategy=strategy, v_max=12, compile=True, **base), PROMPT) == ref
    assert drafter.static and drafter.net is not drafter.model and len(compiled) >= 1
    assert statics and all(n <= STATIC_BLOCKS[-1] for n in statics)
    assert drafter._rows[0][0].shape[1] >= len(PROMPT) + 24
    seen = len(statics)
    assert generate_ids(pair, DecodeConfig.of(strategy="cure", v_max=12, **base), PROMPT) == ref
    assert not drafter.static and len(statics) == seen                   # a plain generation: plain passes


def test_a_really_compiled_network_proposes_what_the_plain_one_does(ckpt, dtarget):
    """One real torch.compile (inductor on this CPU; CUDA graphs on a GPU) of the DFlash network over static
    shapes: its proposals equal a plain drafter's."""
    plain, comp = fresh(ckpt, dtarget), fresh(ckpt, dtarget)
    comp.compile_for(256)
    assert comp.net is not comp.model and not comp.graphs
    a, b = plain.propose(PROMPT[-1], 7, 6), comp.propose(PROMPT[-1], 7, 6)
    assert torch.equal(a.top_ids, b.top_ids) and torch.allclose(a.top_logprobs, b.top_logprobs, atol=1e-4)
    assert dflash_module.STATIC_BLOCKS[0] == 1
