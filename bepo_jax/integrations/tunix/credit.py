"""A Tunix call's groups and their credit: ``split_groups`` (by Tunix's group id), ``GroupCredit`` (one
group's step credit as the learner computed it: ``learner.credit_log``) and the per-group metrics."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ...credit.types import FAILURE, SUCCESS, TRUNCATED


def split_groups(trajectories: Sequence[Any], num_generations: int) -> list[list[int]]:
    """Indices of each group's trajectories, in order of first appearance: by Tunix's group
    id (``item.group_id``, else the trajectory's "group_id"), else consecutive chunks of
    ``num_generations``. Refused when some trajectories have an id and others not, or when
    there are no ids and the count is not a multiple of ``num_generations``."""
    ids = []
    for item in trajectories:
        gid = getattr(item, "group_id", None)
        if gid is None and isinstance(getattr(item, "traj", None), dict):
            gid = item.traj.get("group_id")
        ids.append(gid)
    n = len(ids)
    if all(g is None for g in ids):
        if n % int(num_generations):
            raise ValueError(f"StepCreditGRPOLearner: {n} trajectories without group ids is not a multiple of "
                             f"num_generations={num_generations}; the groups cannot be told apart.")
        return [list(range(i, i + num_generations)) for i in range(0, n, num_generations)]
    if any(g is None for g in ids):
        raise ValueError("StepCreditGRPOLearner: some trajectories carry a group id and others none; the groups "
                         "cannot be told apart (give every TrajectoryItem its group_id).")
    groups: dict = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


@dataclasses.dataclass(frozen=True)
class GroupCredit:
    """One group's step credit, as the learner computed it (``learner.credit_log``).

    group_id: Tunix's group id (None without one).   states[k][t]: the state of turn t.
    rewards[k][t]: the rewards the estimator saw (environment's, plus the reward_fns
    share).   outcomes[k]: codes.   endings[k]: ``Ending.kind``.   advantages[k][t]: A[k, t].
    diagnostics: the estimator's (``states``, ``gated_share``, ...); empty when the group
    had fewer than two trajectories with turns.   collapsed: a multi-turn group whose turns
    all map to one state.   mode: "train" or "eval" (Tunix's mode of the batch: evaluation
    groups are logged too, marked, so diagnostics of training can leave them out)."""

    group_id: Any
    states: list
    rewards: list
    outcomes: list
    endings: list
    advantages: list
    diagnostics: dict
    collapsed: bool
    mode: str = "train"

    def table(self) -> str:
        """Per trajectory: outcome, then each turn's state (its last 32 characters), reward
        and advantage -- what a user reads to see that the credit is sane."""
        names = {SUCCESS: "SUCCESS", FAILURE: "FAILURE", TRUNCATED: "TRUNCATED"}
        d = self.diagnostics
        head = (f"group {self.group_id}: {d.get('states', float('nan')):.0f} states, gated share "
                f"{d.get('gated_share', float('nan')):.2f}" + (", ALL TURNS ONE STATE" if self.collapsed else ""))
        lines = [head]
        for k, (st, rw, a) in enumerate(zip(self.states, self.rewards, self.advantages)):
            cells = "  ".join(f"[{s[-32:]!r} r={r:+.2f} A={v:+.3f}]"
                              for s, r, v in zip(st, rw, a))
            lines.append(f"  k={k} {names.get(self.outcomes[k], self.outcomes[k])} ({self.endings[k]}): {cells}")
        return "\n".join(lines)


def _group_metrics(credit: GroupCredit, adv: np.ndarray, mask: np.ndarray) -> dict:
    on = mask != 0
    vals = adv[on] if on.any() else np.zeros(1, np.float32)
    n_turns = sum(len(s) for s in credit.states)
    T = max((len(a) for a in credit.advantages), default=0)
    spread = [np.std([a[t] for a in credit.advantages if len(a) > t]) for t in range(T)]
    codes = np.asarray(credit.outcomes)
    d = credit.diagnostics
    metrics = {f"bepo/{k}": (v, np.mean) for k, v in d.items() if k != "from_reward"}
    metrics.update({
        "bepo/states_per_turn": (d["states"] / max(n_turns, 1) if "states" in d else 0.0, np.mean),
        "bepo/collapsed": (float(credit.collapsed), np.mean),
        "bepo/advantage/abs_mean": (float(np.abs(vals).mean()), np.mean),
        "bepo/advantage/max": (float(vals.max()), np.max),
        "bepo/advantage/min": (float(vals.min()), np.min),
        "bepo/advantage/turn_spread": (float(np.mean(spread)) if spread else 0.0, np.mean),
        "bepo/outcome/success": (float(np.mean(codes == SUCCESS)), np.mean),
        "bepo/outcome/failure": (float(np.mean(codes == FAILURE)), np.mean),
        "bepo/outcome/truncated": (float(np.mean(codes == TRUNCATED)), np.mean),
        "bepo/outcome/from_reward": (d["from_reward"], np.mean),
    })
    return metrics
