"""A realistic batch for benchmarks: K random walks per group from one start cell of a
small grid room, success (+10) at the goal cell, wall bumps as self-loops (the
observation does not change), truncation at T steps. Vectorised NumPy; no JAX."""

from __future__ import annotations

import numpy as np

from bepo_jax import FAILURE, SUCCESS, TRUNCATED, StepBatch

MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])


def grid_room_batch(groups: int, k: int = 8, t: int = 50, *, size: int = 5, seed: int = 0,
                    success_reward: float = 10.0) -> StepBatch:
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
        nxt = pos + MOVES[rng.integers(0, 4, n)]
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


__all__ = ["grid_room_batch", "SUCCESS", "FAILURE", "TRUNCATED"]
