"""The demo job: a few trajectory groups, each estimator's credit side by side.

The groups are the paper's four patterns (a useful step inside a failed trajectory,
a useless step inside a successful one, aliased observations, and a loop back to a
state), small enough to read every number.
"""

from __future__ import annotations

import sys
from typing import Optional, TextIO

import numpy as np

from .credit.builders import Trajectory, batch_from_trajectories
from .credit.estimators import GatedBEPOConfig, GiGPOConfig, GRPOConfig, gated_bepo, gigpo, grpo
from .credit.types import FAILURE, SUCCESS, TRUNCATED, OUTCOME_NAMES

R = 10.0  # success reward

DEMO_GROUPS = {
    "useful step inside a failed trajectory": [
        Trajectory(["start", "key", "door"], [0, 0, R], SUCCESS),
        Trajectory(["start", "key", "pit"], [0, 0, 0], FAILURE),
        Trajectory(["start", "hall", "pit"], [0, 0, 0], FAILURE),
        Trajectory(["start", "hall", "hall"], [0, 0, 0], TRUNCATED),
    ],
    "useless step inside a successful trajectory": [
        Trajectory(["start", "wall", "start", "key", "door"], [0, 0, 0, 0, R], SUCCESS),
        Trajectory(["start", "key", "door"], [0, 0, R], SUCCESS),
        Trajectory(["start", "hall", "pit"], [0, 0, 0], FAILURE),
    ],
    "aliased observation (one view, two hidden rooms)": [
        Trajectory(["start", "corridor", "goal"], [0, 0, R], SUCCESS),
        Trajectory(["start", "corridor", "trap"], [0, 0, 0], FAILURE),
        Trajectory(["side", "corridor", "trap"], [0, 0, 0], FAILURE),
    ],
    "loop that returns to a state": [
        Trajectory(["a", "b", "a", "b", "c"], [0, 0, 0, 0, R], SUCCESS),
        Trajectory(["a", "b", "a", "d"], [0, 0, 0, 0], FAILURE),
        Trajectory(["a", "d"], [0, 0], FAILURE),
    ],
}


def run_demo(*, bepo: GatedBEPOConfig = GatedBEPOConfig(), gigpo_config: GiGPOConfig = GiGPOConfig(),
             grpo_config: GRPOConfig = GRPOConfig(), out: Optional[TextIO] = None) -> dict:
    """Print the demo tables; return the raw outputs (for tests and notebooks)."""
    out = sys.stdout if out is None else out
    names = list(DEMO_GROUPS)
    batch = batch_from_trajectories([DEMO_GROUPS[n] for n in names])
    res = {"grpo": grpo(batch, grpo_config), "gigpo": gigpo(batch, gigpo_config), "gated_bepo": gated_bepo(batch, bepo)}
    g, gi, be = (np.asarray(res[k].advantage) for k in ("grpo", "gigpo", "gated_bepo"))
    mask = np.asarray(batch.mask)
    print(f"Gated-BEPO {bepo}\n", file=out)
    for b, name in enumerate(names):
        gate = np.asarray(res["gated_bepo"].gate)[b]
        print(f"== group {b}: {name}", file=out)
        print(
            f"   states {int(res['gated_bepo'].num_states[b])}, records {int(mask[b].sum())}, "
            f"gated records {int(gate.sum())}, fixed point: {int(res['gated_bepo'].iterations[b])} sweeps, "
            f"converged={bool(res['gated_bepo'].converged[b])}",
            file=out,
        )
        print(f"   {'traj':>4} {'t':>2} {'observation':<10} {'r':>5} {'V(s)':>7} {'gate':>4} "
              f"{'GRPO':>7} {'GiGPO':>7} {'BEPO':>7}", file=out)
        for k, traj in enumerate(DEMO_GROUPS[name]):
            for t, o in enumerate(traj.observations):
                print(
                    f"   {k:>4} {t:>2} {str(o):<10} {traj.rewards[t]:>5.1f} "
                    f"{float(res['gated_bepo'].value[b, k, t]):>7.3f} {'*' if gate[k, t] else '':>4} "
                    f"{g[b, k, t]:>7.3f} {gi[b, k, t]:>7.3f} {be[b, k, t]:>7.3f}",
                    file=out,
                )
            print(f"   {'':>4} -> {OUTCOME_NAMES[traj.outcome]}", file=out)
        print(file=out)
    return res
