"""The verification cost curve survives a burst of other load on a shared machine."""
import itertools

from cure_core import budget


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
    assert budget._model_key(tiny_target(seed=0), 128).endswith("|rounds")
