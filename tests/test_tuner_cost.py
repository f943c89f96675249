"""benchmarks/tuner_cost.py: the cost of the tuner's warm-up and exploration blocks."""
from conftest import benchmark_script

from cure_core.block import Block, Resync, Timings


def blk(ms, emitted, phase):
    return Block(index=0, strategy="cure", context_len=0, root=0, draft=(), margins=(), ufps=(), nodes=(), accepted=(),
                 winner=0, branch0_accepted=0, bonus=0, emitted=tuple(range(emitted)), resync=Resync("none", ()),
                 timings=Timings(verify_ms=ms), meta={"tuning": phase})


def test_tuning_cost_charges_probes_at_the_settled_rate():
    with benchmark_script("tuner_cost") as mod:
        # settled: 10 ms a token; a warm-up block of 50 ms for 2 tokens costs 30 ms extra, an exploration
        # block of 25 ms for 3 tokens paid for itself (-5 ms), an unpriced one of 30 ms for 1 token 20 ms
        blocks = [blk(50, 2, "warmup"), blk(20, 2, "settled"), blk(25, 3, "explore"), blk(30, 1, "unpriced"),
                  blk(40, 4, "settled")]
        r = mod.tuning_cost(blocks)
    assert r["decode_ms"] == 165 and abs(r["tuning_ms"] - 45) < 1e-9 and abs(r["share"] - 45 / 165) < 1e-9
    assert r["blocks"] == {"warmup": 1, "explore": 1, "unpriced": 1, "settled": 2} and r["tokens"] == 12


def test_blocks_say_why_the_tuner_chose_their_budget(pair):
    from cure_core.config import DecodeConfig
    from cure_core.engine import Engine
    blocks = list(Engine(pair).generate(list(b"def f(x):\n"), DecodeConfig(strategy="cure", k=5, max_new_tokens=60,
                                                                             auto_budget=True)))
    phases = [b.meta["tuning"] for b in blocks]
    assert phases[:2] == ["warmup", "warmup"] and set(phases) <= {"warmup", "explore", "unpriced", "settled"}
