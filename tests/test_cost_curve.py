"""The verification cost curve survives a burst of other load on a shared machine."""
import itertools

from cure_core import budget
from cure_core.config import DecodeConfig


def test_a_burst_of_load_spoils_one_round_not_the_curve(target, monkeypatch):
    """Timed size after size, a burst that spans both repeats of the small sizes once lifted them above
    the large ones, and the monotone fit flattened the whole curve (every V as cheap as one token). In
    interleaved rounds the burst hits one round only; the least disturbed run per size is kept."""
    calls = itertools.count()
    sizes = [s for s in budget.SIZES if s <= 16] + ([16] if 16 not in budget.SIZES else [])
    per_round = len(sizes)

    def fake(lm, toks):
        i = next(calls)
        v = len(toks) - 1
        burst = per_round <= i < per_round + 4          # round 1, its first four sizes: other jobs ran
        return 10.0 + 2.0 * v + (5000.0 if burst else 0.0)

    monkeypatch.setattr(budget, "_time_forward", fake)
    curve = budget.measure_cost_curve(target, max_size=16, use_disk_cache=False)
    assert list(curve.sizes) == sizes
    assert list(curve.verify_ms) == [10.0 + 2.0 * v for v in sizes]
    assert next(calls) == per_round * 4                  # a warm-up round + 3 timed rounds, nothing else


def test_the_cache_key_names_the_method():
    """Curves cached by the size-after-size method are not reused: the key changed with the method."""
    from cure_core.tiny import tiny_target
    assert budget._model_key(tiny_target(seed=0), 128).endswith("|rounds|max|int8x2")


def test_an_int8_target_and_its_float32_twin_have_their_own_curves():
    """An int8 target's parameters are the float32 ones its linears did not take (the same count as a float32
    target's under packed kernels), so the key names the dtype its matmuls run in: each has its own curve."""
    import copy

    from cure_core.cpu_kernels import int8_target
    from cure_core.tiny import tiny_target
    f32 = tiny_target(seed=0)
    q = copy.deepcopy(f32)
    int8_target(q)
    k32, k8 = budget._model_key(f32, 128), budget._model_key(q, 128)
    assert k32 != k8 and "|float32|" in k32 and "|int8|" in k8


def test_a_curve_cached_without_the_small_sizes_is_measured_again(target, monkeypatch, private_cost_curves):
    """A curve cached when SIZES skipped 3, 5, 6 and 7 would price 5 nodes by interpolating between 4 and 8,
    across the step CPU kernels take at 7 rows; it is measured again, and a full one is reused."""
    import json
    key = budget._model_key(target, 128)
    old = {"sizes": [0, 1, 2, 4, 8, 12, 16], "verify_ms": [10.0, 10.0, 10.0, 10.0, 20.0, 21.0, 22.0]}
    private_cost_curves.write_text(json.dumps({key: old}))
    timed = []

    def fake(lm, toks):
        timed.append(len(toks) - 1)
        return 10.0 if len(toks) <= 6 else 20.0           # root + 5 nodes at one price, then the step
    monkeypatch.setattr(budget, "_time_forward", fake)
    curve = budget.measure_cost_curve(target, max_size=16)
    assert {3, 5, 6, 7} <= set(curve.sizes) and timed
    assert curve.verify(5) == 10.0 and curve.verify(6) == 20.0
    timed.clear()
    again = budget.measure_cost_curve(target, max_size=16)  # now cached with every size: no forward timed
    assert again.sizes == curve.sizes and not timed


def test_every_budget_up_to_the_block_is_a_candidate(pair):
    """The tuner may pick any tree size up to K-1 nodes (where a kernel step makes 5 nodes as cheap as 4),
    and the wider sizes above it."""
    from cure_core.engine import Engine
    cfg = DecodeConfig.of(strategy="cure", k=8, v_max=16, auto_budget=True)
    tuner = Engine(pair, cfg)._make_tuner(cfg)
    assert tuner.candidates == [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16]
    assert set(tuner.candidates) <= set(tuner.curve.sizes)
