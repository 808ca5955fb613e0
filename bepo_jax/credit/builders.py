"""Build a padded ``StepBatch`` from readable trajectories (for notebooks, demos, tests).

    batch = batch_from_trajectories([
        [Trajectory(["s0", "s1"], [0, 10], SUCCESS),      # group 0, trajectory 0
         Trajectory(["s0", "s2"], [0, 0], FAILURE)],
    ])

Observations are hashed with ``hash_observations``; groups and trajectories are
padded to the largest K and T (padding trajectories are empty, outcome FAILURE).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from .hashing import action_keys, hash_observation
from .types import FAILURE, NUM_OUTCOMES, SUCCESS, TRUNCATED, StepBatch


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One trajectory: the observation before each step, each step's reward, the outcome; optionally
    each step's penalty and action (texts or ids: ``StepBatch.action_key``, via ``action_keys``)."""

    observations: Sequence[Any]
    rewards: Sequence[float]
    outcome: int
    penalties: Optional[Sequence[float]] = None
    actions: Optional[Sequence[Any]] = None

    def __post_init__(self):
        if len(self.observations) != len(self.rewards):
            raise ValueError(
                f"Trajectory has {len(self.observations)} observations but {len(self.rewards)} rewards; "
                "give one observation (the one before the step) per step."
            )
        if self.penalties is not None and len(self.penalties) != len(self.rewards):
            raise ValueError("Trajectory.penalties must have one entry per step.")
        if self.actions is not None and len(self.actions) != len(self.rewards):
            raise ValueError("Trajectory.actions must have one entry per step (the action taken at that step).")
        if not 0 <= int(self.outcome) < NUM_OUTCOMES:
            raise ValueError(f"Trajectory.outcome={self.outcome!r}; use SUCCESS (0), FAILURE (1) or TRUNCATED (2).")


def batch_from_trajectories(groups: Sequence[Sequence[Trajectory]], *, num_steps: Optional[int] = None,
                            group_size: Optional[int] = None) -> StepBatch:
    """Pad ``groups`` into a StepBatch of shape [len(groups), K, T]. ``action_key`` is set when every
    non-empty trajectory gives its ``actions`` (None when none does; a mix is refused).

    >>> import bepo_jax as bj
    >>> b = batch_from_trajectories([[bj.Trajectory(["a", "b"], [0, 1], bj.SUCCESS), bj.Trajectory(["a"], [0], bj.FAILURE)]])
    >>> b.mask.tolist(), b.outcome.tolist()
    ([[[True, True], [True, False]]], [[0, 1]])
    """
    if not groups:
        raise ValueError("batch_from_trajectories needs at least one group.")
    K = max(len(g) for g in groups) if group_size is None else group_size
    T = max(max((len(t.rewards) for t in g), default=0) for g in groups) if num_steps is None else num_steps
    K, T = max(K, 1), max(T, 1)
    B = len(groups)
    obs_key = np.zeros((B, K, T, 2), np.uint32)
    reward = np.zeros((B, K, T), np.float32)
    penalty = np.zeros((B, K, T), np.float32)
    mask = np.zeros((B, K, T), bool)
    outcome = np.full((B, K), FAILURE, np.int32)
    given = {t.actions is not None for g in groups for t in g if len(t.rewards)}
    if len(given) > 1:
        raise ValueError("batch_from_trajectories: some trajectories give actions and some do not; give every "
                         "trajectory its actions (for StepBatch.action_key) or none.")
    action_key = np.zeros((B, K, T, 2), np.uint32) if given == {True} else None
    for b, group in enumerate(groups):
        if len(group) > K:
            raise ValueError(f"group {b} has {len(group)} trajectories, more than group_size={K}.")
        for k, traj in enumerate(group):
            L = len(traj.rewards)
            if L > T:
                raise ValueError(f"group {b} trajectory {k} has {L} steps, more than num_steps={T}.")
            for t, o in enumerate(traj.observations):
                obs_key[b, k, t] = hash_observation(o)
            reward[b, k, :L] = traj.rewards
            if traj.penalties is not None:
                penalty[b, k, :L] = traj.penalties
            if action_key is not None and L:
                action_key[b, k, :L] = action_keys(list(traj.actions))
            mask[b, k, :L] = True
            outcome[b, k] = traj.outcome
    return StepBatch(obs_key=obs_key, reward=reward, mask=mask, outcome=outcome, penalty=penalty,
                     action_key=action_key)


GRID_MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])


def grid_room_batch(groups: int, k: int = 8, t: int = 50, *, size: int = 5, seed: int = 0,
                    success_reward: float = 10.0) -> StepBatch:
    """A realistic batch for benchmarks and demos: per group, ``k`` random walks of at most ``t`` steps
    from the corner cell of a ``size`` x ``size`` room, success (``success_reward``) on reaching the
    opposite corner, a bump into a wall a self-loop (the observation does not change), truncation at
    ``t`` steps. The observation key is the cell; vectorised NumPy, deterministic in ``seed``.

    >>> b = grid_room_batch(2, 4, 10, seed=0)
    >>> b.mask.shape, b.obs_key.shape
    ((2, 4, 10), (2, 4, 10, 2))
    """
    rng = np.random.default_rng(seed)
    n = groups * k
    pos = np.zeros((n, 2), np.int64)  # every walk starts in the corner (0, 0)
    goal = np.array([size - 1, size - 1])
    cell = np.zeros((n, t), np.int64)
    reward = np.zeros((n, t), np.float32)
    mask = np.zeros((n, t), bool)
    alive = np.ones(n, bool)
    outcome = np.full(n, TRUNCATED, np.int32)
    for step in range(t):
        cell[:, step] = pos[:, 0] * size + pos[:, 1]
        mask[:, step] = alive
        nxt = pos + GRID_MOVES[rng.integers(0, 4, n)]
        inside = ((nxt >= 0) & (nxt < size)).all(axis=1)
        pos = np.where(inside[:, None] & alive[:, None], nxt, pos)  # a bump into a wall stays put
        won = alive & (pos == goal).all(axis=1)
        reward[won, step] = success_reward
        outcome[won] = SUCCESS
        alive &= ~won
    # 64-bit keys of the cell (a room id in the high word would merge nothing across groups anyway).
    keys = np.stack([(cell * 2654435761 + 12345) % (1 << 32), cell], axis=-1).astype(np.uint32)
    shape = (groups, k, t)
    return StepBatch(obs_key=keys.reshape(shape + (2,)), reward=reward.reshape(shape), mask=mask.reshape(shape),
                     outcome=outcome.reshape(groups, k), penalty=None)
