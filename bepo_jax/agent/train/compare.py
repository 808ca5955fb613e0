"""``bepo-jax compare``: several arms (estimators with their settings) x seeds on one
environment, one table, one plot.

Each (arm, seed) is an ordinary training run under ``out/<label>/seed<s>``, trained by the
one runner (``arms.run_arm``): an interrupted comparison resumes where it stopped, and a
finished run of another config in ``out`` is refused (never reported under the new
setting). On JAX environments the seeds of one arm run as one compiled program
(``train_seeds``; each seed equals its single run to float32 tolerance);
``seeds_in_one_program=False`` runs them one after another. The table reports, per arm,
the success rate on the training and held-out tasks before and after training, the
held-out difference from the first arm paired per seed (every arm of a seed shares its
tasks and its initial policy), and the iterations until the training success rate
(trailing mean) first reaches ``threshold``; each as mean +- the 95% Student-t
half-width over the seeds.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Optional, Sequence

from .arms import Arm, collapsed, parse_arms, run_arm
from .config import RunConfig
from .plots import plot_comparison
from .report import iterations_to, mean_ci, paired_combination


def _fmt(m: float, h: float, digits: int = 3, sign: bool = False) -> str:
    if math.isnan(m):
        return "n/a"
    return f"{m:{'+' if sign else ''}.{digits}f}" + ("" if math.isnan(h) else f" +- {h:.{digits}f}")


def compare(base: RunConfig, arms: Sequence[str | Arm] | str, *, seeds: int, out: str | Path, threshold: float = 0.5,
            progress: bool = True, seeds_in_one_program: Optional[bool] = None, mesh=None) -> str:
    """Run every arm x seed (resuming interrupted runs) and write ``compare.md``,
    ``compare.json`` and ``compare.png`` under ``out``; returns the table.

    ``arms``: ``Arm``s, registry names or ``LABEL=NAME:field=value`` specs (``parse_arms``);
    each arm's estimator config is its own (``base.estimator_config`` is not applied to it).
    ``seeds``: seeds ``base.seed, ..., base.seed + seeds - 1`` of every arm.
    ``seeds_in_one_program``: the seeds of an arm as one program (default: on JAX
    environments); ``mesh``: shard that program's run axis over the mesh's "runs" axis. With several
    JAX processes (every one calls this alike, with a mesh over all devices) each process writes
    only the run directories it owns, and process 0 the comparison's files."""
    arms = parse_arms(arms)
    if seeds < 1:
        raise ValueError(f"--seeds={seeds} must be >= 1.")
    out = Path(out)
    seed_ids = [base.seed + s for s in range(seeds)]
    results = {a.label: run_arm(base, a, seed_ids, out, progress=progress, mesh=mesh,
                                seeds_in_one_program=seeds_in_one_program) for a in arms}
    first = arms[0].label
    summary = {}
    for a in arms:
        runs = results[a.label]
        reach = [iterations_to(r, threshold) for r in runs]
        summary[a.label] = {
            "arm": a.to_dict(),
            "final_success": mean_ci([r[-1]["eval/success_rate"] for r in runs]),
            "initial_success": mean_ci([r[0]["eval/success_rate"] for r in runs]),
            "final_train_success": mean_ci([r[-1]["eval_train/success_rate"] for r in runs]),
            "initial_train_success": mean_ci([r[0]["eval_train/success_rate"] for r in runs]),
            f"final_success_minus_{first}": mean_ci(paired_combination(
                [(results[a.label], 1.0), (results[first], -1.0)], lambda r: r[-1]["eval/success_rate"])),
            "iterations_to_threshold": mean_ci([x for x in reach if x is not None]),
            "reached": sum(x is not None for x in reach), "runs": len(runs),
            "collapsed": sum(collapsed(r) for r in runs)}
    lines = [f"env {base.env}, {base.iterations} iterations, {seeds} seed(s), threshold {threshold}; mean +- 95% "
             f"Student-t half-width over the {seeds} seeds; the difference from {first} is paired per seed (same "
             "tasks, same initial policy)", "",
             "| arm | estimator (settings) | training-task success before | after | held-out success before | after "
             f"| held-out after minus {first} | iterations to threshold | reached | collapsed seeds |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for a in arms:
        s = summary[a.label]
        lines.append(f"| {a.label} | {a.describe()} | {_fmt(*s['initial_train_success'])} | "
                     f"{_fmt(*s['final_train_success'])} | {_fmt(*s['initial_success'])} | {_fmt(*s['final_success'])} | "
                     f"{_fmt(*s[f'final_success_minus_{first}'], sign=True) if a.label != first else '0'} | "
                     f"{_fmt(*s['iterations_to_threshold'], digits=1)} | {s['reached']}/{s['runs']} | "
                     f"{s['collapsed']}/{s['runs']} |")
    notes = _notes(summary, seeds)
    for n in notes:
        warnings.warn(n, RuntimeWarning, stacklevel=2)
    table = "\n".join(lines + ([""] + [f"Note: {n}" for n in notes] if notes else []))
    import jax

    if jax.process_index() != 0:  # across processes the comparison's files are process 0's
        return table
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(table + "\n")
    (out / "compare.json").write_text(json.dumps({"config": base.to_dict(), "threshold": threshold, "seeds": seed_ids,
                                                  "arms": [a.to_dict() for a in arms], "summary": summary,
                                                  "notes": notes}, indent=2))
    plot_comparison(results, out / "compare.png", title=f"{base.env}: training success rate")
    return table


def _notes(summary: dict, seeds: int) -> list[str]:
    """What a reader of the table must know: intervals past [0, 1], collapsed policies."""
    notes = []
    rates = ("final_success", "initial_success", "final_train_success", "initial_train_success")
    wide = sorted({label for label, s in summary.items() for k in rates
                   if not math.isnan(s[k][1]) and (s[k][0] - s[k][1] < 0 or s[k][0] + s[k][1] > 1)})
    if wide:
        notes.append(f"the 95% intervals of {', '.join(wide)} run past [0, 1]: with {seeds} seed(s) a Student-t "
                     "interval of a rate is wide; the rates themselves lie in [0, 1]. More seeds narrow it.")
    gone = [f"{label} ({s['collapsed']}/{s['runs']})" for label, s in summary.items() if s["collapsed"]]
    if gone:
        notes.append(f"seeds whose policy collapsed onto one action (its largest sampled-action share above 0.9 at "
                     f"the end): {', '.join(gone)}. A collapsed policy samples the same batch whatever the "
                     "estimator, so its rows cannot tell the estimators apart; try --head-init-scale 0.01 or a "
                     "lower --learning-rate.")
    return notes
