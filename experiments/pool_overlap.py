"""How many held-out levels of the past Sokoban runs were training or demonstration levels, and what
that changes.

Until held-out pools became disjoint in content (``bepo_jax.agent.envs.pools``), a run's held-out
levels were the plain sequence ``sample_tasks(n, seed + EVAL_SEED_OFFSET)``, separated from its
training pool ``sample_tasks(task_pool, seed)`` only by seed; the 6x6 generator repeats levels, so
some held-out levels were, cell for cell, training levels (or, for the warm-start runs, levels of
the demonstrations they were cloned from). This program rebuilds every stored Sokoban
experiment's pools exactly as those runs drew them and counts, per run:

- ``in_pool``: held-out levels whose content is a level of the run's training pool (or of the
  warm start's demonstration pool, counted apart as ``in_demos``);
- ``drawn``: of those, how many the run actually played in training (its 60 x 16 draws, re-made
  from its seed as ``Setup`` draws them);
- ``repeated``: held-out levels that repeat an earlier held-out level.

Where per-level outcomes were kept (the rescoring files: the confirmatory test's 512 fresh levels,
E1-recipe's), every contrast is recomputed on the levels new to both training pools of the
seed (the arms of a seed share them) and set beside the stored one. Where only a run's mean
was kept, the largest change the duplicates could make to a paired difference d over n levels
with k duplicates is |d_new - d| <= k (1 + |d|) / (n - k) (the duplicates' own difference lies
in [-1, 1]); the table gives it per experiment (its mean over seeds, in points).

    python -m experiments.pool_overlap      # experiments/results/pool_overlap.{json,md}, ~3 min on 2 cores
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from bepo_jax.agent.envs.registry import make_jax_env
from bepo_jax.agent.train import RunConfig
from bepo_jax.agent.train.init_from import trained_configs
from bepo_jax.agent.train.pieces import held_out_pool, training_pool
from bepo_jax.agent.train.setup import Setup
from experiments import claims, confirmatory
from experiments.common import ROOT, command, machine, parser, write_json
from experiments.warm_start import warm_config

RESCORES = {  # rescoring files with per-level outcomes, and the experiment their runs belong to
    "confirmatory_runs": [f"confirmatory/confirmatory_runs_{c}_rescore.json" for c in range(4)],
    "e1_recipe": ["e1_recipe_rescore.json"],
}
SFT_RUN = "warm start (bepo-jax sft, seed 10000)"


def _env_key(cfg: RunConfig) -> str:
    return json.dumps({k: getattr(cfg, k) for k in ("env", "boxes", "max_steps")})


@lru_cache(maxsize=None)
def _env(key: str):
    fields = json.loads(key)
    return make_jax_env(fields["env"], RunConfig(**fields))


@lru_cache(maxsize=None)
def _train_signatures(key: str, seed: int, task_pool: int) -> tuple[str, ...]:
    """Content digests of a run's training pool (``setup.training_pool``)."""
    env = _env(key)
    return tuple(env.task_signatures(training_pool(env, RunConfig(**json.loads(key), seed=seed, task_pool=task_pool))))


@lru_cache(maxsize=None)
def _held_out_signatures(key: str, seed: int, n: int) -> tuple[str, ...]:
    """Content digests of a run's first ``n`` held-out tasks as the past runs drew them: the plain seeded
    sequence (``setup.held_out_pool(..., pools="seeded")``)."""
    env = _env(key)
    return tuple(env.task_signatures(held_out_pool(env, RunConfig(**json.loads(key), seed=seed), n, pools="seeded")))


def drawn_indices(cfg: RunConfig) -> set[int]:
    """The training-pool indices a run of ``cfg`` played: ``Setup``'s draw of each iteration 1..iterations."""
    setup = Setup(cfg.replace(init_from=""))  # the draw does not depend on the warm start
    out = set()
    for it in range(1, cfg.iterations + 1):
        k_task, _ = jax.random.split(setup.iteration_key(it))
        out.update(int(i) for i in np.asarray(setup._draw(k_task)))
    return out


def demo_configs(cfg: RunConfig) -> list[RunConfig]:
    """The configs of the runs ``cfg`` was warm-started from: the warm-start experiment's SFT run
    (``warm_start.warm_config``: its training pool holds the demonstration levels) for the stored
    experiments' ``init_from``, else the chain ``init_from`` names on disk."""
    if not cfg.init_from:
        return []
    if cfg.init_from == claims.WARM_START_DIR:
        return [warm_config()]
    return trained_configs(cfg)[1:]


def run_overlap(cfg: RunConfig, n_eval: int, *, with_drawn: bool = True) -> dict:
    """One run's held-out pool of ``n_eval`` against its training pool and its warm starts' pools."""
    key = _env_key(cfg)
    train = _train_signatures(key, cfg.seed, cfg.task_pool)
    demos = set()
    for src in demo_configs(cfg):
        demos.update(_train_signatures(_env_key(src), src.seed, src.task_pool))
    held = _held_out_signatures(key, cfg.seed, n_eval)
    train_set = set(train)
    dup = [i for i, s in enumerate(held) if s in train_set]
    demo_dup = [i for i, s in enumerate(held) if s in demos]
    out = {"seed": cfg.seed, "held_out": n_eval, "train_pool": len(train), "in_pool": len(dup),
           "in_demos": len(demo_dup), "repeated": n_eval - len(set(held)),
           "seen_index": sorted(set(dup) | set(demo_dup))}  # held-out levels trained on or cloned
    if with_drawn:
        played = {train[i] for i in drawn_indices(cfg)}
        out["drawn"] = sum(held[i] in played for i in dup)
    return out


def pairwise(contrasts) -> list:
    """The contrasts of the form a - b (the bound and the recomputation below are for those)."""
    return [c for c in contrasts if [w for _, w in c.terms] == [1, -1]]


def bound(per_seed_d: list[float], k: list[int], n: int) -> float:
    """Mean over seeds of the largest change k (1 + |d|) / (n - k) (points) duplicates can make to a
    paired difference d (fractions) over n levels."""
    return float(np.mean([100 * kk * (1 + abs(d)) / (n - kk) for d, kk in zip(per_seed_d, k)]))


def experiment_table(name: str, exp, *, with_drawn: bool) -> dict:
    """Per arm whose training pool differs (task_pool, init_from), per seed: ``run_overlap``."""
    base = claims.base_config(exp, {}, exp.iterations)
    rows, seen = {}, {}
    for arm in exp.arms:
        cfg = claims.arm_config(base, arm)
        pool_key = (cfg.task_pool, cfg.init_from, _env_key(cfg), cfg.iterations, cfg.groups)
        if pool_key in seen:
            rows[arm.label] = {"same_pools_as": seen[pool_key]}
            continue
        seen[pool_key] = arm.label
        rows[arm.label] = [run_overlap(cfg.replace(seed=s), cfg.eval_tasks, with_drawn=with_drawn)
                           for s in exp.seed_ids(exp.seeds)]
    return {"title": exp.title, "eval_tasks": base.eval_tasks, "arms": rows}


def _runs(files: list[str], results: Path) -> dict:
    runs = {}
    for f in files:
        runs.update(json.loads((results / f).read_text())["runs"])
    return runs


def recompute(name: str, results: Path) -> dict:
    """The rescored experiment's contrasts on the fresh levels, with and without the levels whose
    content is in the seed's training pool."""
    exp = claims.EXPERIMENTS[name]
    runs = _runs(RESCORES[name], results)
    base = claims.base_config(exp, {}, exp.iterations)
    by_seed = {}
    out = {"contrasts": {}, "duplicates_per_seed": {}}
    for s in exp.seed_ids(exp.seeds):
        some = next(v for k, v in runs.items() if k.endswith(f"/seed{s}"))
        n, m = len(some["per_task"]), some["scored_tasks"]
        cfg = base.replace(seed=s)
        train = set(_train_signatures(_env_key(cfg), s, cfg.task_pool))
        held = _held_out_signatures(_env_key(cfg), s, n)
        keep = np.asarray([h not in train for h in held])
        keep[:m] = False  # the fresh levels only (the first m were the ones each run was scored on)
        by_seed[s] = keep
        out["duplicates_per_seed"][s] = int((n - m) - keep[m:].sum())

    def fresh(arm: str, s: int, drop: bool) -> Optional[float]:
        r = next((v for k, v in runs.items() if k.endswith(f"/{arm}/seed{s}")), None)
        if r is None:
            return None
        x = np.asarray(r["per_task"], np.float64)
        sel = by_seed[s] if drop else np.arange(len(x)) >= r["scored_tasks"]
        return float(x[sel].mean())

    for c in pairwise(exp.contrasts):
        (a, _), (b, _) = c.terms
        rows = {}
        for drop in (False, True):
            d = [(fresh(a, s, drop), fresh(b, s, drop)) for s in exp.seed_ids(exp.seeds)]
            if any(x is None or y is None for x, y in d):
                break
            rows["without_duplicates" if drop else "stored"] = confirmatory.paired_test(
                [100 * (x - y) for x, y in d])
        if len(rows) == 2:
            out["contrasts"][c.name] = rows
    if name == "confirmatory_runs":
        primary = [c.name for c in claims.CONFIRMATORY_PRIMARY]
        for which in ("stored", "without_duplicates"):
            ps = {k: out["contrasts"][k][which]["p"] for k in primary if k in out["contrasts"]}
            if len(ps) == len(primary):
                for k, h in confirmatory.holm(ps).items():
                    out["contrasts"][k][which]["holm"] = {**h, "decision": confirmatory.decision(
                        out["contrasts"][k][which], h)}
    return out


def _per_seed_held_out(name: str, results: Path) -> dict:
    """Per arm, the stored per-seed held-out success at the end (the experiment's results file)."""
    path = results / ("confirmatory.json" if name == "confirmatory_runs" else f"{name}.json")
    if not path.exists():
        return {}
    info = json.loads(path.read_text())
    return {a: [x["held_out_after"] for x in rows] for a, rows in info.get("per_seed", {}).items()
            if rows and isinstance(rows[0], dict) and "held_out_after" in rows[0]}


def _rows(table: dict, arm: str) -> list[dict]:
    rows = table["arms"][arm]
    return table["arms"][rows["same_pools_as"]] if isinstance(rows, dict) else rows


def bounds(name: str, exp, table: dict, results: Path) -> dict:
    """Per contrast of the experiment: the mean over seeds of the largest change the held-out levels either
    arm trained on or was cloned from (k per seed: the union over the two arms) could make to its stored
    per-seed differences (points)."""
    finals = _per_seed_held_out(name, results)
    out = {}
    for c in pairwise(exp.contrasts):
        (a, _), (b, _) = c.terms
        if a not in finals or b not in finals:
            continue
        d = [x - y for x, y in zip(finals[a], finals[b])]
        ra, rb = _rows(table, a), _rows(table, b)
        k = [len(set(x["seen_index"]) | set(y["seen_index"])) for x, y in zip(ra, rb)][:len(d)]
        out[c.name] = {"stored": float(100 * np.mean(d)), "largest_change": bound(d, k, table["eval_tasks"])}
    return out


def sft_overlap() -> dict:
    """The warm start's own held-out levels against its demonstration levels (its training pool)."""
    cfg = warm_config()
    return run_overlap(cfg, cfg.eval_tasks, with_drawn=False)


def sokoban_experiments() -> list[str]:
    return [n for n, e in claims.EXPERIMENTS.items()
            if str(e.base.get("env", "")).startswith("sokoban") and not n.startswith("confirmatory_runs_")]


def markdown(info: dict) -> str:
    lines = ["# Held-out levels that were training levels (the past Sokoban runs)", "",
             f"`{info['command']}`. Per experiment, summed over its seeds: the held-out levels whose content equals a "
             "level of the run's training pool (`in pool`; of those, played in training: `drawn`), of the warm "
             "start's demonstration pool (`in demos`; a level can be in both), and held-out levels repeating an "
             "earlier one (`repeated`). "
             "Arms that change the training pool are listed apart.", "",
             "| experiment | arm(s) | seeds x held-out levels | training pool | in pool | drawn | in demos | "
             "repeated |", "|---|---|---|---|---|---|---|---|"]
    for name, t in info["experiments"].items():
        for arm, rows in t["arms"].items():
            if isinstance(rows, dict):
                continue
            same = [a for a, r in t["arms"].items() if isinstance(r, dict) and r["same_pools_as"] == arm]
            drawn = sum(r.get("drawn", 0) for r in rows) if all("drawn" in r for r in rows) else "-"
            lines.append(f"| {name} | {', '.join([arm, *same])} | {len(rows)} x {t['eval_tasks']} | "
                         f"{rows[0]['train_pool']} | {sum(r['in_pool'] for r in rows)} | {drawn} | "
                         f"{sum(r['in_demos'] for r in rows)} | {sum(r['repeated'] for r in rows)} |")
    s = info["sft"]
    lines += [f"| warm start's own evaluation | sft | 1 x {s['held_out']} | {s['train_pool']} | {s['in_pool']} | - | "
              f"- | {s['repeated']} |", ""]
    for name, r in info["recomputed"].items():
        per = list(r["duplicates_per_seed"].values())
        lines += [f"## {name}: contrasts on the fresh levels, with and without the duplicates", "",
                  f"Per seed {min(per)}-{max(per)} of the fresh levels were training-pool levels. Paired difference "
                  "in points, mean +- 95% t over seeds (p: two-sided paired t)" +
                  ("; Holm over the four primary contrasts, as the protocol fixed it" if name == "confirmatory_runs"
                   else "") + ".", "",
                  "| contrast | stored (all fresh levels) | without the duplicates | decision (stored -> without) |",
                  "|---|---|---|---|"]
        for cname, rows in r["contrasts"].items():
            cell = lambda t: f"{t['mean']:+.1f} +- {t['half_width']:.1f} (p {t['p']:.3g})"
            dec = " -> ".join(rows[w]["holm"]["decision"] for w in ("stored", "without_duplicates")) \
                if "holm" in rows["stored"] else "-"
            lines.append(f"| {cname} | {cell(rows['stored'])} | {cell(rows['without_duplicates'])} | {dec} |")
        lines.append("")
    lines += ["## The largest change where only means were kept", "",
              "Per contrast with stored per-seed finals: the mean over seeds of k (1 + |d|) / (n - k) in points, the "
              "most the duplicates could move the paired difference on the recorded held-out levels if the arms' "
              "outcomes on them were as different as possible (a bound, not an estimate).", "",
              "| experiment | contrast | stored (points) | largest change (points) |", "|---|---|---|---|"]
    for name, per in info["bounds"].items():
        for cname, b in per.items():
            lines.append(f"| {name} | {cname} | {b['stored']:+.1f} | {b['largest_change']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    p.add_argument("--no-drawn", action="store_true", help="skip re-making the training draws (faster)")
    args = p.parse_args(argv)
    results = Path(args.results)
    names = sokoban_experiments()
    tables = {n: experiment_table(n, claims.EXPERIMENTS[n], with_drawn=not args.no_drawn) for n in names}
    info = dict(command=command("pool_overlap", argv), machine=machine(), experiments=tables, sft=sft_overlap(),
                recomputed={n: recompute(n, results) for n in RESCORES},
                bounds={n: b for n in names if (b := bounds(n, claims.EXPERIMENTS[n], tables[n], results))})
    write_json(results / "pool_overlap.json", info, indent=1)
    md = markdown(info)
    (results / "pool_overlap.md").write_text(md)
    print(md)
    return info


if __name__ == "__main__":
    main()
