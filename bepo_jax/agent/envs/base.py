"""One small interface for the environments the rollouts drive.

*JAX environments* (``JaxEnv``) are pure functions — vmappable and jittable — so a
whole rollout, the advantages and the update compile into one program:

    tasks = env.sample_tasks(n, seed)            # host arrays, leading axis n (one task per group)
    inner = env.reset(task)                      # identical for the K trajectories of a group
    inner, reward, success, terminal = env.step(inner, action)   # action in [0, len(action_words))
    tokens = env.render(inner)                   # int32 [obs_len]: the observation as text tokens
    raw = env.observation(inner)                 # the raw observation (any numeric dtype, any shape),
                                                 # hashed bit-exactly into the obs key (floats are not rounded)

The wrapper state ``EnvState`` adds what every environment needs the same way: the
time step, the episode's end (``terminal`` or the time limit ``max_steps``), success,
and the invalid-action rule: an unparsable response (action -1) is a no-op that spends
a time step and earns ``noop_reward``.

*Host environments* (``HostEnv``, e.g. TextWorld) are Python objects stepped one by one;
``bepo_jax.agent.rollouts.host`` batches their policy calls.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, Sequence, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from .text import EOS, PAD, decode, encode


class EnvState(NamedTuple):
    """The wrapper state: ``done`` = the episode is over for any reason (success, the
    environment's own ``terminal`` flag, or the time limit); ``terminal`` = the
    environment itself ended it (success included), so a time-limit end is
    ``done & ~terminal`` (TRUNCATED) and a failure on the last allowed step is still a
    FAILURE."""

    inner: Any
    t: Int[Array, ""]
    done: Bool[Array, ""]
    success: Bool[Array, ""]
    terminal: Bool[Array, ""]


@runtime_checkable
class JaxEnv(Protocol):
    name: str
    action_words: tuple[str, ...]
    max_steps: int
    obs_len: int
    noop_reward: float

    def sample_tasks(self, n: int, seed: int) -> Any: ...
    def reset(self, task: Any) -> Any: ...
    def step(self, inner: Any, action: Int[Array, ""]) -> tuple[Any, Any, Any, Any]: ...
    def render(self, inner: Any) -> Int[Array, "S"]: ...
    def observation(self, inner: Any) -> Array: ...


class HostEnv(Protocol):
    """A Python environment: one episode at a time.

    ``reset(task) -> (observation text, admissible commands)``;
    ``step(command) -> (observation text, reward, done, won, admissible commands)``;
    ``objective`` is the task text the prompt starts with."""

    objective: str

    def reset(self, task: Any) -> tuple[str, list[str]]: ...
    def step(self, command: str) -> tuple[str, float, bool, bool, list[str]]: ...


def observation_keys(env: JaxEnv, inner) -> Array:
    """uint32 [N, 2]: the obs key of each of N stacked inner states — the raw bits of
    ``env.observation`` (any dtype, any shape) hashed by ``hash_tokens``. The one rule the
    rollouts and ``bepo_jax.lab`` share."""
    from ...credit.hashing import hash_tokens

    raw = jax.vmap(env.observation)(inner)
    raw = raw.reshape(raw.shape[0], -1)
    return hash_tokens(raw, jnp.ones(raw.shape, bool))


def env_reset(env: JaxEnv, task) -> EnvState:
    return EnvState(env.reset(task), jnp.int32(0), jnp.bool_(False), jnp.bool_(False), jnp.bool_(False))


def env_step(env: JaxEnv, state: EnvState, action: Int[Array, ""]):
    """One step of the wrapper: returns (state, reward, valid) where ``valid`` says the
    step belongs to the episode (it had not ended before it). Action -1 is the invalid
    action: no-op + ``noop_reward``; after the end the state is frozen and rewards 0."""
    invalid = action < 0
    inner, reward, success, terminal = env.step(state.inner, jnp.clip(action, 0, len(env.action_words) - 1))
    keep = invalid | state.done
    inner = jax.tree_util.tree_map(lambda old, new: jnp.where(keep, old, new), state.inner, inner)
    valid = ~state.done
    reward = jnp.where(state.done, 0.0, jnp.where(invalid, env.noop_reward, reward)).astype(jnp.float32)
    success = state.success | (~keep & success)
    ended = state.terminal | (~keep & terminal) | success
    t = state.t + valid.astype(jnp.int32)
    done = state.done | ended | (t >= env.max_steps)
    return EnvState(inner, t, done, success, ended), reward, valid


# ------------------------------------------------------------------------------ grids as text

def grid_to_tokens(grid: Int[Array, "H W"], symbol_tokens: Int[Array, "C"], newline: int) -> Int[Array, "S"]:
    """Rows of cell symbols, each followed by a newline: S = H (W + 1) tokens."""
    cells = symbol_tokens[grid.astype(jnp.int32)]
    nl = jnp.full((grid.shape[0], 1), newline, jnp.int32)
    return jnp.concatenate([cells, nl], axis=1).reshape(-1)


def symbol_table(symbols: Sequence[str]) -> np.ndarray:
    return np.array([encode(s)[0] for s in symbols], np.int32)


NEWLINE = int(encode("\n")[0])


def render_tokens_text(tokens) -> str:
    """Host-side: the text of rendered observation tokens."""
    return decode(np.asarray(tokens))


# ------------------------------------------------------------------------------ action words

def word_table(words: Sequence[str], width: int) -> np.ndarray:
    """int32 [A, width + 1]: each word's tokens then EOS (and EOS beyond). Words longer
    than ``width`` raise."""
    table = np.full((len(words), width + 1), EOS, np.int32)
    for i, w in enumerate(words):
        ids = encode(w)
        if len(ids) > width:
            raise ValueError(f"action word {w!r} has {len(ids)} tokens; the word table holds {width}.")
        table[i, : len(ids)] = ids
    return table


def history_words(table: Int[Array, "... W1"]) -> Int[Array, "... W"]:
    """Word-table rows as the prompt's action slot: the word's tokens, PAD after it."""
    return np.where(table[..., :-1] == EOS, PAD, table[..., :-1])


def word_lengths(table: Int[Array, "... A W1"]) -> Int[Array, "... A"]:
    return jnp.argmax(table == EOS, axis=-1).astype(jnp.int32)


def parse_response(response: Int[Array, "R"], table: Int[Array, "A W1"], valid: Bool[Array, "A"]) -> Int[Array, ""]:
    """The index of the (valid) word the response spells followed by EOS, or -1."""
    R = response.shape[0]
    W1 = table.shape[1]
    if R < W1:
        response = jnp.concatenate([response, jnp.full((W1 - R,), PAD, response.dtype)])
    lens = word_lengths(table)
    pos = jnp.arange(W1)
    same = jnp.all(jnp.where(pos[None, :] <= lens[:, None], response[None, :W1] == table, True), axis=1)
    ok = same & valid
    return jnp.where(jnp.any(ok), jnp.argmax(ok), -1).astype(jnp.int32)
