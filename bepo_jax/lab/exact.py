"""Exact evaluation of an action-level policy on a ``TabularModel`` (float64, NumPy).

Backward induction over the time limit H, with t = steps already spent:

    V[H, s]    = 0
    Q[t, s, a] = sum_m p(m | s, a) (r(s, a, m) + gamma (1 - ended(s, a, m)) V[t + 1, s'(s, a, m)])
    V[t, s]    = sum_a pi(a | s) Q[t, s, a],        A[t, s, a] = Q[t, s, a] - V[t, s]

Occupancies d[t, s] = P(s_t = s and the episode still running) from d[0] = onehot(start).
The objective J(pi) = V[0, start]; for the tabular softmax policy pi = softmax(theta)
the exact policy gradient is (the finite-horizon policy-gradient theorem)

    dJ / d theta[s, b] = sum_t gamma^t d[t, s] pi(b | s) A[t, s, b].
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from jaxtyping import Float

from .model import TabularModel


class Evaluation(NamedTuple):
    """V [H + 1, S], Q and A [H, S, A], occupancy [H + 1, S], gradient [S, A]
    (dJ/dtheta of the tabular softmax policy with these probabilities), value = J."""

    V: Float[np.ndarray, "H1 S"]
    Q: Float[np.ndarray, "H S A"]
    A: Float[np.ndarray, "H S A"]
    occupancy: Float[np.ndarray, "H1 S"]
    gradient: Float[np.ndarray, "S A"]
    value: float
    success: float


def check_probs(model: TabularModel, probs) -> np.ndarray:
    p = np.asarray(probs, np.float64)
    if p.shape != (model.num_states, model.num_actions):
        raise ValueError(f"probs has shape {p.shape}; want [num_states, num_actions] = "
                         f"{(model.num_states, model.num_actions)} (row s = pi(. | state s)).")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or not np.allclose(p.sum(1), 1.0, atol=1e-6):
        raise ValueError("probs must be finite, >= 0, and each row must sum to 1 (a distribution over actions).")
    return p / p.sum(1, keepdims=True)


def _check_gamma(gamma: float) -> float:
    if not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma={gamma} must be in [0, 1].")
    return float(gamma)


def _tables(model: TabularModel, gamma: float):
    """(next_state, prob, reward, gamma (1 - ended)) as float64 arrays for the backups."""
    return (model.next_state, np.asarray(model.prob, np.float64), np.asarray(model.reward, np.float64),
            gamma * (~np.asarray(model.ended)).astype(np.float64))


def _backup(tables, v_next):
    """Q[s, a] = sum_m p (r + gamma (1 - ended) v_next[s'])."""
    nxt, p, r, cont = tables
    return (p * (r + cont * v_next[nxt])).sum(-1)


def evaluate(model: TabularModel, probs, gamma: float = 1.0) -> Evaluation:
    """Exact V, Q, A, occupancies and softmax policy gradient of the time-independent
    policy ``probs`` [num_states, num_actions] (module docstring). ``gamma`` is the
    objective's discount (1: success within the time limit, with a 0/1 success reward).

    The key-door world under the uniform policy: the key (left at the start, 1/2), two steps to the
    bridge whatever is chosen, then right on the bridge (1/2) wins and left falls: success 1/4; going
    right at the start never wins, so its advantage at the start is -1/4:

    >>> import numpy as np
    >>> from bepo_jax.agent.envs.diagnostic import key_door
    >>> from bepo_jax.lab.model import enumerate_states
    >>> m = enumerate_states(key_door(), 0)
    >>> ev = evaluate(m, np.full((m.num_states, m.num_actions), 0.5))
    >>> ev.success, ev.A[0, m.start].tolist()
    (0.25, [0.25, -0.25])
    """
    pi = check_probs(model, probs)
    gamma = _check_gamma(gamma)
    H, S, A = model.horizon, model.num_states, model.num_actions
    tables = _tables(model, gamma)
    # success probability: the same backup with reward = success, no discount
    succ_tables = _tables(model.replace(reward=np.asarray(model.success, np.float64)), 1.0)
    V = np.zeros((H + 1, S))
    Q = np.zeros((H, S, A))
    P_succ = np.zeros((H + 1, S))
    for t in range(H - 1, -1, -1):
        Q[t] = _backup(tables, V[t + 1])
        V[t] = (pi * Q[t]).sum(-1)
        P_succ[t] = (pi * _backup(succ_tables, P_succ[t + 1])).sum(-1)
    A_ = Q - V[:H, :, None]
    occ = _occupancy(model, pi)
    disc = gamma ** np.arange(H)
    grad = np.einsum("t,ts,sa,tsa->sa", disc, occ[:H], pi, A_)
    return Evaluation(V, Q, A_, occ, grad, float(V[0, model.start]), float(P_succ[0, model.start]))


def occupancy(model: TabularModel, probs) -> Float[np.ndarray, "H1 S"]:
    """d[t, s]: probability that the episode is running and in s after t steps."""
    return _occupancy(model, check_probs(model, probs))


def _occupancy(model: TabularModel, pi: np.ndarray) -> Float[np.ndarray, "H1 S"]:
    H, S = model.horizon, model.num_states
    flow = pi[:, :, None] * np.asarray(model.prob, np.float64) * (~np.asarray(model.ended))
    d = np.zeros((H + 1, S))
    d[0, model.start] = 1.0
    for t in range(H):
        np.add.at(d[t + 1], model.next_state.reshape(-1), (d[t][:, None, None] * flow).reshape(-1))
    return d


def optimal_q(model: TabularModel, gamma: float = 1.0) -> Float[np.ndarray, "H S A"]:
    """Q*[t, s, a] by backward induction (the best any policy can do from (t, s) taking a)."""
    gamma = _check_gamma(gamma)
    H, S, A = model.horizon, model.num_states, model.num_actions
    tables = _tables(model, gamma)
    V = np.zeros((H + 1, S))
    Q = np.zeros((H, S, A))
    for t in range(H - 1, -1, -1):
        Q[t] = _backup(tables, V[t + 1])
        V[t] = Q[t].max(-1)
    return Q


def softmax_policy(logits) -> Float[np.ndarray, "S A"]:
    z = np.asarray(logits, np.float64)
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def uniform_policy(model: TabularModel) -> Float[np.ndarray, "S A"]:
    return np.full((model.num_states, model.num_actions), 1.0 / model.num_actions)


def boltzmann_policy(model: TabularModel, temperature: float, gamma: float = 1.0) -> Float[np.ndarray, "S A"]:
    """pi(a | s) proportional to exp(Q*_0(s, a) / (temperature * scale)), Q*_0 = the
    optimal Q with the whole time limit left and ``scale`` the largest |reward| (so the
    temperature is in units of the task's reward). temperature -> inf is uniform."""
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0 (use uniform_policy for infinity).")
    scale = max(float(np.abs(model.reward).max()), 1e-12)
    return softmax_policy(optimal_q(model, gamma)[0] / (temperature * scale))
