"""Is 3e-3 the right default learning rate? The default Sokoban run (`RunConfig()`, the earlier main job;
`make train` now runs the recipe at 1e-3) at several learning rates, seeds vmapped.

For each learning rate, S seeds of the default Sokoban run (``RunConfig()``: Gated-BEPO,
60 iterations) as one program (``train_seeds``; one ordinary run directory per seed under
``--out``, so an interrupted sweep resumes). Reported per learning rate, mean +- 95%
t-interval over seeds: held-out and training-task success after training (and the
paired change per seed against its start), the entropy of the sampled actions
(``actions/entropy``, nats; log 4 = 1.39 is uniform over the four moves) at the start, its
minimum and at the end, and how many seeds collapsed (one action above 90% of the sampled
steps in some iteration) and when. Writes ``experiments/results/learning_rate.{json,md}``.

    python -m experiments.learning_rate                      # 3 rates x 4 seeds, ~10 min on 2 CPU cores
    python -m experiments.learning_rate --rates 3e-3 --seeds 2 --iterations 4   # smoke
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from bepo_jax.agent.train import RunConfig, mean_ci
from bepo_jax.agent.train.arms import COLLAPSE, Arm, action_curves, run_arm
from experiments.common import ROOT, command, machine, parser, write_json, write_lines


def seed_numbers(rows: list[dict]) -> dict:
    its, ent, top = action_curves(rows)
    collapsed = [i for i, t in zip(its, top) if t > COLLAPSE]
    return {"held_out_before": rows[0]["eval/success_rate"], "held_out_after": rows[-1]["eval/success_rate"],
            "train_before": rows[0]["eval_train/success_rate"], "train_after": rows[-1]["eval_train/success_rate"],
            "entropy_first": ent[0], "entropy_min": min(ent), "entropy_last": ent[-1], "top_share_last": top[-1],
            "collapse_iteration": collapsed[0] if collapsed else None}


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--rates", default="1e-3,3e-3,1e-2")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--out", default=str(ROOT / "runs" / "learning_rate"))
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",")]
    start = time.perf_counter()
    table = {}
    for lr in rates:
        arm = Arm(f"lr{lr:g}", "gated_bepo", run={"learning_rate": lr})
        rows = run_arm(RunConfig(iterations=args.iterations), arm, range(args.seeds), args.out, progress=False)
        per_seed = [seed_numbers(r) for r in rows]
        summary = {k: mean_ci([s[k] for s in per_seed]) for k in per_seed[0] if k != "collapse_iteration"}
        summary["held_out_change"] = mean_ci([s["held_out_after"] - s["held_out_before"] for s in per_seed])
        summary["train_change"] = mean_ci([s["train_after"] - s["train_before"] for s in per_seed])
        summary["collapsed"] = sum(s["collapse_iteration"] is not None for s in per_seed)
        table[lr] = {"per_seed": per_seed, "summary": summary}
        print(json.dumps({"lr": lr, **{k: v for k, v in summary.items()}}), flush=True)
    wall = time.perf_counter() - start
    cmd = command("learning_rate")
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    info = dict(command=cmd, machine=machine(), seeds=args.seeds, iterations=args.iterations, collapse=COLLAPSE,
                wall_s=wall, rates={f"{lr:g}": v for lr, v in table.items()})
    write_json(out / "learning_rate.json", info, indent=2)
    f = lambda mh, d=3: "n/a" if np.isnan(mh[0]) else f"{mh[0]:.{d}f}" + ("" if np.isnan(mh[1]) else f" +- {mh[1]:.{d}f}")
    lines = ["# The default run's learning rate (RunConfig(); the earlier main job)", "", f"Command: `{cmd}`  ",
             f"Default Sokoban run (Gated-BEPO), {args.iterations} iterations, {args.seeds} seeds per rate "
             f"(vmapped); mean +- 95% t-interval over seeds; every run started is in the table. "
             f"Collapsed = one action above {COLLAPSE:.0%} of an iteration's sampled steps. Wall {wall / 60:.0f} min.", "",
             "| learning rate | held-out after | paired change | training tasks after | paired change | "
             "action entropy first / min / last (nats) | collapsed seeds |", "|---|---|---|---|---|---|---|"]
    for lr, v in table.items():
        s = v["summary"]
        coll = [x["collapse_iteration"] for x in v["per_seed"] if x["collapse_iteration"] is not None]
        lines.append(f"| {lr:g} | {f(s['held_out_after'])} | {f(s['held_out_change'])} | {f(s['train_after'])} | "
                     f"{f(s['train_change'])} | {f(s['entropy_first'], 2)} / {f(s['entropy_min'], 2)} / "
                     f"{f(s['entropy_last'], 2)} | {s['collapsed']}/{args.seeds}"
                     + (f" (iterations {', '.join(map(str, coll))})" if coll else "") + " |")
    write_lines(out / "learning_rate.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
