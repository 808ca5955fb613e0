"""Profile: where an iteration of the main job's recipe spends its time, and which run-axis layout is fastest.

The recipe (``claims.MAIN_JOB``: Sokoban 6x6 on fresh levels, 16 groups x 8 trajectories, a
2-layer width-128 policy, 4 epochs of 4 minibatches per batch; Gated-BEPO) with S seeds as one
program (``SeedBatch``). Its parts are jitted and timed apart, on the same states, tasks and
keys as the fused iteration: the rollout (sampling the S x 16 x 8 episodes), the estimator
(once on all S x 16 groups), the update (4 x 4 PPO minibatch steps), the fused iteration the
runs use, and the evaluation (128 held-out + the training pool, both as the runs do it every
``eval_every`` iterations). Each part: compile time (first call minus a steady call) and the
median of steady calls. Then the fused iteration under each run-axis layout
(``runs_per_step`` 1, 2, 4 and every run vmapped). Writes
experiments/results/profile_recipe.{json,md}.

    python -m experiments.profile_recipe                 # S = 16 (the confirmatory run), ~10 min
    python -m experiments.profile_recipe --seeds 4 --repeats 2   # a quick look
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

from bepo_jax.agent.train import RunConfig
from bepo_jax.agent.train.multiseed import SeedBatch
from experiments.claims import MAIN_JOB
from experiments.common import ROOT, command, parser, write_lines


def timed(fn, *args, repeats: int):
    """(compile seconds, median steady seconds) of ``fn(*args)``, blocking on the result."""
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    steady = statistics.median(times)
    return max(first - steady, 0.0), steady


def parts(cfg: RunConfig, seeds: list[int], repeats: int) -> list[dict]:
    runs = SeedBatch(cfg, seeds)
    s0 = runs.setups[0]
    states, keys = runs.init_states(), runs.keys(1)
    rollout = jax.jit(lambda st, tasks, k: runs._over_runs(s0.rollout_fn, st, tasks, k))
    ros = jax.block_until_ready(rollout(states, runs.tasks, keys))
    S, B = ros.batch.mask.shape[:2]
    flat = jax.tree_util.tree_map(lambda x: x.reshape((S * B,) + x.shape[2:]), ros.batch)
    estimator = jax.jit(s0.advantages)
    out = jax.block_until_ready(estimator(flat))
    out_sb = jax.tree_util.tree_map(lambda x: x.reshape((S, B) + x.shape[1:]), out)
    update = jax.jit(lambda st, ro, o: runs._over_runs(s0.learn_from, st, ro, o))
    fused = jax.jit(runs._iteration)
    rows = []
    for name, fn, args in (("rollout", rollout, (states, runs.tasks, keys)), ("estimator", estimator, (flat,)),
                           ("update (4 epochs x 4 minibatches)", update, (states, ros, out_sb)),
                           ("fused iteration (what the runs execute)", fused, (states, runs.tasks, keys))):
        c, s = timed(fn, *args, repeats=repeats)
        rows.append(dict(part=name, compile_s=c, steady_s=s, per_seed_s=s / len(seeds)))
    t = time.perf_counter()
    runs.evaluate_all(states, seeds)
    runs.evaluate_all(states, seeds, training=True)
    first = time.perf_counter() - t
    t = time.perf_counter()
    runs.evaluate_all(states, seeds)
    runs.evaluate_all(states, seeds, training=True)
    steady = time.perf_counter() - t
    rows.append(dict(part=f"evaluation ({cfg.eval_tasks} held-out + training pool)", compile_s=max(first - steady, 0.0),
                     steady_s=steady, per_seed_s=steady / len(seeds)))
    return rows


def layouts(cfg: RunConfig, seeds: list[int], repeats: int) -> list[dict]:
    rows = []
    for rps in (1, 2, 4, None):
        if rps is not None and rps > len(seeds):
            continue
        runs = SeedBatch(cfg, seeds, runs_per_step=rps)
        states, keys = runs.init_states(), runs.keys(1)
        fused = jax.jit(runs._iteration)
        c, s = timed(fused, states, runs.tasks, keys, repeats=repeats)
        rows.append(dict(runs_per_step="all vmapped" if rps is None else rps, compile_s=c, steady_s=s,
                         per_seed_s=s / len(seeds)))
        print(f"  runs_per_step={rows[-1]['runs_per_step']}: {s:.1f} s per iteration "
              f"({s / len(seeds):.2f} s per seed), compile {c:.0f} s", flush=True)
    return rows


def update_flops(cfg: RunConfig) -> dict:
    """The update's work per seed-iteration, counted: forward FLOPs per token ~ 2 x (non-embedding
    parameters) + 4 x L x width x layers (attention), training ~ 3 x forward, over every sequence of
    the batch (padding steps included, as the update runs them) and every epoch. An upper bound: the
    scoring shortcut runs the last layer from the prompt's last position only."""
    from flax import nnx

    from bepo_jax.agent.train.setup import Setup

    s = Setup(cfg.replace(seed=1000))
    leaves = jax.tree_util.tree_leaves_with_path(nnx.state(s.model, nnx.Param))
    params = sum(x.size for _, x in leaves)
    embed = sum(x.size for path, x in leaves if "embed" in jax.tree_util.keystr(path).lower())
    tasks = jax.tree_util.tree_map(lambda x: x[: cfg.groups], s.train_tasks)
    ro = jax.jit(s.rollout)(s.trainer.init_state().params, tasks, jax.random.PRNGKey(0))
    n, L = int(np.prod(ro.tokens.shape[:-1])), int(ro.tokens.shape[-1])
    per_token = 2 * (params - embed) + 4 * L * cfg.width * cfg.layers
    return dict(params=int(params), sequences=n, valid_sequences=int(np.asarray(ro.batch.mask).sum()), length=L,
                epochs=cfg.ppo_epochs, flops=float(3 * per_token * n * L * cfg.ppo_epochs))


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="steady calls per part (median)")
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    p.add_argument("--report-only", action="store_true", help="rewrite the report from profile_recipe.json")
    args = p.parse_args(argv)
    cfg = RunConfig(**MAIN_JOB, estimator="gated_bepo", iterations=60, eval_every=30)
    out = Path(args.out)
    if args.report_only:
        d = json.loads((out / "profile_recipe.json").read_text())
        meta, part_rows, layout_rows = d["meta"], d["parts"], d["layouts"]
        args.seeds, args.repeats = meta["seeds"], int(meta["command"].split("--repeats ")[1].split()[0])
    else:
        seeds = list(range(1000, 1000 + args.seeds))  # profiling seeds, used by no experiment
        part_rows = parts(cfg, seeds, args.repeats)
        for r in part_rows:
            print(f"{r['part']:>45}: {r['steady_s']:.2f} s ({r['per_seed_s']:.3f} s per seed), compile "
                  f"{r['compile_s']:.0f} s", flush=True)
        layout_rows = layouts(cfg, seeds, args.repeats)
        meta = dict(command=command("profile_recipe", ["--seeds", str(args.seeds), "--repeats", str(args.repeats)]),
                    machine=f"{platform.platform()}, {jax.device_count()} {jax.default_backend()} device(s)",
                    jax=jax.__version__, seeds=args.seeds, config={**MAIN_JOB, "estimator": "gated_bepo"})
    work = update_flops(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_recipe.json").write_text(json.dumps(dict(meta=meta, parts=part_rows, layouts=layout_rows,
                                                             update_work=work), indent=1))
    fused = next(r for r in part_rows if r["part"].startswith("fused"))
    update = next(r for r in part_rows if r["part"].startswith("update"))
    lines = ["# Where an iteration of the main job's recipe spends its time", "",
             f"Command: `{meta['command']}`  ", f"Machine: {meta['machine']}; JAX {meta['jax']}.  ",
             f"The recipe (`claims.MAIN_JOB`, Gated-BEPO) with {args.seeds} seeds as one program (`SeedBatch`, the "
             f"default layout: runs_per_step = 1 on CPU); each part jitted apart on the same inputs; median of "
             f"{args.repeats} steady calls; compile = first call minus a steady one (the rollout and the estimator "
             "ran once before their timing, to give the later parts their inputs: their compile shows 0).", "",
             "| part | seconds per iteration (all seeds) | per seed | share of the fused iteration | compile (s) |",
             "|---|---|---|---|---|"]
    for r in part_rows:
        share = f"{r['steady_s'] / fused['steady_s']:.0%}" if not r["part"].startswith("evaluation") else \
            f"{r['steady_s'] / fused['steady_s']:.0%} (every 30 iterations: {r['steady_s'] / 30 / fused['steady_s']:.1%})"
        lines.append(f"| {r['part']} | {r['steady_s']:.2f} | {r['per_seed_s']:.3f} | {share} | {r['compile_s']:.0f} |")
    lines += ["", "The fused iteration under each run-axis layout (same config and seeds):", "",
              "| runs per step | seconds per iteration | per seed | compile (s) |", "|---|---|---|---|"]
    for r in layout_rows:
        lines.append(f"| {r['runs_per_step']} | {r['steady_s']:.2f} | {r['per_seed_s']:.3f} | {r['compile_s']:.0f} |")
    rate = work["flops"] / update["per_seed_s"] / 1e9
    lines += ["", f"The update's work, counted (`update_flops`): {work['params']:,} parameters, {work['sequences']:,} "
              f"sequences of {work['length']} tokens per seed ({work['valid_sequences']:,} of them valid steps, the "
              f"rest padding the update still runs), {work['epochs']} epochs: at most {work['flops']:.2e} FLOPs per "
              f"seed-iteration, so the measured update runs at up to {rate:.0f} GFLOP/s on this machine's "
              f"{jax.local_device_count()} CPU device(s) -- within a small factor of what two AVX2 cores can do "
              "(~100-200 GFLOP/s peak). What is left to win is the padding: "
              f"{1 - work['valid_sequences'] / work['sequences']:.0%} of the sequences are steps after an "
              "episode ended."]
    write_lines(out / "profile_recipe.md", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
