"""What runs report: intervals over tasks and seeds, paired changes, trailing means,
iterations to a threshold, and a finished run's ``summary.json``.

Every interval here is a 95% Student-t half-width: over tasks for one run's evaluation
(``paired_change``: the per-task change between two evaluations of the same tasks), over
seeds in ``bepo-jax compare``.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np


def mean_ci(values) -> tuple[float, float]:
    """Mean and the 95% Student-t half-width (nan for fewer than two values)."""
    from scipy import stats

    x = np.asarray(values, np.float64)
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def paired_combination(terms, value) -> list[float]:
    """Per seed ``i``, ``sum_k w_k * value(arm_k[i])`` over ``terms`` = ``[(arm_k, w_k), ...]``, each arm a
    list of per-seed records, over the seeds every arm has. Arms that share each seed's tasks and
    initial policy pair seed by seed (``a - b`` is ``[(a, 1), (b, -1)]``); ``mean_ci`` of the result is
    the paired interval."""
    n = min(len(seeds) for seeds, _ in terms)
    return [sum(w * value(seeds[i]) for seeds, w in terms) for i in range(n)]


def trailing_mean(x, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each position (fewer at the start)."""
    x = np.asarray(x, np.float64)
    return np.array([x[max(0, i - window + 1): i + 1].mean() for i in range(len(x))])


def paired_change(before: dict, after: dict) -> tuple[float, float]:
    """Mean change of per-task success between two evaluations of the same tasks, with
    its 95% t half-width (the paired test: task difficulty cancels)."""
    a, b = np.asarray(before["per_task"]), np.asarray(after["per_task"])
    return mean_ci(b - a)


def iterations_to(rows: list[dict], threshold: float, window: int = 5) -> Optional[int]:
    """The first iteration whose trailing-mean training success rate reaches ``threshold``."""
    its = [r for r in rows if r["iteration"] > 0]
    reached = np.flatnonzero(trailing_mean([r["success_rate"] for r in its], window) >= threshold)
    return int(its[reached[0]]["iteration"]) if len(reached) else None


def run_summary(cfg, rows: list[dict], res: dict, window: int = 10) -> dict:
    """What a finished run reports (``summary.json``): success before/after on held-out and
    training tasks with the paired change and its 95% t-interval over tasks, the trailing
    training success at the start and the end, and the time per iteration."""
    out = {"config": cfg.to_dict(), "iterations": cfg.iterations, "window": window}
    for name, i, f in (("held_out", res["initial"], res["final"]), ("train", res["initial_train"], res["final_train"])):
        if not i or not f:  # not evaluated (RunConfig.eval_train False)
            continue
        d, h = paired_change(i, f)
        out[name] = {"tasks": f["tasks"], "before": i["success_rate"], "after": f["success_rate"],
                     "paired_change": d, "paired_ci95": h, "interval_includes_zero": bool(abs(d) <= h)}
    it_rows = [r for r in rows if r["iteration"] > 0 and "success_rate" in r and "step_time" in r]
    if it_rows:
        trail = trailing_mean([r["success_rate"] for r in it_rows], window)
        times = sorted(r["step_time"] for r in it_rows[1:] or it_rows)  # the first iteration compiles
        out.update(trailing_success_first=float(trail[min(window, len(trail)) - 1]),
                   trailing_success_last=float(trail[-1]), seconds_per_iteration=float(times[len(times) // 2]))
    return out
