"""Draft vocabularies for causal drafters (ArDrafter / PardDrafter): the head over a subset of ids."""
import pytest
import torch

from cure_core.config import DecodeConfig
from cure_core.cpu_kernels import pack_linears
from cure_core.drafters.causal import ArDrafter, PardDrafter
from cure_core.drafters.vocab import lowest_ids
from cure_core.engine import ModelPair, generate_ids
from cure_core.tiny import BYTE_VOCAB, MASK_ID, perturbed_copy

LOW = 100          # ids 0-99: digits and punctuation, no lowercase letter past 'c'
PROMPTS = [list(b"def fibonacci(n):\n    "), list(b"x = [1, 2, 3]\nprint(x"), list(b"class A:\n")]


def vocab_pair(target, draft):
    ids = lowest_ids(LOW, BYTE_VOCAB)
    return ModelPair(target=target, drafter=PardDrafter(draft, MASK_ID, vocab_size=BYTE_VOCAB, draft_vocab=ids),
                     ar_drafter=ArDrafter(draft, vocab_size=BYTE_VOCAB, draft_vocab=ids))


@pytest.mark.parametrize("strategy", ["sd", "parallel", "cure", "ddtree"])
def test_every_strategy_is_lossless_with_a_causal_draft_vocabulary(target, drafts, strategy):
    pair = vocab_pair(target, drafts["mild"])
    for prompt in PROMPTS:
        for conf in (dict(k=4, v_max=12), dict(k=8, v_max=32, tau_margin=3.0, max_ufps=2)):
            ar = generate_ids(pair, DecodeConfig.of(strategy="ar", max_new_tokens=20, **conf), prompt)
            assert generate_ids(pair, DecodeConfig.of(strategy=strategy, max_new_tokens=20, **conf), prompt) == ar


@pytest.mark.parametrize("kind", ["ar", "pard"])
def test_scores_are_the_full_heads_columns_and_proposals_stay_inside(target, drafts, kind):
    draft = drafts["mild"]
    make = (lambda **kw: ArDrafter(draft, vocab_size=BYTE_VOCAB, **kw)) if kind == "ar" else \
        (lambda **kw: PardDrafter(draft, MASK_ID, vocab_size=BYTE_VOCAB, **kw))
    full, cut = make(), make(draft_vocab=lowest_ids(LOW, BYTE_VOCAB))
    context = list(b"def xyz(q):\n")
    for d in (full, cut):
        d.reset(context[:-1], None)
    assert set(cut.vocab.ids.tolist()) == set(range(LOW)) | set(context)       # the context's ids join
    p_full, p_cut = full.propose(context[-1], 5, 4), cut.propose(context[-1], 5, 4)
    assert set(p_cut.top_ids.flatten().tolist()) <= set(cut.vocab.ids.tolist())
    # Where the full drafter's pick is proposable, the cut one picks the same token (same logits,
    # renormalised over fewer ids); a PARD block's positions are independent, so every such one.
    ids = set(cut.vocab.ids.tolist())
    for i, t in enumerate(p_full.tokens if kind == "pard" else p_full.tokens[:1]):
        if t in ids:
            assert p_cut.tokens[i] == t
    # The subset head's logits equal the full head's columns.
    fwd_full = full.lm.forward([5, 6], [-1, 0])
    fwd_cut = cut.lm.forward([5, 6], [-1, 0])
    torch.testing.assert_close(cut._scores(fwd_cut, slice(None)), fwd_full.logits[:, cut.vocab.ids],
                               atol=1e-5, rtol=1e-5)
    full.lm.rollback(), cut.lm.rollback()
    cut.reset([], None)
    assert set(cut.vocab.ids.tolist()) == set(range(LOW))                       # a reset forgets them


def test_the_vocabulary_follows_a_head_packed_after_loading(target):
    draft = perturbed_copy(target, noise=0.2, seed=5)
    d = ArDrafter(draft, vocab_size=BYTE_VOCAB, draft_vocab=lowest_ids(LOW, BYTE_VOCAB))
    d.reset(list(b"ab"), None)
    before = d.propose(ord("c"), 4, 4)
    pack_linears(draft)                                   # swaps lm_head for a packed module
    d.reset(list(b"ab"), None)
    after = d.propose(ord("c"), 4, 4)
    assert d.vocab._head[0] is draft.get_output_embeddings()
    assert after.tokens == before.tokens
    torch.testing.assert_close(after.top_logprobs, before.top_logprobs, atol=1e-4, rtol=1e-4)


def test_load_pair_gives_every_causal_drafter_the_vocabulary(tmp_path):
    from cure_core.errors import ModelLoadError
    from cure_core.models import load_pair
    from cure_core.tiny import save_tiny_pair
    t, d = save_tiny_pair(tmp_path)
    pair = load_pair(str(t), str(d), drafter="pard", ar_draft=str(d), draft_vocab=100).pair
    for drafter in (pair.drafter, pair.ar_drafter):
        assert drafter.vocab is not None and drafter.vocab.ids.tolist() == list(range(100))
    assert MASK_ID not in load_pair(str(t), str(d), draft_vocab=BYTE_VOCAB).pair.drafter.vocab.ids.tolist()
    assert load_pair(str(t), str(d)).pair.drafter.vocab is None                  # 0: the whole vocabulary
    with pytest.raises(ModelLoadError, match="draft_vocab"):
        load_pair(str(t), str(d), draft_vocab=-1)
