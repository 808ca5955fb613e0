"""Score finished runs again, on held-out tasks they were never scored on.

A claims experiment scores each run's final policy on its seed's first ``eval_tasks`` held-out
tasks (E2: 8 TextWorld games, 8 samples each). Where its paired intervals are wide, is the
spread the runs' or the evaluation's? This loads the final checkpoint of every run of the
chosen arms (the run directories ``claims.py`` wrote under ``--out``; ``runs/`` is not
versioned, so run the experiments first) and evaluates it on the seed's first ``--tasks``
held-out tasks: the m it was scored on, sampled again, and the ``--tasks`` - m after them,
which no run was scored on and no claim was picked by.

Per run: s_rec, its recorded final score; s_again, the same m tasks sampled again; s_fresh, the
fresh tasks. Two noises sit in a held-out score, and the report gives both:

- sampling noise (the same policy and tasks, independent samples):
      sigma_sample^2 = Var(s_rec - s_again) / 2                      (over every run)
- the held-out tasks' noise: a seed's paired difference of arms on n tasks is the mean over the
  tasks of the per-task differences d_{s,g} (the arms share the seed's tasks), so the choice and
  the sampling of the tasks alone spread it over seeds by
      SD_tasks(n) = sqrt( mean_s Var_g(d_{s,g}) / n )                (Var_g over the seed's N tasks)
  set beside the observed per-seed SD of the difference on the scored (n = m) and fresh (n = N - m)
  tasks. Where the two are close, more held-out tasks (not more seeds) narrow an interval.

Every interval: mean +- 95% Student-t half-width over seeds; differences paired per seed (the arms
of a seed share its tasks and initial policy). Resumable: each run's evaluation is written to the
results file as it finishes and not repeated.

    python -m experiments.rescore --experiment e2,e2_confirm --tasks 32 --name e2_rescore   # E2's two claims
    python -m experiments.rescore --experiment e2 --arms grpo,gated_bepo --tasks 16 --name e2_grpo_16
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from bepo_jax.agent.train import (
    RunConfig,
    load_run,
    mean_ci,
    paired_combination,
    read_metrics,
)
from experiments.claims import (
    EXPERIMENTS,
    SCALES,
    Contrast,
    arm_config,
    arm_record,
    base_config,
    finished_run,
    fmt,
    scale_fields,
    seed_numbers,
    verdict,
)
from bepo_jax.agent.envs.pools import task_ids
from experiments.common import ROOT, command, machine, parser, write_json, write_report
from experiments.formatting import (
    points,
    rescore_contrasts,
    rescore_spans,
    task_counts,
)

RESCORE_KEY = 10_007  # the evaluations' sampling key (+ the seed): the runs' own used seed + iteration


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def plan(names: list[str], arms: Optional[list[str]], contrasts: Optional[list[str]]):
    """The experiments (their base configs must agree: their seeds then pool), the arms (default: those
    all of them have) and the contrasts (default: the experiments' own among those arms, else each arm
    minus the first experiment's reference)."""
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise SystemExit(f"--experiment: unknown {unknown}; choose from {', '.join(EXPERIMENTS)}.")
    exps = [EXPERIMENTS[n] for n in names]
    configs = {json.dumps(base_config(e, {}, e.iterations).to_dict(), sort_keys=True) for e in exps}
    if len(configs) > 1:
        raise SystemExit(f"--experiment {','.join(names)}: their base configs differ, so their seeds do not pool; "
                         "rescore them one at a time.")
    shared = [a.label for a in exps[0].arms if all(a.label in {b.label for b in e.arms} for e in exps)]
    for e in exps[1:]:
        for a in e.arms:
            if a.label in shared and arm_record(a) != arm_record(next(b for b in exps[0].arms if b.label == a.label)):
                raise SystemExit(f"arm {a.label!r} is defined differently in {names[0]} and another experiment.")
    chosen = arms or shared
    bad = [a for a in chosen if a not in shared]
    if bad:
        raise SystemExit(f"--arms: {bad} are not arms of every experiment given (they share: {', '.join(shared)}).")
    if contrasts:
        parsed = []
        for c in contrasts:
            a, _, b = c.partition("-")
            if not b or a not in chosen or b not in chosen:
                raise SystemExit(f"--contrasts: {c!r} must be 'arm-arm' with both among --arms ({', '.join(chosen)}).")
            parsed.append(Contrast.minus(a, b))
    else:
        own = [c for e in exps for c in e.contrasts if all(label in chosen for label, _ in c.terms)]
        ref = exps[0].reference
        parsed = list({c.name: c for c in own}.values()) or [Contrast.minus(a, ref) for a in chosen if a != ref]
    return exps, chosen, parsed


def begins_with(more, first, m: int) -> bool:
    """Are the first ``m`` of the task pool ``more`` the pool ``first`` (game paths, or pytrees of arrays)?"""
    if isinstance(more, list):
        return more[:m] == list(first)
    leaves = jax.tree_util.tree_leaves
    return all(np.array_equal(np.asarray(a)[:m], np.asarray(b)) for a, b in zip(leaves(more), leaves(first)))


def rescore_run(run_dir: Path, cfg: RunConfig, tasks: int, games_dir: Path) -> dict:
    """One finished run of ``cfg`` (an arm's config for one seed): its final policy on the seed's first
    ``tasks`` held-out tasks."""
    if not finished_run(run_dir, cfg):
        raise SystemExit(f"{run_dir}: not a finished run of {cfg.iterations} iterations; run its experiment "
                         "with claims.py first (runs/ is not versioned).")
    recorded = seed_numbers(read_metrics(run_dir))
    m = recorded["held_out_tasks"]
    if not m or m >= tasks:
        raise SystemExit(f"--tasks={tasks} must exceed the {m} held-out tasks {run_dir} was scored on.")
    setup, state, it = load_run(run_dir, games_dir=games_dir)
    if it != cfg.iterations:
        raise SystemExit(f"{run_dir}: its newest checkpoint is iteration {it}, not the final {cfg.iterations}.")
    if not begins_with(setup.held_out_tasks(tasks), setup.held_out_tasks(m), m):
        raise SystemExit(f"{run_dir}: the environment's first {tasks} held-out tasks do not begin with the {m} "
                         "the run was scored on, so fresh tasks cannot be told from scored ones.")
    seed = setup.cfg.seed
    ev = setup.evaluate(state.params, n_tasks=tasks, seed=RESCORE_KEY + seed)
    per_task = np.asarray(ev["per_task"])
    return {"seed": seed, "recorded": recorded["held_out_after"], "scored_tasks": m,
            "again": float(per_task[:m].mean()), "fresh": float(per_task[m:].mean()), "fresh_tasks": tasks - m,
            "per_task": ev["per_task"], "task_ids": task_ids(setup.env, setup.held_out_tasks(tasks))}


def run_key(exp_name: str, arm: str, seed: int) -> str:
    return f"{exp_name}/{arm}/seed{seed}"


def seed_groups(names: list[str]) -> list[tuple[str, list[str]]]:
    """Each experiment's seeds, then (for several) all of them pooled."""
    return [(n, [n]) for n in names] + ([("pooled", names)] if len(names) > 1 else [])


def sd(x) -> float:
    return float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")


def summarize(seeds: dict[str, list[int]], arms: list[str], contrasts: list, runs: dict) -> dict:
    """Per arm (all seeds) the recorded, re-sampled and fresh scores; the sampling noise; per contrast and
    seed group the paired differences on the scored and on the fresh tasks, their per-seed SDs and the SDs
    the held-out tasks alone give them (module docstring). ``seeds``: each experiment's seed numbers."""
    names = list(seeds)
    rows = lambda group, arm: [runs[run_key(n, arm, s)] for n in group for s in seeds[n]]
    out = {"arms": {a: {k: mean_ci([r[k] for r in rows(names, a)]) for k in ("recorded", "again", "fresh")}
                    for a in arms}}
    resampled = [r["recorded"] - r["again"] for a in arms for r in rows(names, a)]
    out["sampling_noise"] = {"runs": len(resampled), "sigma_sample": sd(resampled) / np.sqrt(2),
                             "mean_recorded_minus_again": mean_ci(resampled)}
    counts = {(r["scored_tasks"], r["fresh_tasks"]) for a in arms for r in rows(names, a)}
    if len(counts) != 1:
        raise SystemExit(f"the runs were scored on different numbers of held-out tasks {sorted(counts)}; rescore "
                         "experiments that scored alike together.")
    ((m, f),) = counts
    out["contrasts"] = {}
    for c in contrasts:
        by_group = {}
        for label, group in seed_groups(names):
            per_seed = lambda value: paired_combination([(rows(group, arm), w) for arm, w in c.terms], value)
            d_rec, d_fresh = per_seed(lambda r: r["recorded"]), per_seed(lambda r: r["fresh"])
            task_var = float(np.mean([np.var(d, ddof=1) for d in per_seed(lambda r: np.asarray(r["per_task"]))]))
            by_group[label] = {"seeds": len(d_rec), "recorded": mean_ci(d_rec), "fresh": mean_ci(d_fresh),
                               "fresh_verdict": verdict(mean_ci(d_fresh)),
                               "fresh_seeds_above_0": int(np.sum(np.asarray(d_fresh) > 0)),
                               "sd_recorded": sd(d_rec), "sd_fresh": sd(d_fresh), "per_task_variance": task_var,
                               "sd_tasks_recorded": float(np.sqrt(task_var / m)),
                               "sd_tasks_fresh": float(np.sqrt(task_var / f))}
        out["contrasts"][c.name] = by_group
    return out


def report(info: dict) -> str:
    s, names, span = info["summary"], info["experiments"], rescore_spans(info)
    lines = [f"# The final policies of {', '.join(names)} scored again on held-out tasks they were never scored on",
             "", f"Command: `{info['command']}`  ",
             f"Every run's final checkpoint ({len(info['runs'])} runs: arms {', '.join(info['arms'])}; seeds "
             + ", ".join(f"{span[n]} ({n})" for n in names)
             + f") evaluated on its seed's first {info['tasks']} held-out tasks at the run's temperature, "
             f"{info['group_size']} samples each: the {task_counts(info, 'scored_tasks')} it was scored on (sampled "
             f"again) and {task_counts(info, 'fresh_tasks')} fresh ones. Mean +- 95% Student-t half-width over "
             f"seeds; differences paired per seed, in points of success. Evaluation took {info['wall_s'] / 60:.0f} "
             "min.", "", "| arm | runs | recorded final success | same tasks, sampled again | fresh tasks |",
             "|---|---|---|---|---|"]
    for a, v in s["arms"].items():
        n = sum(len(x) for x in info["seeds"].values())
        lines.append(f"| {a} | {n} | {fmt(v['recorded'])} | {fmt(v['again'])} | {fmt(v['fresh'])} |")
    lines += ["", *rescore_contrasts(info)]
    e = s["sampling_noise"]
    lines += ["", "SD from the held-out tasks alone: sqrt(mean over seeds of the variance over the seed's "
              f"{info['tasks']} tasks of the per-task paired difference / the task count): how far a seed's difference "
              "on that many tasks spreads around the same two policies' difference over all tasks. Of it, "
              f"sampling the same tasks again: SD(recorded - sampled again) / sqrt 2 = {100 * e['sigma_sample']:.1f} "
              f"points per score over {e['runs']} runs (recorded - again {points(e['mean_recorded_minus_again'])}, "
              "0 when neither is biased).", "",
              f"Machine: {info['machine']}"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--experiment", required=True, help="claims experiments, comma-separated (their seeds pool)")
    p.add_argument("--arms", default=None, help="comma-separated arm labels (default: those every experiment has)")
    p.add_argument("--contrasts", default=None, help="comma-separated 'a-b' (default: the experiments' own)")
    p.add_argument("--tasks", type=int, default=32, help="held-out tasks per run, the scored ones included")
    p.add_argument("--seeds", type=int, default=None, help="seeds per arm, as claims.py ran them (default: each "
                   "experiment's)")
    p.add_argument("--iterations", type=int, default=None, help="as claims.py ran them (default: each experiment's)")
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu", help="as claims.py ran them")
    p.add_argument("--groups", type=int, default=None, help="as claims.py ran them (smoke runs)")
    p.add_argument("--eval-tasks", type=int, default=None, help="as claims.py ran them (smoke runs)")
    p.add_argument("--name", default=None, help="results file name (default: <experiments>_rescore)")
    p.add_argument("--out", default=str(ROOT / "runs" / "claims"), help="where claims.py wrote the runs")
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    names = _csv(args.experiment)
    exps, arms, contrasts = plan(names, _csv(args.arms) if args.arms else None,
                                 _csv(args.contrasts) if args.contrasts else None)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{args.name or '_'.join(names) + '_rescore'}.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    if earlier and (earlier.get("experiments") != names or earlier.get("tasks") != args.tasks):
        raise SystemExit(f"{path} holds another rescoring ({','.join(earlier.get('experiments', []))}, --tasks "
                         f"{earlier.get('tasks')}); pass another --name to keep it.")
    runs = earlier.get("runs", {})
    games = Path(args.out) / ".textworld_games"  # one cache for every arm (a game's name holds its recipe)
    cmd = command("rescore", argv)
    
    start, spent = time.perf_counter(), earlier.get("wall_s", 0.0) if runs else 0.0
    seeds = {n: list(e.seed_ids(args.seeds or e.seeds)) for n, e in zip(names, exps)}
    scale = scale_fields(args.scale, args.groups, args.eval_tasks)
    info = dict(command=cmd, machine=machine(), experiments=names, seeds=seeds, arms=arms, tasks=args.tasks,
                group_size=base_config(exps[0], scale, exps[0].iterations).group_size,
                contrasts=[c.name for c in contrasts], runs=runs)
    for name, exp in zip(names, exps):
        base = base_config(exp, scale, args.iterations or exp.iterations)
        for arm in [a for a in exp.arms if a.label in arms]:
            for seed, run_dir in exp.run_dirs(Path(args.out) / name, arm.label, len(seeds[name])).items():
                if run_key(name, arm.label, seed) not in runs:
                    cfg = arm_config(base, arm).replace(seed=seed)
                    runs[run_key(name, arm.label, seed)] = rescore_run(run_dir, cfg, args.tasks, games)
                    info["wall_s"] = spent + time.perf_counter() - start
                    write_json(path, info)  # each run's evaluation kept as it finishes
    info["wall_s"] = spent + time.perf_counter() - start
    info["summary"] = summarize(seeds, arms, contrasts, runs)
    write_report(path, info, report(info))
    return info


if __name__ == "__main__":
    main()
