"""A complete environment of your own: a key-and-door room behind the ``JaxEnv`` interface.

A 5x5 room; the agent (``a``, ``k`` once it holds the key) starts in a corner, the key
(``x``) lies somewhere in the room, the door (``d``) sits on the far wall. Walking onto
the key picks it up; walking into the door with the key opens it and ends the episode
with success (+1); without the key the door blocks like a wall. Every step costs 0.01.
Credit assignment is the point: the step that picks up the key decides the outcome, and
the trajectories of a group that wander without it observe the same cells.

Train on it (README, "Bring your own environment"):

    from bepo_jax.agent.train import RunConfig, train
    from examples.key_door import KeyDoorEnv
    train(RunConfig(estimator="gated_bepo"), "runs/key_door", env=KeyDoorEnv())

or from the command line by import path (the factory gets the run config):

    bepo-jax train --env examples.key_door:make_env --estimator gated_bepo
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from bepo_jax.agent.envs.base import NEWLINE, grid_to_tokens, symbol_table

SIZE = 5
FLOOR, AGENT, KEY, DOOR, AGENT_WITH_KEY = range(5)
SYMBOLS = (".", "a", "x", "d", "k")  # every character must be in bepo_jax.agent.envs.text.ALPHABET
MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)  # up, down, left, right


class Task(NamedTuple):
    """One room: where the agent starts and where the key lies (int32 [2] each)."""

    start: jnp.ndarray
    key: jnp.ndarray


class State(NamedTuple):
    pos: jnp.ndarray      # int32 [2]
    key: jnp.ndarray      # int32 [2], where the key lies (until picked up)
    has_key: jnp.ndarray  # bool []


DOOR_POS = np.array([SIZE // 2, SIZE - 1], np.int32)  # the middle of the right wall


class KeyDoorEnv:
    """The ``JaxEnv`` contract: the attributes below, and pure functions ``reset``,
    ``step``, ``render``, ``observation`` (jit- and vmap-able; no Python control flow on
    array values), with ``sample_tasks`` on the host."""

    name = "key_door_room"  # a label; "key_door" is the credit lab's built-in world
    action_words = ("up", "down", "left", "right")  # the policy spells one of these per step
    obs_len = SIZE * (SIZE + 1)                       # tokens of one rendered observation
    noop_reward = -0.01                               # reward of an unparsable response (a no-op step)

    def __init__(self, max_steps: int = 14):
        self.max_steps = max_steps  # the time limit (the wrapper ends the episode as TRUNCATED)
        self._symbols = symbol_table(SYMBOLS)

    def sample_tasks(self, n: int, seed: int) -> Task:
        """``n`` rooms (a pytree of host arrays with leading axis n), the same for the same seed."""
        rng = np.random.default_rng(seed)
        cells = [(r, c) for r in range(SIZE) for c in range(SIZE - 1)]  # the door column stays free
        start = np.zeros((n, 2), np.int32)
        key = np.zeros((n, 2), np.int32)
        for i in range(n):
            a, b = rng.choice(len(cells), 2, replace=False)
            start[i], key[i] = cells[a], cells[b]
        return Task(start, key)

    def reset(self, task: Task) -> State:
        return State(jnp.asarray(task.start, jnp.int32), jnp.asarray(task.key, jnp.int32), jnp.bool_(False))

    def step(self, inner: State, action):
        """(state, reward, success, terminal) after ``action`` in [0, 4)."""
        target = inner.pos + jnp.asarray(MOVES)[action]
        inside = jnp.all((target >= 0) & (target < SIZE))
        at_door = jnp.all(target == jnp.asarray(DOOR_POS))
        opens = at_door & inner.has_key
        moves = inside & (~at_door | opens)
        pos = jnp.where(moves, target, inner.pos)
        picks = ~inner.has_key & jnp.all(pos == inner.key)
        reward = jnp.where(opens, 1.0, -0.01).astype(jnp.float32)
        return State(pos, inner.key, inner.has_key | picks), reward, opens, opens

    def _grid(self, inner: State):
        grid = jnp.zeros((SIZE, SIZE), jnp.int32).at[tuple(DOOR_POS)].set(DOOR)
        grid = jnp.where(inner.has_key, grid, grid.at[inner.key[0], inner.key[1]].set(KEY))
        return grid.at[inner.pos[0], inner.pos[1]].set(jnp.where(inner.has_key, AGENT_WITH_KEY, AGENT))

    def render(self, inner: State):
        """int32 [obs_len]: the room as text rows (what the policy reads)."""
        return grid_to_tokens(self._grid(inner), jnp.asarray(self._symbols), NEWLINE)

    def observation(self, inner: State):
        """The raw observation hashed into the state key: equal rooms merge in the graph."""
        return self._grid(inner)


def make_env(cfg) -> KeyDoorEnv:
    """The factory for ``--env examples.key_door:make_env``: gets the run's env part (``EnvPart``)."""
    return KeyDoorEnv(max_steps=cfg.max_steps or 14)


def solve(task: Task) -> int:
    """Shortest number of steps to success (for the tests): to the key, then to the cell
    left of the door, then one step into it."""
    s, k = np.asarray(task.start), np.asarray(task.key)
    before = DOOR_POS - np.array([0, 1])
    return int(np.abs(s - k).sum() + np.abs(k - before).sum() + 1)

