"""Repair-utility analysis (paper Table 5): can a cheap scorer tell, before verification, which
CURE blocks a repair branch will help?

A block is *useful* when its tree accepted strictly more drafted tokens than branch 0 alone would
have (delta_a > 0). Features are restricted to what is known once the tree is built and before the
target verifies it: the draft margins, the UFPs, the tree's shape, and the outcome of the PREVIOUS
block of the same generation. Nothing from this block's verification (accepted, winner, bonus,
branch0_accepted, verify timings) is used.

Evaluation: blocks are split into folds by generation (a generation's blocks share a prompt and
a context, so splitting inside one would leak), the scorer is fit on the other folds and scores
the held-out fold; every block gets an out-of-fold score. Blocks are then ranked and, at an
admitted-block budget r (fraction of blocks admitted), we report

    precision          = useful admitted / admitted
    recall             = useful admitted / useful
    extra-token recall = sum(delta_a of admitted useful) / sum(delta_a of useful)

for the scorer, a margin-only baseline (rank by ascending minimum draft margin) and chance.
No UI imports; the CLI (`cure analyze`) only formats what this returns.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from .block import Block
from .errors import CureError

BUDGETS = (0.1, 0.2, 0.3)
MIN_BLOCKS = 20                 # candidate blocks needed to say anything
MIN_USEFUL = 2                  # useful blocks needed (at least one can land in a held-out fold)
MIN_GENERATIONS = 2             # folds are split by generation
_MARGIN_CAP = 50.0              # margins can be huge (or inf when top-2 is impossible): clip
NO_PREFIX = _MARGIN_CAP         # "no drafted position before the UFP": as confident as it gets

FEATURES = (
    "draft_len", "context_len", "block_index",
    "margin_min", "margin_mean", "margin_std", "margin_max", "margin_second", "margin_gap",
    "margin_argmin_rel", "n_low_margin", "frac_low_margin",
    "n_ufps", "ufp_pos", "ufp_rel", "ufp_margin", "ufp_budget", "n_alternatives",
    "prefix_len", "prefix_min_margin", "prefix_mean_margin", "prefix_sum_margin", "suffix_len",
    "tree_size", "tree_ratio", "n_branches", "repair_nodes", "max_repair_depth",
    "prev_accept", "prev_emitted", "prev_repair_won", "prev_delta_a",
)


class AnalysisError(CureError):
    """The trace cannot support the analysis (no cure blocks, too few, no useful repairs)."""


@dataclass(frozen=True)
class BlockSample:
    group: str                     # generation key: blocks of one generation share a fold
    features: tuple[float, ...]    # in FEATURES order
    delta_a: int                   # extra tokens the repair tree gained (label: delta_a > 0)
    min_margin: float              # the margin-only baseline's key


def _clip(x: float) -> float:
    if math.isnan(x):
        return _MARGIN_CAP
    return float(min(max(x, -_MARGIN_CAP), _MARGIN_CAP))


def has_repair(block: Block) -> bool:
    """The block's tree holds at least one repair branch (a UFP with a grafted alternative)."""
    return any(u.alternatives for u in block.ufps) or any(n.branch != 0 for n in block.nodes)


def block_features(block: Block, prev: Block | None = None, tau_margin: float = 1.0) -> dict[str, float]:
    """Features of one block, all known before the target verifies it."""
    n = len(block.draft)
    m = [_clip(x) for x in block.margins]
    ms = sorted(m)
    m_min = ms[0] if ms else _MARGIN_CAP
    m_second = ms[1] if len(ms) > 1 else _MARGIN_CAP
    low = sum(x < tau_margin for x in m)
    ufp = min(block.ufps, key=lambda u: u.margin) if block.ufps else None
    pos = ufp.position if ufp is not None else (m.index(m_min) if m else 0)
    prefix = m[:pos]
    repair = [node for node in block.nodes if node.branch != 0]
    return {
        "draft_len": float(n),
        "context_len": float(block.context_len),
        "block_index": float(block.index),
        "margin_min": m_min,
        "margin_mean": float(np.mean(m)) if m else _MARGIN_CAP,
        "margin_std": float(np.std(m)) if m else 0.0,
        "margin_max": ms[-1] if ms else _MARGIN_CAP,
        "margin_second": m_second,
        "margin_gap": m_second - m_min,
        "margin_argmin_rel": (m.index(m_min) / n) if m and n else 0.0,
        "n_low_margin": float(low),
        "frac_low_margin": low / n if n else 0.0,
        "n_ufps": float(len(block.ufps)),
        "ufp_pos": float(pos),
        "ufp_rel": pos / n if n else 0.0,
        "ufp_margin": _clip(ufp.margin) if ufp is not None else m_min,
        "ufp_budget": float(ufp.budget) if ufp is not None else 0.0,
        "n_alternatives": float(sum(len(u.alternatives) for u in block.ufps)),
        "prefix_len": float(pos),
        "prefix_min_margin": min(prefix) if prefix else NO_PREFIX,
        "prefix_mean_margin": float(np.mean(prefix)) if prefix else NO_PREFIX,
        "prefix_sum_margin": float(sum(prefix)),
        "suffix_len": float(max(n - pos - 1, 0)),
        "tree_size": float(block.tree_size),
        "tree_ratio": block.tree_size / n if n else 0.0,
        "n_branches": float(len({node.branch for node in block.nodes})),
        "repair_nodes": float(len(repair)),
        "max_repair_depth": float(max((node.depth for node in repair), default=0)),
        "prev_accept": float(prev.accept_length) if prev is not None else -1.0,
        "prev_emitted": float(len(prev.emitted)) if prev is not None else -1.0,
        "prev_repair_won": float(prev.repair_won) if prev is not None else 0.0,
        "prev_delta_a": float(prev.delta_a) if prev is not None else 0.0,
    }


@dataclass
class Collected:
    samples: list[BlockSample] = field(default_factory=list)
    cure_blocks: int = 0            # every cure block seen (eligible generations)
    no_repair_blocks: int = 0       # cure blocks whose tree had no repair branch (left out)
    skipped_generations: int = 0    # ablation generations (keep_branch0/resync off) left out
    strategies: set[str] = field(default_factory=set)


def collect(generations: Iterable[tuple[str, dict, Sequence[Block]]]) -> Collected:
    """Candidate blocks from (group key, generation config, blocks) triples.

    Only full-CURE generations count (the keep_branch0=False / resync=False ablations change what
    branch 0 means); within them only blocks whose tree holds a repair branch are candidates
    (without one, delta_a is 0 by construction and ranking them is trivial).
    """
    out = Collected()
    for group, config, blocks in generations:
        config = config or {}
        for b in blocks:
            out.strategies.add(b.strategy)
        if not blocks or blocks[0].strategy != "cure":
            continue
        if not config.get("keep_branch0", True) or not config.get("resync", True):
            out.skipped_generations += 1
            continue
        tau = float(config.get("tau_margin", 1.0))
        prev = None
        for b in blocks:
            out.cure_blocks += 1
            if has_repair(b):
                f = block_features(b, prev, tau)
                out.samples.append(BlockSample(group=group, features=tuple(f[k] for k in FEATURES),
                                               delta_a=b.delta_a, min_margin=f["margin_min"]))
            else:
                out.no_repair_blocks += 1
            prev = b
    return out


def check_enough(c: Collected) -> None:
    """Raise AnalysisError with one clear line when the data cannot support the analysis."""
    if c.cure_blocks == 0:
        found = ", ".join(sorted(c.strategies)) or "none"
        extra = (f" ({c.skipped_generations} ablation generations were left out)"
                 if c.skipped_generations else "")
        raise AnalysisError(f"the trace has no full-CURE blocks (strategies found: {found}){extra}; record some "
                            f"with `cure bench ... --strategies cure` or `cure generate --strategy cure --trace FILE`")
    n = len(c.samples)
    if n < MIN_BLOCKS:
        raise AnalysisError(f"only {n} cure blocks had a repair tree (of {c.cure_blocks} cure blocks); need at least "
                            f"{MIN_BLOCKS}: record more prompts or longer generations")
    useful = sum(s.delta_a > 0 for s in c.samples)
    if useful == 0:
        raise AnalysisError(f"none of the {n} cure blocks with a repair tree had a useful repair (delta_a > 0): "
                            f"there is nothing to rank")
    if useful < MIN_USEFUL:
        raise AnalysisError(f"only {useful} of {n} cure blocks had a useful repair (delta_a > 0); need at least "
                            f"{MIN_USEFUL} to score held-out blocks")
    groups = len({s.group for s in c.samples})
    if groups < MIN_GENERATIONS:
        raise AnalysisError(f"all {n} candidate blocks come from one generation; need at least {MIN_GENERATIONS} "
                            f"generations to split train/held-out by generation (to avoid leakage)")


# ---------------------------------------------------------------- ranking metrics

def rank_order(scores: Sequence[float], seed: int = 0) -> np.ndarray:
    """Indices by descending score; ties broken at random (seeded), never by input order."""
    s = np.asarray(scores, dtype=float)
    tie = np.random.default_rng(seed).random(len(s))
    return np.lexsort((tie, -s))


def budget_metrics(order: Sequence[int], delta_a: Sequence[int], r: float) -> dict:
    """Precision / recall / extra-token recall when the top ceil(r*N) blocks of `order` are admitted."""
    d = np.asarray(delta_a)
    n = len(d)
    admitted = max(1, int(math.ceil(r * n - 1e-9))) if n else 0
    top = np.asarray(order[:admitted], dtype=int)
    useful = d > 0
    gain = np.where(useful, d, 0)
    n_useful = int(useful.sum())
    total_gain = int(gain.sum())
    hit = int(useful[top].sum()) if admitted else 0
    return {
        "admitted": admitted,
        "precision": hit / admitted if admitted else 0.0,
        "recall": hit / n_useful if n_useful else 0.0,
        "extra_token_recall": int(gain[top].sum()) / total_gain if total_gain else 0.0,
    }


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """ROC AUC (ties count half); None when only one class is present."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if len(pos) == 0 or len(neg) == 0:
        return None
    # rank-based (Mann-Whitney U) with average ranks for ties
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    allv = np.concatenate([pos, neg])[order]
    ranks = np.empty(len(allv))
    i = 0
    while i < len(allv):
        j = i
        while j + 1 < len(allv) and allv[j + 1] == allv[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = np.empty(len(allv))
    r[order] = ranks
    u = r[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


# ---------------------------------------------------------------- the scorer

def _make_model(kind: str, seed: int):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    if kind == "logreg":
        from sklearn.linear_model import LogisticRegression
        return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, class_weight="balanced", max_iter=2000))
    if kind == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier
        return HistGradientBoostingClassifier(max_iter=150, learning_rate=0.05, max_leaf_nodes=15,
                                              min_samples_leaf=10, l2_regularization=1.0,
                                              class_weight="balanced", random_state=seed)
    raise AnalysisError(f"unknown scorer {kind!r}; choose logreg or hgb")


def group_folds(groups: Sequence[str], n_folds: int, seed: int) -> list[np.ndarray]:
    """Fold index per sample: whole generations go to one fold (shuffled, seeded)."""
    uniq = sorted(set(groups))
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(uniq))
    fold_of = {uniq[g]: i % n_folds for i, g in enumerate(perm)}
    ids = np.array([fold_of[g] for g in groups])
    return [np.where(ids == f)[0] for f in range(n_folds)]


def out_of_fold_scores(X: np.ndarray, y: np.ndarray, groups: Sequence[str], model: str = "logreg",
                       n_folds: int = 5, seed: int = 0) -> tuple[np.ndarray, int]:
    """Score every sample with a model fit on the other folds. Returns (scores, folds used).
    A training split with a single class scores its held-out fold with that class's prior (a
    constant: ties are broken at random when ranking)."""
    n_groups = len(set(groups))
    k = max(2, min(n_folds, n_groups))
    folds = group_folds(groups, k, seed)
    scores = np.zeros(len(y), dtype=float)
    for test in folds:
        if len(test) == 0:
            continue
        train = np.setdiff1d(np.arange(len(y)), test)
        if len(np.unique(y[train])) < 2:
            scores[test] = float(y[train].mean()) if len(train) else 0.0
            continue
        clf = _make_model(model, seed)
        clf.fit(X[train], y[train])
        scores[test] = clf.predict_proba(X[test])[:, 1]
    return scores, k


def feature_weights(X: np.ndarray, y: np.ndarray, seed: int = 0) -> list[tuple[str, float]]:
    """Standardised logistic-regression coefficients on all data (descriptive only), largest first."""
    if len(np.unique(y)) < 2:
        return []
    clf = _make_model("logreg", seed)
    clf.fit(X, y)
    coef = clf[-1].coef_[0]
    return sorted(zip(FEATURES, map(float, coef)), key=lambda t: -abs(t[1]))


def analyze(generations: Iterable[tuple[str, dict, Sequence[Block]]], seed: int = 0, model: str = "logreg",
            n_folds: int = 5, budgets: Sequence[float] = BUDGETS) -> dict:
    """The whole Table-5 analysis; returns a JSON-safe dict. Raises AnalysisError on too little data."""
    c = collect(generations)
    check_enough(c)
    X = np.array([s.features for s in c.samples], dtype=float)
    d = np.array([s.delta_a for s in c.samples])
    y = (d > 0).astype(int)
    groups = [s.group for s in c.samples]
    scores, k = out_of_fold_scores(X, y, groups, model=model, n_folds=n_folds, seed=seed)
    margin_key = -np.array([s.min_margin for s in c.samples])      # ascending margin first
    scorer_order = rank_order(scores, seed)
    margin_order = rank_order(margin_key, seed)
    n, useful = len(y), int(y.sum())
    rows = []
    for r in budgets:
        admitted = max(1, int(math.ceil(r * n - 1e-9)))
        rows.append({
            "r": r,
            "scorer": budget_metrics(scorer_order, d, r),
            "margin": budget_metrics(margin_order, d, r),
            # expected value of admitting a random subset of that size
            "chance": {"admitted": admitted, "precision": useful / n, "recall": admitted / n,
                       "extra_token_recall": admitted / n},
        })
    return {
        "blocks": n,
        "useful": useful,
        "base_rate": useful / n,
        "extra_tokens": int(d[d > 0].sum()),
        "generations": len(set(groups)),
        "cure_blocks": c.cure_blocks,
        "no_repair_blocks": c.no_repair_blocks,
        "skipped_ablation_generations": c.skipped_generations,
        "model": model,
        "folds": k,
        "seed": seed,
        "features": list(FEATURES),
        "auc": {"scorer": auc(scores, y.astype(bool)), "margin": auc(margin_key, y.astype(bool))},
        "budgets": rows,
        "feature_weights": [{"feature": f, "weight": w} for f, w in feature_weights(X, y, seed)[:8]],
    }
