"""``bepo-jax compare``: several estimators x seeds on one environment, one table, one plot.

Each (estimator, seed) is an ordinary training run under ``out/<estimator>/seed<s>``
(so a comparison that is interrupted resumes where it stopped). On JAX environments the
seeds of one estimator run as one compiled program (``train_seeds``; each seed equals
its single run to float32 tolerance); ``seeds_in_one_program=False`` runs them one after
another. The table reports, per estimator, the final held-out success rate and the
iterations until the training success rate (trailing mean over ``window`` iterations)
first reaches ``threshold``, each as mean +- the 95% confidence half-width of Student's t
over the seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence


from ..envs.registry import is_host_env
from ..estimators.registry import get_estimator
from .config import RunConfig
from .loop import train, train_seeds
from .plots import plot_comparison
from .report import iterations_to, mean_ci
from .rundir import is_finished, read_metrics


def _fmt(m: float, h: float, digits: int = 3) -> str:
    if math.isnan(m):
        return "n/a"
    return f"{m:.{digits}f}" + ("" if math.isnan(h) else f" +- {h:.{digits}f}")


def compare(base: RunConfig, estimators: Sequence[str], *, seeds: int, out: str | Path, threshold: float = 0.5,
            progress: bool = True, seeds_in_one_program: Optional[bool] = None, mesh=None) -> str:
    """Run every estimator x seed (resuming finished or interrupted runs) and write
    ``compare.md``, ``compare.json`` and ``compare.png`` under ``out``; returns the table.

    ``seeds_in_one_program``: the seeds of an estimator as one program (default: on JAX
    environments); ``mesh``: shard that program's run axis over the mesh's "runs" axis."""
    if not estimators:
        raise ValueError("--estimators is empty; give a comma-separated list of registry names.")
    for name in estimators:
        get_estimator(name)  # unknown names raise, listing the valid ones
    if seeds < 1:
        raise ValueError(f"--seeds={seeds} must be >= 1.")
    host = is_host_env(base.env)
    if seeds_in_one_program and host:
        raise ValueError(f"seeds_in_one_program: env={base.env!r} runs through the host loop; its seeds run one "
                         "after another (seeds_in_one_program=False, or leave it unset).")
    seeds_in_one_program = (not host) if seeds_in_one_program is None else seeds_in_one_program
    out = Path(out)
    results = {}
    for name in estimators:
        cfg = base.replace(estimator=name)
        all_seeds = [base.seed + s for s in range(seeds)]
        dirs = {s: out / name / f"seed{s}" for s in all_seeds}
        todo = [s for s in all_seeds if not is_finished(dirs[s], cfg.iterations)]
        if todo and seeds_in_one_program:
            train_seeds(cfg, todo, [dirs[s] for s in todo], resume=True, progress=progress, mesh=mesh)
        for s in todo if not seeds_in_one_program else ():
            train(cfg.replace(seed=s), dirs[s], resume=(dirs[s] / "config.json").exists(), progress=progress)
        results[name] = [read_metrics(dirs[s]) for s in all_seeds]
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
    plot_comparison(results, out / "compare.png", title=f"{base.env}: training success rate")
    return table
