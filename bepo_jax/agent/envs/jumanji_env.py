"""Jumanji environments behind the ``JaxEnv`` interface, unchanged.

A Jumanji environment is already pure JAX (``reset(key)``, ``step(state, action)``);
the adapter adds what a token policy needs: the observation as text (``to_grid`` maps
a Jumanji observation to a grid of cell codes, ``symbols`` gives each code's character)
and the action words. A task is the PRNG key the environment resets with, so the K
trajectories of a group start identically. ``success`` is decided by ``success_fn(timestep)``
(default: the episode terminated — discount 0 — with a positive reward).

``maze(rows, cols)`` is the preset for Jumanji's ``Maze`` (works offline: no download).
Requires the ``envs`` extra (``pip install bepo-jax[envs]``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .base import NEWLINE, grid_to_tokens, symbol_table


def _default_success(timestep) -> Any:
    return (timestep.discount == 0) & (timestep.reward > 0)


class JumanjiEnv:
    """``JumanjiEnv(env, to_grid=..., symbols=..., action_words=..., max_steps=...)``."""

    def __init__(self, env: Any, *, to_grid: Callable[[Any], jax.Array], grid_shape: tuple[int, int],
                 symbols: Sequence[str], action_words: Sequence[str], max_steps: int, name: str = "jumanji",
                 success_fn: Callable[[Any], Any] = _default_success, noop_reward: float = 0.0):
        num_actions = int(env.action_spec.num_values)
        if len(action_words) != num_actions:
            raise ValueError(f"action_words has {len(action_words)} words; the environment has {num_actions} actions.")
        if max_steps < 1:
            raise ValueError(f"max_steps={max_steps} must be >= 1.")
        self.env = env
        self.name = name
        self.to_grid = to_grid
        self.action_words = tuple(action_words)
        self.max_steps = int(max_steps)
        self.obs_len = grid_shape[0] * (grid_shape[1] + 1)
        self.noop_reward = float(noop_reward)
        self.success_fn = success_fn
        self._symbols = symbol_table(symbols)

    def sample_tasks(self, n: int, seed: int):
        return np.asarray(jax.random.key_data(jax.random.split(jax.random.key(seed), n)))

    def reset(self, task):
        state, timestep = self.env.reset(jax.random.wrap_key_data(task))
        return state, timestep.observation

    def step(self, inner, action):
        state, timestep = self.env.step(inner[0], action)
        return (state, timestep.observation), timestep.reward, self.success_fn(timestep), timestep.last()

    def canonical(self, inner):
        """The state without its clock (``step_count`` zeroed in the state and the
        observation), for ``bepo_jax.lab.enumerate_states``. Environments whose
        dynamics read the clock beyond the time limit are not covered."""
        state, obs = inner
        zero = lambda x: jax.tree_util.tree_map(jnp.zeros_like, x)
        if hasattr(state, "step_count"):
            state = state.replace(step_count=zero(state.step_count)) if hasattr(state, "replace") else state
        if hasattr(obs, "step_count"):
            obs = obs._replace(step_count=zero(obs.step_count)) if hasattr(obs, "_replace") else obs
        return state, obs

    def render(self, inner):
        return grid_to_tokens(self.to_grid(inner[1]), jnp.asarray(self._symbols), NEWLINE)

    def observation(self, inner):
        return self.to_grid(inner[1])


def _maze_grid(obs) -> jax.Array:
    """Codes: 0 wall, 1 floor, 2 target, 3 agent, 4 agent on target."""
    walls = obs.walls
    H, W = walls.shape
    rows, cols = jnp.arange(H)[:, None], jnp.arange(W)[None, :]
    target = (rows == obs.target_position.row) & (cols == obs.target_position.col)
    agent = (rows == obs.agent_position.row) & (cols == obs.agent_position.col)
    g = jnp.where(walls, 0, jnp.where(target, 2, 1))
    return jnp.where(agent, jnp.where(target, 4, 3), g).astype(jnp.int8)


def maze(rows: int = 5, cols: int = 5, *, max_steps: int = 12) -> JumanjiEnv:
    """Jumanji ``Maze`` with a ``rows`` x ``cols`` random generator; observation as text
    (# wall, _ floor, O target, P agent, S agent on target); actions up/right/down/left."""
    try:
        from jumanji.environments.routing.maze import Maze
        from jumanji.environments.routing.maze.generator import RandomGenerator
    except ImportError as err:  # pragma: no cover - depends on the install
        raise ImportError("the Jumanji adapter needs jumanji: pip install 'bepo-jax[envs]'") from err
    # The wrapper enforces max_steps (a time-limit end is TRUNCATED); Jumanji's own time
    # limit would report it as a termination (FAILURE), so it is set out of reach.
    env = Maze(generator=RandomGenerator(num_rows=rows, num_cols=cols), time_limit=2**30)
    return JumanjiEnv(env, to_grid=_maze_grid, grid_shape=(rows, cols), symbols=("#", "_", "O", "P", "S"),
                      action_words=("up", "right", "down", "left"), max_steps=max_steps, name="maze")
