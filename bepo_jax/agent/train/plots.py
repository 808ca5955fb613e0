"""Plots of runs: one run's success curve, and a comparison's curves with intervals over seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .report import mean_ci, trailing_mean


def draw_curve(rows: list[dict], ax) -> None:
    """Training success rate (raw and trailing mean) and the evaluations (training tasks
    and held-out, with 95% CIs) vs iteration, on a matplotlib Axes."""
    it = np.array([r["iteration"] for r in rows])
    if len(it):
        sr = np.array([r["success_rate"] for r in rows])
        ax.plot(it, sr, color="0.75", lw=1, label="train (per iteration)")
        w = max(1, len(sr) // 10)
        ax.plot(it, trailing_mean(sr, w), color="C0", label=f"train ({w}-iteration mean)")
        for prefix, color, label in (("eval_train/", "C2", "training tasks (eval)"), ("eval/", "C3", "held-out")):
            half = lambda r: np.nan if r.get(prefix + "ci95") is None else r[prefix + "ci95"]  # None: one task
            ev = [(r["iteration"], r[prefix + "success_rate"], half(r)) for r in rows if prefix + "success_rate" in r]
            if ev:
                e = np.array(ev)
                ax.errorbar(e[:, 0], e[:, 1], yerr=e[:, 2], fmt="o-", color=color, capsize=3, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="upper left", fontsize=8)


def plot_curve(rows: list[dict], path: Path, *, title: str = "") -> None:
    """``draw_curve`` into a PNG file."""
    from matplotlib.figure import Figure  # no pyplot: no backend switch, works in notebooks and headless

    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    draw_curve(rows, ax)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_comparison(results: dict, path: Path, *, title: str) -> None:
    """Trailing-mean training success per estimator (mean over seeds, 95% t band over seeds)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.subplots()
    for i, (name, runs) in enumerate(results.items()):
        n = min(len(r) for r in runs)
        it = np.array([row["iteration"] for row in runs[0][:n]])
        sr = np.array([[row["success_rate"] for row in r[:n]] for r in runs])
        w = max(1, n // 10)
        smooth = np.stack([trailing_mean(s, w) for s in sr])
        m = smooth.mean(0)
        ax.plot(it, m, color=f"C{i}", label=name)
        if len(runs) > 1:
            h = np.array([mean_ci(smooth[:, j])[1] for j in range(n)])
            ax.fill_between(it, m - h, m + h, color=f"C{i}", alpha=0.2)
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate (trailing mean)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
