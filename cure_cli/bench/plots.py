"""`cure bench --plot`: PNG figures from a finished benchmark (matplotlib, imported lazily)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .runner import PairResult


class PlotUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install matplotlib (or pip install 'cure[bench]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_all(out_dir: Path, results: dict, pairs: Sequence[PairResult]) -> list[Path]:
    """speedup_tau.png, acceptance.png, tau_hist.png, margin_repair.png; returns the paths written."""
    plt = _pyplot()
    metrics = results["metrics"]
    names = list(metrics)
    keep = {p["prompt_index"] for p in results["per_prompt"]}
    written = []

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    speed = [metrics[n]["speedup_vs_ar"] or 0.0 for n in names]
    a1.bar(names, speed, color="tab:blue")
    a1.axhline(1.0, color="grey", lw=0.8, ls="--")
    a1.set_title(f"speedup vs ar ({(results.get('device') or {}).get('ar_dtype', '?')}), TPOT ratio")
    a2.bar(names, [metrics[n]["tau"] for n in names], color="tab:orange")
    a2.set_title("tau (tokens per target forward)")
    for ax in (a1, a2):
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.suptitle(f"cure bench {results['dataset']} ({results['compared_prompts']} prompts)")
    written.append(_save(fig, out_dir / "speedup_tau.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4))
    for n in names:
        rates = metrics[n]["per_position_acceptance"]
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", ms=3, label=n)
    ax.set_xlabel("draft depth d")
    ax.set_ylabel("P(winning path reaches d)")
    ax.set_ylim(0, 1.02)
    ax.set_title("per-position acceptance")
    written.append(_save(fig, out_dir / "acceptance.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4))
    depth = results["config"]["k"]
    bins = [x - 0.5 for x in range(1, depth + 2)]
    for n in names:
        if n == "ar":
            continue
        emitted = [len(b.emitted) for p in pairs if p.run == n and p.prompt_index in keep for b in p.blocks]
        if emitted:
            ax.hist(emitted, bins=bins, histtype="step", lw=1.5, label=n)
    ax.set_xlabel("tokens emitted per block (accepted + bonus)")
    ax.set_ylabel("blocks")
    ax.set_title("acceptance-length histogram")
    written.append(_save(fig, out_dir / "tau_hist.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4))
    xs, ys = [], []
    for p in pairs:
        if p.run != "cure":
            continue
        for b in p.blocks:
            if b.ufps:
                xs.append(min(u.margin for u in b.ufps))
                ys.append(b.delta_a)
    if xs:
        import random
        rng = random.Random(0)
        ax.scatter(xs, [y + rng.uniform(-0.15, 0.15) for y in ys], s=10, alpha=0.5)
    else:
        ax.text(0.5, 0.5, "no cure blocks with a UFP", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("UFP margin (top1 - top2 draft log-prob)")
    ax.set_ylabel("repair gain delta_a (jittered)")
    ax.set_title("margin vs repair gain (cure)")
    written.append(_save(fig, out_dir / "margin_repair.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    """Legend on every axis with labelled artists, tight layout, write, close."""
    for ax in fig.axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
