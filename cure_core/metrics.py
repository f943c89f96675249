"""Summary statistics over Block records (names as vLLM uses them; DESIGN.md "Metrics")."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from .block import Block


@dataclass(frozen=True)
class GenerationStats:
    strategy: str
    new_tokens: int
    blocks: int                  # target forwards (prefill excluded)
    tau: float                   # acceptance length: emitted tokens per target forward, bonus included
    tpot_ms: float               # decode time per emitted token, prefill excluded
    tokens_per_s: float
    repair_win_rate: float       # blocks where a repair branch beat branch 0 / blocks
    mean_tree_size: float        # mean V(T)
    max_tree_size: int
    prefill_ms: float
    decode_ms: float
    draft_ms: float
    tree_ms: float
    verify_ms: float
    commit_ms: float
    learn_ms: float

    def to_dict(self) -> dict:
        return asdict(self)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def summarize(blocks: Sequence[Block]) -> GenerationStats:
    n = len(blocks)
    new = sum(len(b.emitted) for b in blocks)
    t = [b.timings for b in blocks]
    decode = sum(x.total_ms for x in t)
    return GenerationStats(
        strategy=blocks[0].strategy if blocks else "",
        new_tokens=new, blocks=n,
        tau=new / n if n else 0.0,
        tpot_ms=decode / new if new else 0.0,
        tokens_per_s=1e3 * new / decode if decode > 0 else 0.0,
        repair_win_rate=sum(b.repair_won for b in blocks) / n if n else 0.0,
        mean_tree_size=sum(b.tree_size for b in blocks) / n if n else 0.0,
        max_tree_size=max((b.tree_size for b in blocks), default=0),
        prefill_ms=sum(x.prefill_ms for x in t), decode_ms=decode,
        draft_ms=sum(x.draft_ms for x in t), tree_ms=sum(x.tree_ms for x in t),
        verify_ms=sum(x.verify_ms for x in t), commit_ms=sum(x.commit_ms for x in t),
        learn_ms=sum(x.learn_ms for x in t),
    )


def ceiling_speedup(tau: float, ar_ms_per_token: float, verify_ms_per_block: float) -> float | None:
    """The speedup over ar a run would reach if drafting and every non-model step were free:
    tau tokens per block, each block costing only its target verification."""
    if tau > 0 and ar_ms_per_token > 0 and verify_ms_per_block > 0:
        return tau * ar_ms_per_token / verify_ms_per_block
    return None


def per_position_acceptance(blocks: Sequence[Block], depth: int) -> list[float]:
    """Rate at which the winning path reached depth d (d = 1..depth), over blocks that drafted that deep."""
    rates = []
    for d in range(1, depth + 1):
        eligible = [b for b in blocks if len(b.draft) >= d]
        rates.append(sum(b.accept_length >= d for b in eligible) / len(eligible) if eligible else 0.0)
    return rates


# ---------------------------------------------------------------- the order runs take in a benchmark

ORDERS = ("balanced", "fixed")


def balanced_order(n: int, i: int) -> list[int]:
    """The order n runs take on the i-th prompt: row i (mod the row count) of a Williams design, a Latin
    square balanced for first-order carryover. Rule: over a full cycle of rows (n prompts, 2n when n is
    odd) every run goes once in each position and directly after every other run equally often, so what
    one generation leaves behind (allocator, caches, clocks) weighs on no run more than on another."""
    if n < 2:
        return list(range(n))
    # first row 0, 1, n-1, 2, n-2, ...; row r adds r (mod n); an odd n needs the mirrored rows as well
    first = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows[i % len(rows)]


def run_order(n: int, i: int, order: str) -> list[int]:
    """The order n runs take on the i-th prompt under `order`: "balanced" (balanced_order) or "fixed" (the
    listed order every prompt, as benchmarks ran before the option)."""
    return balanced_order(n, i) if order == "balanced" else list(range(n))
