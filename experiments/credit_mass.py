"""The effective sample size of a learning comparison: how much of each batch an arm's estimator credits.

Arms of a claims experiment take the same optimizer steps (iterations x PPO epochs x minibatches,
checked here), but an update learns only from the records whose advantage is not 0, weighted by
its size: outcome credit is 0 on every record of a group whose trajectories agree, step credit
need not be, and a gate or a shrinkage decides where it is. So beside the steps this measures,
per record of a batch (valid records only; tolerance 1e-6):

    credit mass  = #{records with |A| > 1e-6} / #{records}
    mean |A|     = sum |A| / #{records}
    mixed groups = #{groups with both successes and failures} / #{groups}   (where outcome credit acts)

on ``--batches`` batches per seed, drawn from the seed's training tasks and rolled out with keys
fixed by the seed (``MASS_KEY`` + seed: a key no run used):

* at the **initial policy** (every arm of a seed starts from it): the same batches under every arm's
  estimator -- matched data, so the differences are the estimators' own;
* at each arm's **final policy** (its run's last checkpoint): the same draws under its own estimator
  -- what it learned from at the end.

Every number: the mean over the seed's batches, then the mean +- the 95% Student-t half-width over
seeds. Only JAX environments (the host loops' rollouts are not one program). Resumable: each seed's
numbers are written as they finish and not measured again.

    python -m experiments.credit_mass --experiment rivals_recipe     # ~10 minutes on 2 cores
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from bepo_jax.agent.train import RunConfig, Setup, mean_ci
from bepo_jax.credit.estimators.registry import get_estimator, make_config
from bepo_jax.agent.train.loop import restore_latest
from experiments.claims import EXPERIMENTS, SCALES, arm_config, base_config, finished_run, fmt, scale_fields
from experiments.common import ROOT, command, machine, parser, write_json, write_report
from experiments.formatting import credit_mass_lines

MASS_KEY = 20_011  # the batches' key (+ the seed); the runs used seed + iteration
TOL = 1e-6  # |A| above it counts as credit
# RunConfig fields an arm may set without changing the policy, the update or the rollout
ESTIMATOR_FIELDS = frozenset({"estimator", "estimator_config"})


def batch_numbers(adv, valid, success) -> dict:
    """Credit mass, mean |A| (over the valid records) and the share of mixed-outcome groups of one
    batch: ``adv``, ``valid`` [B, K, T], ``success`` [B, K] (NumPy)."""
    adv, valid, success = np.asarray(adv, np.float64), np.asarray(valid, bool), np.asarray(success, bool)
    n = max(int(valid.sum()), 1)
    wins = success.sum(axis=-1)
    return {"mass": float(((np.abs(adv) > TOL) & valid).sum() / n),
            "mean_abs": float(np.where(valid, np.abs(adv), 0.0).sum() / n),
            "mixed": float(np.mean((wins > 0) & (wins < success.shape[-1])))}


def mean_over(batches: list[dict]) -> dict:
    return {k: float(np.mean([b[k] for b in batches])) for k in batches[0]}


def same_policy_and_update(a: RunConfig, b: RunConfig) -> bool:
    """Do two arms' configs differ only in their estimator (so one setup rolls out both)?"""
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    return all(da[k] == db[k] for k in da if k not in ESTIMATOR_FIELDS)


def optimizer_steps(cfg: RunConfig) -> int:
    return cfg.iterations * cfg.ppo_epochs * cfg.num_minibatches


def measure_seed(cfgs: dict[str, RunConfig], run_dirs: dict[str, Path], batches: int) -> dict:
    """One seed: ``cfgs`` each arm's config (this seed), ``run_dirs`` each arm's finished run."""
    first = next(iter(cfgs.values()))
    setup = Setup(first)
    if setup.host:
        raise SystemExit(f"credit_mass: {first.env} is rolled out on the host, not as one program; "
                         "measure a JAX environment's experiment.")
    roll = jax.jit(setup.rollout_fn)
    tasks = jax.tree_util.tree_map(jnp.asarray, setup.train_tasks)
    keys = [jax.random.fold_in(jax.random.PRNGKey(MASS_KEY + first.seed), b) for b in range(batches)]
    credit = {label: jax.jit(lambda batch, c=c: get_estimator(c.estimator).kernel(
        batch, make_config(c.estimator, **c.estimator_config)).advantage) for label, c in cfgs.items()}

    def numbers(state, labels):
        per = {label: [] for label in labels}
        for k in keys:
            ro = roll(state, tasks, k)
            for label in labels:
                per[label].append(batch_numbers(credit[label](ro.batch), ro.batch.mask, ro.success))
        return {label: mean_over(v) for label, v in per.items()}

    out = {"seed": first.seed, "initial": numbers(setup.init_state(), list(cfgs)), "final": {}}
    for label, run in run_dirs.items():
        state, it = restore_latest(setup, run)
        if it != cfgs[label].iterations:
            raise SystemExit(f"{run}: its newest checkpoint is iteration {it}, not the final {cfgs[label].iterations}.")
        out["final"][label] = numbers(state, [label])[label]
    return out


def summarize(per_seed: list[dict], arms: list[str]) -> dict:
    """Per arm, mean +- 95% t over seeds of each number at the initial and at the final policy."""
    col = lambda where, arm, k: mean_ci([s[where][arm][k] for s in per_seed])
    return {a: {where: {k: col(where, a, k) for k in ("mass", "mean_abs", "mixed")} for where in ("initial", "final")}
            for a in arms}


def report(info: dict) -> str:
    s, seeds = info["summary"], info["seeds"]
    lines = [f"# How much of each batch the arms of {info['experiment']} credit: the comparison's effective sample size",
             "", f"Command: `{info['command']}`  ",
             f"Every arm takes {info['optimizer_steps']} optimizer steps ({info['iterations']} iterations x "
             f"{info['ppo_epochs']} PPO epochs x {info['num_minibatches']} minibatches). Per seed ({seeds[0]}-{seeds[-1]}), "
             f"{info['batches']} batches of {info['groups']} groups x {info['group_size']} trajectories drawn from its "
             "training tasks with keys no run used; at the initial policy (shared by the seed's arms) every arm's "
             "estimator on the same batches, at each arm's final policy (its last checkpoint) its own. Credit mass: the "
             f"share of records with |A| > {TOL:g}; mean |A| over records; mixed groups: the share of groups with "
             "both outcomes (where outcome credit is not 0). Mean over batches, then mean +- 95% Student-t half-width "
             f"over seeds. Took {info['wall_s'] / 60:.0f} min.", "",
             *credit_mass_lines(info)]
    first = next(iter(s.values()))["initial"]["mixed"]
    lines += ["", f"Mixed groups at the initial policy (every arm's batches): {fmt(first)}.", "",
              f"Machine: {info['machine']}"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--experiment", required=True, choices=sorted(EXPERIMENTS))
    p.add_argument("--arms", default=None, help="comma-separated arm labels (default: the experiment's)")
    p.add_argument("--batches", type=int, default=2, help="batches per seed and policy")
    p.add_argument("--seeds", type=int, default=None, help="seeds per arm, as claims.py ran them")
    p.add_argument("--iterations", type=int, default=None, help="as claims.py ran them")
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu", help="as claims.py ran them")
    p.add_argument("--groups", type=int, default=None, help="as claims.py ran them (smoke runs)")
    p.add_argument("--eval-tasks", type=int, default=None, help="as claims.py ran them (smoke runs)")
    p.add_argument("--out", default=str(ROOT / "runs" / "claims"), help="where claims.py wrote the runs")
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    if args.batches < 1:
        raise SystemExit(f"--batches={args.batches}: measure at least 1 batch per seed.")
    exp = EXPERIMENTS[args.experiment]
    labels = [a.label for a in exp.arms]
    arms = [a for a in exp.arms if a.label in (args.arms.split(",") if args.arms else labels)]
    if args.arms and len(arms) != len(args.arms.split(",")):
        raise SystemExit(f"--arms: {args.arms!r} names arms {args.experiment} does not have ({', '.join(labels)}).")
    base = base_config(exp, scale_fields(args.scale, args.groups, args.eval_tasks), args.iterations or exp.iterations)
    cfgs = {a.label: arm_config(base, a) for a in arms}
    for label, c in cfgs.items():
        if not same_policy_and_update(c, base):
            raise SystemExit(f"arm {label!r} changes more than the estimator; its batches would not be the others'.")
    seeds = list(exp.seed_ids(args.seeds or exp.seeds))
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{args.experiment}_credit_mass.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    if earlier and (earlier.get("arms") != [a.label for a in arms] or earlier.get("batches") != args.batches):
        raise SystemExit(f"{path} holds another measurement (arms {earlier.get('arms')}, --batches "
                         f"{earlier.get('batches')}); move it away to measure again.")
    done = {s["seed"]: s for s in earlier.get("per_seed", [])}
    info = dict(command=command("credit_mass", argv), machine=machine(), experiment=args.experiment,
                arms=[a.label for a in arms], seeds=seeds, batches=args.batches, groups=base.groups,
                group_size=base.group_size, iterations=base.iterations, ppo_epochs=base.ppo_epochs,
                num_minibatches=base.num_minibatches, optimizer_steps=optimizer_steps(base), per_seed=[])
    start, spent = time.perf_counter(), earlier.get("wall_s", 0.0)
    for seed in seeds:
        if seed not in done:
            run_dirs = {a.label: exp.run_dirs(Path(args.out) / args.experiment, a.label, len(seeds))[seed] for a in arms}
            seed_cfgs = {label: c.replace(seed=seed) for label, c in cfgs.items()}
            for label, run in run_dirs.items():
                if not finished_run(run, seed_cfgs[label]):
                    raise SystemExit(f"{run}: not a finished run of {base.iterations} iterations; run "
                                     f"`python -m experiments.claims --experiment {args.experiment}` first "
                                     "(runs/ is not versioned).")
            done[seed] = measure_seed(seed_cfgs, run_dirs, args.batches)
        info["per_seed"] = [done[s] for s in seeds if s in done]
        info["wall_s"] = spent + time.perf_counter() - start
        write_json(path, info)  # each seed kept as it finishes
    info["summary"] = summarize(info["per_seed"], info["arms"])
    write_report(path, info, report(info))
    return info


if __name__ == "__main__":
    main()
