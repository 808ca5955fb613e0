"""``bepo-jax compare``: several estimators x seeds on one environment, one table, one plot.

Each (estimator, seed) is an ordinary training run under ``out/<estimator>/seed<s>``
(so a comparison that is interrupted resumes run by run). The table reports, per
estimator, the final held-out success rate and the iterations until the training
success rate (trailing mean over ``window`` iterations) first reaches ``threshold``,
each as mean +- the 95% confidence half-width of Student's t over the seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .estimators.registry import get_estimator
from .train import RunConfig, mean_ci, read_metrics, train, trailing_mean


def iterations_to(rows: list[dict], threshold: float, window: int = 5) -> Optional[int]:
    """The first iteration whose trailing-mean training success rate reaches ``threshold``."""
    its = [r for r in rows if r["iteration"] > 0]
    reached = np.flatnonzero(trailing_mean([r["success_rate"] for r in its], window) >= threshold)
    return int(its[reached[0]]["iteration"]) if len(reached) else None


def _fmt(m: float, h: float, digits: int = 3) -> str:
    if math.isnan(m):
        return "n/a"
    return f"{m:.{digits}f}" + ("" if math.isnan(h) else f" +- {h:.{digits}f}")


def compare(base: RunConfig, estimators: Sequence[str], *, seeds: int, out: str | Path, threshold: float = 0.5,
            progress: bool = True) -> str:
    """Run every estimator x seed (resuming finished or interrupted runs) and write
    ``compare.md``, ``compare.json`` and ``compare.png`` under ``out``; returns the table."""
    if not estimators:
        raise ValueError("--estimators is empty; give a comma-separated list of registry names.")
    for name in estimators:
        get_estimator(name)  # unknown names raise, listing the valid ones
    if seeds < 1:
        raise ValueError(f"--seeds={seeds} must be >= 1.")
    out = Path(out)
    results = {}
    for name in estimators:
        runs = []
        for s in range(seeds):
            cfg = base.replace(estimator=name, seed=base.seed + s)
            run_dir = out / name / f"seed{cfg.seed}"
            done = read_metrics(run_dir)
            if not (done and done[-1]["iteration"] >= cfg.iterations and "eval/success_rate" in done[-1]):
                train(cfg, run_dir, resume=(run_dir / "config.json").exists(), progress=progress)
            runs.append(read_metrics(run_dir))
        results[name] = runs
    summary = {}
    for name, runs in results.items():
        final = [r[-1]["eval/success_rate"] for r in runs]
        first = [r[0]["eval/success_rate"] for r in runs]
        reach = [iterations_to(r, threshold) for r in runs]
        summary[name] = {"final_success": mean_ci(final), "initial_success": mean_ci(first),
                         "final_train_success": mean_ci([r[-1]["eval_train/success_rate"] for r in runs]),
                         "initial_train_success": mean_ci([r[0]["eval_train/success_rate"] for r in runs]),
                         "iterations_to_threshold": mean_ci([x for x in reach if x is not None]),
                         "reached": sum(x is not None for x in reach), "runs": len(runs)}
    lines = [f"env {base.env}, {base.iterations} iterations, {seeds} seed(s), threshold {threshold} "
             f"(mean +- 95% CI over seeds)", "",
             "| estimator | training-task success before | after | held-out success before | after "
             "| iterations to threshold | reached |",
             "|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {_fmt(*s['initial_train_success'])} | {_fmt(*s['final_train_success'])} | "
                     f"{_fmt(*s['initial_success'])} | {_fmt(*s['final_success'])} | "
                     f"{_fmt(*s['iterations_to_threshold'], digits=1)} | {s['reached']}/{s['runs']} |")
    table = "\n".join(lines)
    (out / "compare.md").write_text(table + "\n")
    (out / "compare.json").write_text(json.dumps({"config": base.to_dict(), "threshold": threshold,
                                                  "summary": summary}, indent=2))
    _plot(results, out / "compare.png", title=f"{base.env}: training success rate")
    return table


def _plot(results: dict, path: Path, *, title: str) -> None:
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
