"""Benchmark: S seeds of the default config as one program (vmapped, or looped inside it) vs S sequential runs.

Both train the default Sokoban config (``RunConfig()``, Gated-BEPO) for the same number of
iterations per seed, in one process, without evaluations or checkpoints (the iteration
loop alone): wall time including compilation (one compile for the vmapped program, one per
sequential run — each run is a fresh ``Setup`` as ``bepo-jax compare`` makes them), and
iterations per second per seed after the first iteration. Writes
``experiments/results/bench_seeds.{json,md}``.

    python -m experiments.bench_seeds                 # ~4 min on 2 CPU cores
    python -m experiments.bench_seeds --seeds 4 --iterations 5
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax

from bepo_jax.agent.train import RunConfig, SeedBatch, Setup
from experiments.common import ROOT, command, machine, parser, write_json, write_lines


def sequential(cfg, seeds, iterations):
    t0 = time.perf_counter()
    after_first = 0.0
    for s in seeds:
        setup = Setup(cfg.replace(seed=s))
        state = setup.trainer.init_state()
        state, _ = setup.iterate(state, 1)
        t1 = time.perf_counter()
        for it in range(2, iterations + 1):
            state, _ = setup.iterate(state, it)
        after_first += time.perf_counter() - t1
        jax.clear_caches()  # a fresh run compiles its own program, as separate runs do
    return time.perf_counter() - t0, after_first


def vmapped(cfg, seeds, iterations, runs_per_step=None):
    t0 = time.perf_counter()
    runs = SeedBatch(cfg, seeds, runs_per_step=runs_per_step)
    states = runs.init_states()
    states, _ = runs.iterate(states, 1)
    t1 = time.perf_counter()
    for it in range(2, iterations + 1):
        states, _ = runs.iterate(states, it)
    return time.perf_counter() - t0, time.perf_counter() - t1


def main():
    p = parser(__doc__)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    a = p.parse_args()
    cfg = RunConfig(iterations=a.iterations)
    seeds = list(range(a.seeds))
    rows = []
    variants = (("vmapped (one program)", vmapped),
                ("looped, 1 run per step (one program)", lambda *x: vmapped(*x, runs_per_step=1)),
                ("looped, 2 runs per step (one program)", lambda *x: vmapped(*x, runs_per_step=2)),
                ("sequential runs", sequential))
    for label, fn in variants:
        jax.clear_caches()
        wall, steady = fn(cfg, seeds, a.iterations)
        rows.append(dict(variant=label, seeds=a.seeds, iterations=a.iterations, wall_s=wall,
                         steady_s=steady, seed_iterations_per_s=a.seeds * (a.iterations - 1) / steady))
        print(json.dumps(rows[-1]), flush=True)
    seq = rows[-1]
    for r in rows[:-1]:
        r["wall_speedup"] = seq["wall_s"] / r["wall_s"]
        r["steady_speedup"] = r["seed_iterations_per_s"] / seq["seed_iterations_per_s"]
    res = dict(command=command("bench_seeds"), machine=machine(), rows=rows,
               wall_speedup=rows[0]["wall_speedup"], steady_speedup=rows[0]["steady_speedup"],
               best=max(rows[:-1], key=lambda r: r["wall_speedup"])["variant"])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "bench_seeds.json", res, indent=1)
    m = res["machine"]
    lines = ["# Seeds as one program vs sequential runs", "", f"Command: `{res['command']}`  ",
             f"Machine: {m['platform']}, {m['cpu_count']} CPUs, backend {m['backend']}; jax {m['jax']}. "
             f"The default config (RunConfig(): Sokoban 6x6, Gated-BEPO, B = {cfg.groups} x K = {cfg.group_size}), "
             f"{a.iterations} iterations per seed, no evaluation or checkpoints.", "",
             "Looped = `SeedBatch(runs_per_step=k)`: one compiled program whose run axis is a loop (`lax.map`) "
             "over chunks of k vmapped runs.", "",
             "| variant | seeds | wall time incl. compile | seed-iterations/s after the first iteration "
             "| vs sequential, wall | vs sequential, after compile |",
             "|---|---|---|---|---|---|"]
    sp = lambda r, k: f"{r[k]:.2f}x" if k in r else ""
    lines += [f"| {r['variant']} | {r['seeds']} | {r['wall_s']:.1f} s | {r['seed_iterations_per_s']:.2f} | "
              f"{sp(r, 'wall_speedup')} | {sp(r, 'steady_speedup')} |" for r in rows]
    write_lines(out / "bench_seeds.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
