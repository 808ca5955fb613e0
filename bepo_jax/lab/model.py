"""The finite-horizon model of one task: enumerated states, transitions, observation keys.

``enumerate_states(env, task, horizon)`` walks every state reachable from the task's
start under every action within ``horizon`` steps (breadth first, the environment's
own ``step`` vmapped over the frontier) and returns a ``TabularModel``:

    next_state[s, a, m]   successor index of branch m (deterministic envs: M = 1)
    prob[s, a, m]         branch probability (sums to 1 over m)
    reward[s, a, m]       the environment's reward for the step
    success[s, a, m]      the step solved the task
    ended[s, a, m]        the step ended the episode (success or the env's terminal flag)
    obs_key[s]            uint32 [2]: the observation key the rollouts hash for s
    inner                 the environment's inner states, stacked along axis 0 (index = s)

States are identified by the bits of their *canonical* inner state (``env.canonical``
when the environment has one: the state without its clock, so that "the same room at
step 3 and at step 5" is one state; identity otherwise). The clock lives in the model's
time index instead: ``evaluate`` gives V[t, s] with t steps spent. Two states with one
view share an ``obs_key`` (aliasing stays aliasing), exactly as in the rollouts.

Stochastic environments provide ``branches(inner, action) -> (inner [M, ...], reward [M],
success [M], terminal [M], prob [M])``; deterministic ones only ``step``.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Bool, Float, Int, UInt32

from ..agent.envs.base import JaxEnv, observation_keys

DEFAULT_MAX_STATES = 200_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class TabularModel:
    """One task as a finite model (module docstring). ``start`` is the start state's
    index; ``depth[s]`` the first step at which s is reached; ``action_words`` and
    ``name`` come from the environment."""

    next_state: Int[np.ndarray, "S A M"]
    prob: Float[np.ndarray, "S A M"]
    reward: Float[np.ndarray, "S A M"]
    success: Bool[np.ndarray, "S A M"]
    ended: Bool[np.ndarray, "S A M"]
    obs_key: UInt32[np.ndarray, "S 2"]
    depth: Int[np.ndarray, "S"]
    start: int
    horizon: int
    inner: Any = None
    action_words: tuple = ()
    name: str = "model"

    def __post_init__(self):
        S, A, M = np.shape(self.next_state)
        for field in ("prob", "reward", "success", "ended"):
            if np.shape(getattr(self, field)) != (S, A, M):
                raise ValueError(f"TabularModel.{field} has shape {np.shape(getattr(self, field))}; "
                                 f"next_state has {(S, A, M)} and every transition table must match it.")
        if np.shape(self.obs_key) != (S, 2):
            raise ValueError(f"TabularModel.obs_key has shape {np.shape(self.obs_key)}; want ({S}, 2).")
        if np.shape(self.depth) != (S,):
            raise ValueError(f"TabularModel.depth has shape {np.shape(self.depth)}; want ({S},).")
        nxt = np.asarray(self.next_state)
        if nxt.size and (nxt.min() < 0 or nxt.max() >= S):
            raise ValueError(f"TabularModel.next_state holds indices outside [0, {S}).")
        p = np.asarray(self.prob, np.float64)
        if np.any(p < 0) or not np.allclose(p.sum(-1), 1.0, atol=1e-9):
            raise ValueError("TabularModel.prob must be >= 0 and sum to 1 over the branch axis (last).")
        if np.any(np.asarray(self.success) & ~np.asarray(self.ended)):
            raise ValueError("TabularModel.success implies ended: a successful step ends the episode.")
        if not 0 <= self.start < S:
            raise ValueError(f"TabularModel.start={self.start} is not a state index in [0, {S}).")
        if int(self.horizon) < 1:
            raise ValueError(f"TabularModel.horizon={self.horizon} must be >= 1.")

    @property
    def num_states(self) -> int:
        return int(np.shape(self.next_state)[0])

    @property
    def num_actions(self) -> int:
        return int(np.shape(self.next_state)[1])

    @property
    def num_branches(self) -> int:
        return int(np.shape(self.next_state)[2])

    def replace(self, **changes) -> "TabularModel":
        return dataclasses.replace(self, **changes)


obs_keys = observation_keys  # the rollouts' own key of each stacked inner state


def _canonical(env, inner):
    return env.canonical(inner) if hasattr(env, "canonical") else inner


def _is_key(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype, jax.dtypes.prng_key)


def _leaf_bits(x) -> np.ndarray:
    return np.asarray(jax.random.key_data(x) if _is_key(x) else x)


_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _per_env(env, name: str, make):
    """One compiled function ``name`` per environment object (recompiled per call for
    environments that cannot be weakly referenced)."""
    try:
        cache = _COMPILED.setdefault(env, {})
    except TypeError:
        return make()
    if name not in cache:
        cache[name] = make()
    return cache[name]


def _expander(env):
    """jit(vmap over states x actions) of one step of the environment, canonicalised,
    as branches [N, A, M]."""
    return _per_env(env, "expand", lambda: _make_expander(env))


def _make_expander(env):
    A = len(env.action_words)

    def branches(inner, a):
        if hasattr(env, "branches"):
            nxt, r, succ, term, p = env.branches(inner, a)
        else:
            nxt, r, succ, term = env.step(inner, a)
            nxt = jax.tree_util.tree_map(lambda x: x[None], nxt)
            r, succ, term, p = (jnp.asarray(v)[None] for v in (r, succ, term, 1.0))
        nxt = jax.vmap(lambda x: _canonical(env, x))(nxt)
        return nxt, r.astype(jnp.float32), succ.astype(bool), (term | succ).astype(bool), p.astype(jnp.float32)

    per_state = lambda inner: jax.vmap(lambda a: branches(inner, a))(jnp.arange(A, dtype=jnp.int32))
    return jax.jit(jax.vmap(per_state))


def size_bucket(n: int) -> int:
    """The power of two >= n (at least 8): padded sizes keep the number of compiles small."""
    return max(8, 1 << (n - 1).bit_length())


def padded_index(lo: int, hi: int) -> np.ndarray:
    """Rows lo..hi-1 padded to ``size_bucket(hi - lo)`` rows by repeating the last one."""
    return np.minimum(np.arange(lo, lo + size_bucket(hi - lo)), hi - 1)


class _Codec:
    """Inner states on the host: every leaf a NumPy array (PRNG keys as their key data),
    and back onto the device with the keys re-wrapped."""

    def __init__(self, example):
        leaves, self.treedef = jax.tree_util.tree_flatten(example)
        self.impls = [jax.random.key_impl(x) if _is_key(x) else None for x in leaves]

    def host(self, tree) -> list[np.ndarray]:
        return [_leaf_bits(x) for x in jax.tree_util.tree_leaves(tree)]

    def device(self, leaves: list[np.ndarray]):
        return jax.tree_util.tree_unflatten(self.treedef, [
            jnp.asarray(x) if impl is None else jax.random.wrap_key_data(jnp.asarray(x), impl=impl)
            for x, impl in zip(leaves, self.impls)])


def _rows_bytes(leaves: list[np.ndarray]) -> list[bytes]:
    n = leaves[0].shape[0]
    rows = np.concatenate([np.ascontiguousarray(x.reshape(n, -1)).view(np.uint8).reshape(n, -1) for x in leaves], 1)
    return [r.tobytes() for r in rows]


def enumerate_states(env: JaxEnv, task, horizon: Optional[int] = None, *,
                     max_states: int = DEFAULT_MAX_STATES) -> TabularModel:
    """The finite-horizon model of ``task`` (module docstring). ``horizon`` defaults to
    the environment's ``max_steps`` and may not exceed it. Raises a ValueError naming
    ``max_states`` when more states are reachable than the budget allows."""
    horizon = int(env.max_steps if horizon is None else horizon)
    if not 1 <= horizon <= int(env.max_steps):
        raise ValueError(f"enumerate_states: horizon={horizon} must be in [1, env.max_steps={env.max_steps}] "
                         "(the rollouts end at max_steps).")
    if max_states < 1:
        raise ValueError(f"enumerate_states: max_states={max_states} must be >= 1.")
    start = _canonical(env, env.reset(jax.tree_util.tree_map(jnp.asarray, task)))
    codec = _Codec(start)
    states = [x[None] for x in codec.host(start)]  # host leaves, grown per depth
    ids = {_rows_bytes(states)[0]: 0}
    depth = [0]
    expand = _expander(env)
    A = len(env.action_words)
    rows = []
    lo, hi = 0, 1  # the states first reached at the current depth
    for d in range(horizon):
        if lo == hi:
            break
        n = hi - lo
        take = padded_index(lo, hi)  # a size bucket: few compiles
        nxt, r, succ, ended, p = expand(codec.device([x[take] for x in states]))
        r, succ, ended, p = (np.asarray(v)[:n] for v in (r, succ, ended, p))
        M = r.shape[-1]
        flat = [x[:n].reshape((n * A * M,) + x.shape[3:]) for x in codec.host(nxt)]
        idx = np.empty(n * A * M, np.int64)
        new = []
        for j, (k, end) in enumerate(zip(_rows_bytes(flat), ended.reshape(-1))):
            if end:
                idx[j] = lo + j // (A * M)  # unused: the episode ends with this step
                continue
            s = ids.get(k)
            if s is None:
                s = len(ids)
                if s >= max_states:
                    raise ValueError(
                        f"enumerate_states: more than max_states={max_states} states are reachable within "
                        f"horizon={horizon} (depth {d + 1}); pass a larger max_states or a shorter horizon.")
                ids[k] = s
                depth.append(d + 1)
                new.append(j)
            idx[j] = s
        if new:
            states = [np.concatenate([x, y[np.asarray(new)]]) for x, y in zip(states, flat)]
        rows.append((idx.reshape(n, A, M), p, r, succ, ended))
        lo, hi = hi, len(ids)
    S = len(ids)
    M = rows[0][1].shape[-1] if rows else 1
    next_state = np.repeat(np.arange(S)[:, None, None], A, 1).repeat(M, 2)
    prob = np.zeros((S, A, M)); prob[..., 0] = 1.0
    reward = np.zeros((S, A, M), np.float32)
    success = np.zeros((S, A, M), bool)
    ended = np.zeros((S, A, M), bool)
    at = 0
    for idx, p, r, sc, en in rows:
        n = idx.shape[0]
        next_state[at:at + n], prob[at:at + n], reward[at:at + n] = idx, p, r
        success[at:at + n], ended[at:at + n] = sc, en
        at += n
    prob = prob / prob.sum(-1, keepdims=True)
    inner = codec.device(states)
    keys = np.asarray(_obs_keys_jit(env)(codec.device([x[padded_index(0, S)] for x in states])))[:S]
    # States first reached at depth == horizon are never expanded: self-loops, no decision left.
    return TabularModel(next_state=next_state.astype(np.int32), prob=prob, reward=reward, success=success,
                        ended=ended, obs_key=keys, depth=np.asarray(depth, np.int32), start=0, horizon=horizon,
                        inner=inner, action_words=tuple(env.action_words), name=getattr(env, "name", "env"))


def _obs_keys_jit(env):
    return _per_env(env, "obs_keys", lambda: jax.jit(lambda inner: obs_keys(env, inner)))
