"""Groups of trajectories sampled on a ``TabularModel``, as the rollouts' ``StepBatch``.

B groups of K trajectories start at ``model.start``; at each step a ~ pi(. | s), the
branch m ~ p(. | s, a), and the record is (obs_key[s], r(s, a, m), valid) exactly as
``bepo_jax.agent.rollouts.jitted`` writes it (the same observation hash, the same outcome rule:
``types.outcome_codes``). The sampler also returns what the rollouts do not know: the
hidden state index and the step's time, so every record can be matched with its exact
advantage A^pi[t, s, a].
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from ..credit.hashing import action_id_keys
from ..credit.types import StepBatch, outcome_codes
from .exact import check_probs
from .model import TabularModel, padded_index


class Sampled(NamedTuple):
    """``batch`` [B, K, T] plus the hidden ``state`` and ``action`` of every record
    (T = the model's horizon; records past the episode's end are masked)."""

    batch: StepBatch
    state: Int[Array, "B K T"]
    action: Int[Array, "B K T"]
    success: Bool[Array, "B K"]


@partial(jax.jit, static_argnames=("num_groups", "group_size", "horizon"))
def _sample(key, log_pi, next_state, log_prob, reward, success, ended, obs_key, start, *, num_groups, group_size,
            horizon):
    N = num_groups * group_size

    def step(carry, k):
        s, alive, won, term = carry
        ka, km = jax.random.split(k)
        a = jax.random.categorical(ka, log_pi[s])
        m = jax.random.categorical(km, log_prob[s, a])
        r, sc, en = reward[s, a, m], success[s, a, m], ended[s, a, m]
        rec = (obs_key[s], jnp.where(alive, r, 0.0), alive, s, a)
        won = won | (alive & sc)
        term = term | (alive & en)
        s = jnp.where(alive & ~en, next_state[s, a, m], s)
        return (s, alive & ~en, won, term), rec

    s0 = jnp.full((N,), start, jnp.int32)
    init = (s0, jnp.ones((N,), bool), jnp.zeros((N,), bool), jnp.zeros((N,), bool))
    (_, _, won, term), (key_obs, r, valid, s, a) = jax.lax.scan(step, init, jax.random.split(key, horizon))
    shape = lambda x: jnp.swapaxes(x, 0, 1).reshape((num_groups, group_size, horizon) + x.shape[2:])
    key_obs, r, valid, s, a = map(shape, (key_obs, r, valid, s, a))
    won, term = won.reshape(num_groups, group_size), term.reshape(num_groups, group_size)
    batch = StepBatch(obs_key=key_obs, reward=r.astype(jnp.float32), mask=valid, outcome=outcome_codes(won, term),
                      penalty=jnp.zeros_like(r, jnp.float32), action_key=action_id_keys(jnp.where(valid, a, -1)))
    return Sampled(batch, s, jnp.where(valid, a, -1), won)


class PaddedTables(NamedTuple):
    """A model's transition tables padded to a power-of-two state count (unreachable rows), as
    the sampler takes them: one compiled sampler serves every task of a similar size."""

    next_state: np.ndarray
    log_prob: np.ndarray
    prob: np.ndarray
    reward: np.ndarray
    success: np.ndarray
    ended: np.ndarray
    obs_key: np.ndarray
    start: np.int32

    def pad(self, x) -> np.ndarray:
        """Per-state rows of ``x`` (e.g. a policy) padded like the tables."""
        return np.asarray(x)[padded_index(0, len(x))]


def padded_tables(model: TabularModel) -> PaddedTables:
    take = padded_index(0, model.num_states)
    grow = lambda x: np.asarray(x)[take]
    with np.errstate(divide="ignore"):
        log_prob = np.log(np.asarray(model.prob, np.float64)).astype(np.float32)
    return PaddedTables(grow(model.next_state), grow(log_prob), grow(np.asarray(model.prob, np.float32)),
                        grow(np.asarray(model.reward, np.float32)), grow(model.success), grow(model.ended),
                        grow(model.obs_key), np.int32(model.start))


def sample_groups(model: TabularModel, probs, key, *, num_groups: int, group_size: int) -> Sampled:
    """``num_groups`` groups of ``group_size`` trajectories under ``probs`` (module docstring)."""
    if num_groups < 1 or group_size < 1:
        raise ValueError(f"sample_groups: num_groups={num_groups} and group_size={group_size} must be >= 1.")
    pi = check_probs(model, probs)
    with np.errstate(divide="ignore"):
        log_pi = np.log(pi).astype(np.float32)
    t = padded_tables(model)
    return _sample(key, t.pad(log_pi), t.next_state, t.log_prob, t.reward, t.success, t.ended, t.obs_key, t.start,
                   num_groups=num_groups, group_size=group_size, horizon=int(model.horizon))


def group_trajectories(sampled: Sampled, group: int, labels) -> list:
    """Group ``group`` of a sample as ``builders.Trajectory`` objects (for ``viz``), each
    observation named by ``labels[state]`` (e.g. a ``GraphWorld``'s ``views``)."""
    from ..credit.builders import Trajectory

    out = []
    mask = np.asarray(sampled.batch.mask[group])
    for k in range(mask.shape[0]):
        n = int(mask[k].sum())
        out.append(Trajectory(observations=[labels[int(s)] for s in np.asarray(sampled.state[group, k, :n])],
                              rewards=[float(r) for r in np.asarray(sampled.batch.reward[group, k, :n])],
                              outcome=int(sampled.batch.outcome[group, k])))
    return out
