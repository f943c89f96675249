"""The cross-turn cache (Engine.generate(..., reuse_prefix=True)): a chat turn prefills only the tokens
its prompt does not share with what the caches hold, and decodes exactly as a fresh prefill would."""
import pytest
import torch

from cure_core.config import DecodeConfig
from cure_core.drafters.dflash import load_dflash
from cure_core.engine import Engine, GenerationError, ModelPair
from cure_core.lm import CachedLM
from cure_core.tiny import BYTE_VOCAB

from conftest import make_pair
from test_dflash import write_dflash

STRATEGIES = ("ar", "sd", "parallel", "cure", "ddtree")


def emitted(blocks):
    return [t for b in blocks for t in b.emitted]


def converse(engine, pair, cfg, turns, edit_at=None):
    """Turns of a chat: each prompt is the last prompt + its answer + new user tokens (turn `edit_at`
    rewrites an earlier part instead, as an edited message does). Returns, per turn, (blocks with the
    cache, the output of a fresh prefill, the prompt)."""
    prompt = list(b"Hi! Write a loop.")
    out = []
    for turn in range(turns):
        if turn == edit_at:
            prompt = prompt[:5] + list(b"edited") + prompt[5:]
        blocks = list(engine.generate(prompt, cfg, reuse_prefix=True))
        fresh = emitted(Engine(pair).generate(prompt, cfg))
        out.append((blocks, fresh, list(prompt)))
        prompt = prompt + emitted(blocks) + list(f" and turn {turn}".encode())
    return out


@pytest.mark.parametrize("kv", ["static", "dynamic"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_turns_equal_a_fresh_prefill_and_prefill_only_new_tokens(target, drafts, strategy, kv):
    pair = make_pair(target, drafts["mild"])
    cfg = DecodeConfig.of(strategy=strategy, k=6, max_new_tokens=16, v_max=24, kv_cache=kv)
    engine = Engine(pair)
    turns = converse(engine, pair, cfg, 4)
    for n, (blocks, fresh, prompt) in enumerate(turns):
        assert emitted(blocks) == fresh, f"turn {n}"
        t = blocks[0].timings
        assert t.prefill_tokens + t.reused_tokens == len(prompt) - 1
        if n:
            # Rule: what the caches hold is the last prompt and its answer but the last emitted token
            # (the bonus is verified by the next forward, never committed): everything else is reused.
            last_blocks, _, last_prompt = turns[n - 1]
            assert t.reused_tokens == len(last_prompt) + len(emitted(last_blocks)) - 1
            assert t.prefill_tokens == len(prompt) - 1 - t.reused_tokens == len(f" and turn {n - 1}")
        assert all(b.timings.prefill_tokens == 0 for b in blocks[1:])


@pytest.mark.parametrize("conf", [dict(auto_budget=True, v_max=32), dict(resync=False), dict(keep_branch0=False),
                                  dict(cure_tree="paper", tau_margin=3.0), dict(temperature=0.8, seed=3)])
def test_other_configs_equal_a_fresh_prefill(target, drafts, conf):
    pair = make_pair(target, drafts["strong"])
    cfg = DecodeConfig.of(strategy="cure", k=5, max_new_tokens=12, **{"v_max": 16, **conf})
    for n, (blocks, fresh, _) in enumerate(converse(Engine(pair), pair, cfg, 3)):
        assert emitted(blocks) == fresh, f"turn {n}"


def test_an_edited_turn_reuses_the_prefix_before_the_edit(target, drafts):
    pair = make_pair(target, drafts["mild"])
    cfg = DecodeConfig.of(strategy="cure", k=6, max_new_tokens=12, v_max=24)
    turns = converse(Engine(pair), pair, cfg, 3, edit_at=2)
    blocks, fresh, prompt = turns[2]
    assert emitted(blocks) == fresh
    assert blocks[0].timings.reused_tokens == 5                     # up to the edit, not past it
    assert blocks[0].timings.prefill_tokens == len(prompt) - 1 - 5


def test_switching_strategy_or_models_starts_clean(target, drafts):
    pair = make_pair(target, drafts["mild"])
    cfg = DecodeConfig.of(strategy="cure", k=6, max_new_tokens=12, v_max=24)
    engine = Engine(pair)
    prompt = list(b"def f(x):")
    first = list(engine.generate(prompt, cfg, reuse_prefix=True))
    longer = prompt + emitted(first) + list(b" more")
    # the same drafter and target cache (cure -> ddtree): reused, and still the fresh output
    dd = list(engine.generate(longer, cfg.with_(strategy="ddtree"), reuse_prefix=True))
    assert dd[0].timings.reused_tokens > 0
    assert emitted(dd) == emitted(Engine(pair).generate(longer, cfg.with_(strategy="ddtree")))
    # sd drafts with the chain drafter: its state is not the one cached -> a full prefill
    sd = list(engine.generate(longer, cfg.with_(strategy="sd"), reuse_prefix=True))
    assert sd[0].timings.reused_tokens == 0 and emitted(sd) == emitted(dd)
    # and back to cure: the block drafter's state is stale (sd ran in between) -> a full prefill again
    back = list(engine.generate(longer, cfg, reuse_prefix=True))
    assert back[0].timings.reused_tokens == 0 and emitted(back) == emitted(dd)
    # a generation without reuse_prefix (calibration, bench) drops what was kept
    list(engine.generate(prompt, cfg.with_(strategy="ar")))
    again = list(engine.generate(longer, cfg, reuse_prefix=True))
    assert again[0].timings.reused_tokens == 0
    # another model: another Engine, nothing shared
    other = Engine(make_pair(target, drafts["strong"]))
    assert list(other.generate(longer, cfg, reuse_prefix=True))[0].timings.reused_tokens == 0
    engine.forget_prefix()
    assert list(engine.generate(longer, cfg, reuse_prefix=True))[0].timings.reused_tokens == 0


def test_a_stopped_turn_keeps_its_blocks_and_an_error_drops_them(target, drafts):
    pair = make_pair(target, drafts["mild"])
    cfg = DecodeConfig.of(strategy="cure", k=4, max_new_tokens=30, v_max=24)
    engine = Engine(pair)
    prompt = list(b"count: 1 2 3")
    gen = engine.generate(prompt, cfg, reuse_prefix=True)
    got = [next(gen), next(gen)]
    gen.close()                                                     # Esc in the chat: stopped between blocks
    longer = prompt + emitted(got) + list(b"!")
    blocks = list(engine.generate(longer, cfg, reuse_prefix=True))
    assert blocks[0].timings.reused_tokens == len(prompt) + len(emitted(got)) - 1
    assert emitted(blocks) == emitted(Engine(pair).generate(longer, cfg))
    with pytest.raises(GenerationError):
        list(engine.generate([], cfg, reuse_prefix=True))
    assert list(engine.generate(longer, cfg, reuse_prefix=True))[0].timings.reused_tokens == 0


def test_truncate_keeps_exactly_a_fresh_prefills_rows(target):
    ids = list(b"the quick brown fox")
    for kv in ("static", "dynamic"):
        lm = CachedLM(target, kv=kv)
        lm.prefill(ids)
        lm.forward([5, 6], [-1, 0])                                 # scratch rows are dropped too
        lm.truncate(7)
        assert lm.committed == 7 and lm.scratch == 0
        tail = lm.prefill(ids[7:]).logits
        fresh = CachedLM(target, kv=kv)
        fresh.prefill(ids[:7])
        torch.testing.assert_close(tail, fresh.prefill(ids[7:]).logits, rtol=0, atol=1e-5)
        with pytest.raises(ValueError):
            lm.truncate(lm.committed + 1)


@pytest.fixture(scope="module")
def dflash_pair(tmp_path_factory):
    from cure_core.tiny import tiny_target
    dtarget = tiny_target(seed=0)
    drafter = load_dflash(write_dflash(tmp_path_factory.mktemp("dflash") / "draft", dtarget), dtarget,
                          vocab_size=BYTE_VOCAB)
    return ModelPair(target=dtarget, drafter=drafter, eos_ids=())


@pytest.mark.parametrize("strategy", ("parallel", "cure", "ddtree"))
def test_dflash_turns_equal_a_fresh_prefill(dflash_pair, strategy):
    cfg = DecodeConfig.of(strategy=strategy, k=8, max_new_tokens=14, v_max=24)
    for n, (blocks, fresh, prompt) in enumerate(converse(Engine(dflash_pair), dflash_pair, cfg, 3, edit_at=2)):
        assert emitted(blocks) == fresh, f"turn {n}"
        if n == 1:
            assert blocks[0].timings.prefill_tokens == len(" and turn 0")


@pytest.mark.parametrize("strategy", ("sd", "cure"))
def test_a_draft_vocabulary_is_rebuilt_from_the_kept_prefix(target, drafts, strategy):
    from cure_core.models import build_pair
    from cure_core.tiny import MASK_ID
    pair, _ = build_pair(target, drafts["mild"], drafter="pard", mask_token_id=MASK_ID, vocab_size=BYTE_VOCAB,
                         draft_vocab=100)
    cfg = DecodeConfig.of(strategy=strategy, k=6, max_new_tokens=12, v_max=24)
    engine = Engine(pair)
    for n, (blocks, fresh, _) in enumerate(converse(engine, pair, cfg, 3, edit_at=2)):
        assert emitted(blocks) == fresh, f"turn {n}"
    drafter = pair.drafter_for(strategy)
    fresh_ids = list(drafter.vocab.ids.tolist())
    drafter.truncate(len(drafter.context))                          # a no-op truncation rebuilds the same ids
    assert drafter.vocab.ids.tolist() == fresh_ids


def test_a_generation_left_open_never_takes_the_caches_back(target, drafts):
    """A reuse_prefix generation abandoned without close() while a newer one runs (then closed late, e.g.
    by the garbage collector) must not hand its stale token lists to the next turn."""
    pair = make_pair(target, drafts["mild"])
    cfg = DecodeConfig.of(strategy="cure", k=4, max_new_tokens=12, v_max=24)
    engine = Engine(pair)
    prompt = list(b"abandon me")
    old = engine.generate(prompt, cfg, reuse_prefix=True)
    next(old)                                                       # started, then left open
    other = list(b"something else entirely")
    newer = list(engine.generate(other, cfg, reuse_prefix=True))
    old.close()                                                     # late: the newer one owns the caches
    longer = other + emitted(newer) + list(b"!")
    blocks = list(engine.generate(longer, cfg, reuse_prefix=True))
    assert blocks[0].timings.reused_tokens == len(other) + len(emitted(newer)) - 1
    assert emitted(blocks) == emitted(Engine(pair).generate(longer, cfg))
