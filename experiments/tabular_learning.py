"""Exact tabular learning curves: does better credit mean faster learning? (bepo_jax.lab.learning)

On the credit lab's enumerated models -- the five diagnostic worlds and generated Sokoban 6x6
levels -- a tabular softmax policy learns with each estimator's policy gradient; after every
update its success probability within the time limit is computed exactly. Two starts:
uniform, and peaked (Boltzmann over Q* at the temperature that succeeds half the time: the
regime of a warm-started policy, where the confidence gate can close). Every arm of a
(world, start) uses the same sampling keys per iteration (common random numbers), so
differences from GRPO are paired per seed.

Reported per world x start x estimator, over seeds: exact success after 5, 10 and all
iterations (mean +- 95% t), the area under the curve (mean success over iterations 1..N),
the median iteration reaching 90% success (and the share of seeds that reach it), and the
paired difference of the area from GRPO's. Writes
experiments/results/tabular_learning.{json,md,png}.

    python -m experiments.tabular_learning                 # ~10 min on 2 CPU cores
    python -m experiments.tabular_learning --quick         # 2 worlds, 3 estimators, 50 seeds
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bepo_jax.lab.learning import LearningConfig
from bepo_jax.lab.learning_report import compact, markdown, plot, run, summarize
from experiments.common import ROOT, command, parser, write_json, write_text

WORLDS = ("key_door", "bump", "aliased", "loop", "slippery", "sokoban")
ESTIMATORS = ("grpo", "gigpo", "hgpo", "graphgpo", "gagpo", "g2po", "ladder_fp_added=bepo_nogate:eta_gated=1",
              "bepo_additive", "gated_bepo")


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--quick", action="store_true", help="2 worlds, 3 estimators, 50 seeds, 20 iterations")
    d = LearningConfig()
    p.add_argument("--seeds", type=int, default=d.seeds)
    p.add_argument("--iterations", type=int, default=d.iterations)
    p.add_argument("--learning-rate", type=float, default=d.learning_rate)
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    worlds, ests = (("key_door", "bump"), ("grpo", "gigpo", "gated_bepo")) if args.quick else (WORLDS, ESTIMATORS)
    cfg = LearningConfig(iterations=20 if args.quick else args.iterations, seeds=50 if args.quick else args.seeds,
                         learning_rate=args.learning_rate)
    t0 = time.perf_counter()
    res = run(worlds, ests, cfg)
    summary = summarize(res)
    cmd = command("tabular_learning", argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "tabular_learning_quick" if args.quick else "tabular_learning"
    write_json(out / f"{name}.json", {"command": cmd, **compact(res), "summary": summary}, indent=None)
    write_text(out / f"{name}.md", markdown(res, summary, cmd, time.perf_counter() - t0))
    plot(res, out / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
