"""Benchmark metrics over finished pairs (pure functions; DESIGN.md "Metrics").

All comparisons between runs use the same prompts: the prompts every run finished (after an
interrupt some prompt may be missing a run; it is left out of the comparison, never mixed in).

- tau            emitted tokens / target forwards, bonus included (ar = 1.00)
- TPOT           decode ms / emitted token, prefill excluded; tokens/s = 1000 / TPOT
- speedup        reference TPOT / run TPOT (vs ar, and vs sd when it ran)
- ceiling        tau x (ar TPOT / the run's verify ms per block): the speedup over ar if drafting and
                 every non-model step were free; share of ceiling = speedup / ceiling
- per-position   rate at which the winning path reached depth d, over blocks that drafted that deep
- repair wins    blocks where a repair branch beat branch 0, / blocks
- match vs ar    sum over prompts of the common-prefix length with ar's tokens / sum of
                 max(len(run), len(ar)): 1.0 iff every generation is token-for-token identical
"""
from __future__ import annotations

from typing import Sequence

from cure_core.metrics import ceiling_speedup, common_prefix, per_position_acceptance, summarize

from .runner import PairResult, RunSpec


def complete_prompts(pairs: Sequence[PairResult], run_names: Sequence[str]) -> list[int]:
    """Prompt indices that every run finished, ascending."""
    have: dict[int, set] = {}
    for p in pairs:
        have.setdefault(p.prompt_index, set()).add(p.run)
    need = set(run_names)
    return sorted(i for i, runs in have.items() if need <= runs)


def run_metrics(pairs: Sequence[PairResult], depth: int) -> dict:
    """Speed and tree metrics of one run over its pairs."""
    blocks = [b for p in pairs for b in p.blocks]
    s = summarize(blocks)
    drafted = any(b.draft for b in blocks)
    split_total = s.draft_ms + s.tree_ms + s.verify_ms + s.commit_ms + s.learn_ms
    return {
        "strategy": pairs[0].strategy if pairs else "",
        "prompts": len(pairs),
        "new_tokens": s.new_tokens,
        "blocks": s.blocks,
        "tau": s.tau,
        "tpot_ms": s.tpot_ms,
        "tokens_per_s": s.tokens_per_s,
        "repair_win_rate": s.repair_win_rate,
        "repair_wins": sum(b.repair_won for b in blocks),
        "mean_delta_a": (sum(b.delta_a for b in blocks) / len(blocks)) if blocks else 0.0,
        "extra_tokens": sum(max(b.delta_a, 0) for b in blocks),
        "blocks_with_ufp": sum(bool(b.ufps) for b in blocks),
        "mean_tree_size": s.mean_tree_size,
        "max_tree_size": s.max_tree_size,
        "per_position_acceptance": per_position_acceptance(blocks, depth) if drafted else None,
        "time_ms": {"prefill": s.prefill_ms, "decode": s.decode_ms, "draft": s.draft_ms, "tree": s.tree_ms,
                    "verify": s.verify_ms, "commit": s.commit_ms, "learn": s.learn_ms},
        "time_split": {k: (v / split_total if split_total else 0.0) for k, v in
                       (("draft", s.draft_ms), ("tree", s.tree_ms), ("verify", s.verify_ms),
                        ("commit", s.commit_ms), ("learn", s.learn_ms))},
        "ms_per_block": s.decode_ms / s.blocks if s.blocks else 0.0,
        "budget": _budget(blocks),
    }


def _budget(blocks) -> dict | None:
    """--v-max auto: the budgets the tuner chose and its mean predicted speedup over ar (None if fixed)."""
    chosen = [b.meta["v_max"] for b in blocks if "v_max" in b.meta]
    predicted = [b.meta["predicted_speedup"] for b in blocks if b.meta.get("predicted_speedup") is not None]
    if not chosen:
        return None
    return {"mean_v_max": sum(chosen) / len(chosen), "min_v_max": min(chosen), "max_v_max": max(chosen),
            "predicted_speedup_vs_ar": sum(predicted) / len(predicted) if predicted else None}


def match_stats(pairs: Sequence[PairResult], reference: dict[int, Sequence[int]]) -> dict:
    """Token-level match of a run's generations against the reference (ar) ones, prompt by prompt."""
    matched = total = identical = 0
    mismatches = []
    for p in sorted(pairs, key=lambda x: x.prompt_index):
        ref = reference[p.prompt_index]
        cp = common_prefix(p.token_ids, ref)
        n = max(len(p.token_ids), len(ref))
        matched += cp
        total += n
        if cp == n:
            identical += 1
        else:
            mismatches.append({"task_id": p.task_id, "prompt_index": p.prompt_index, "first_diff": cp,
                               "tokens": len(p.token_ids), "ref_tokens": len(ref)})
    return {"prompts": len(pairs), "identical": identical, "match_rate": matched / total if total else 1.0,
            "mismatches": mismatches}


def speedup(ref_tpot: float, tpot: float) -> float | None:
    return ref_tpot / tpot if ref_tpot > 0 and tpot > 0 else None


def compute(pairs: Sequence[PairResult], runs: Sequence[RunSpec], depth: int) -> dict:
    """Every metric of the benchmark: {"compared_prompts", "metrics", "lossless", "lossless_ok", "ablation"}.
    lossless_ok: every run token-for-token identical to ar on every compared prompt (None: ar did not run)."""
    names = [r.name for r in runs]
    keep = set(complete_prompts(pairs, names))
    by_run = {n: [p for p in pairs if p.run == n and p.prompt_index in keep] for n in names}
    metrics = {n: run_metrics(by_run[n], depth) for n in names}
    for ref in ("ar", "sd"):
        for n in names:
            metrics[n][f"speedup_vs_{ref}"] = (speedup(metrics[ref]["tpot_ms"], metrics[n]["tpot_ms"])
                                               if ref in metrics and keep else None)
    for n in names:
        m = metrics[n]
        verify = m["time_ms"]["verify"] / m["blocks"] if m["blocks"] else 0.0
        ceiling = ceiling_speedup(m["tau"], metrics["ar"]["tpot_ms"], verify) if "ar" in metrics and keep else None
        m["ceiling_speedup_vs_ar"] = ceiling
        m["share_of_ceiling"] = m["speedup_vs_ar"] / ceiling if ceiling and m["speedup_vs_ar"] else None
    lossless = {}
    if "ar" in by_run and keep:
        reference = {p.prompt_index: p.token_ids for p in by_run["ar"]}
        for n in names:
            if n != "ar":
                lossless[n] = match_stats(by_run[n], reference)
    for n in names:
        metrics[n]["match_vs_ar"] = lossless[n]["match_rate"] if n in lossless else None
    ablation = {}
    if "cure" in metrics and keep:
        c = metrics["cure"]
        for r in runs:
            if r.ablation:
                a = metrics[r.name]
                ablation[r.name] = {
                    "keep_branch0": r.config.ablations.keep_branch0, "resync": r.config.ablations.resync,
                    "tau": a["tau"], "delta_tau_pct": _pct(a["tau"], c["tau"]),
                    "speedup_vs_ar": a["speedup_vs_ar"],
                    "delta_speedup_pct": (_pct(a["speedup_vs_ar"], c["speedup_vs_ar"])
                                          if a["speedup_vs_ar"] and c["speedup_vs_ar"] else None),
                    "tpot_ms": a["tpot_ms"], "tpot_ratio_vs_cure": (a["tpot_ms"] / c["tpot_ms"]
                                                                    if c["tpot_ms"] else None),
                }
    lossless_ok = all(v["identical"] == v["prompts"] for v in lossless.values()) if lossless else None
    return {"compared_prompts": len(keep), "metrics": metrics, "lossless": lossless, "lossless_ok": lossless_ok,
            "ablation": ablation}


def _pct(x: float, ref: float) -> float | None:
    return 100.0 * (x - ref) / ref if ref else None
