"""Mean-backup Bellman fixed point on one group's empirical graph (SPEC section 4, step 2).

    V(END) = 0,   V(s) = (1/|E(s)|) sum_{(r, s') in E(s)} [ r + gamma V(s') ]

i.e. V = Rbar + gamma P V with Rbar(s) the mean edge reward and P(s, s') the share of
the records leaving s that land in s'. Every state reaches an END along its own
trajectory, so the chain is absorbing and the fixed point is unique for gamma <= 1.

Jacobi iteration from the Monte-Carlo initialisation V^0 (mean of the discounted
returns of the records at s), V^{k+1} = Rbar + gamma P V^k, until

    max_s |V^{k+1}(s) - V^k(s)| <= tol * (1 + max_s |V^{k+1}(s)|)     or   k = max_iters.

``tol`` is floored at TOL_FLOOR = 8 float32 ulps (~9.5e-7): float32 sweeps and
residuals cannot resolve less (measured: a float32 Jacobi iterate can cycle a few
ulps apart, and an LU solve leaves residuals up to ~1.5e-7 relative), so a smaller
tol would only burn max_iters and report non-convergence.

The initial point is checked first, so an initialisation that already is a fixed
point costs 0 iterations and ``max_iters = 0`` reports whether V^0 is one.

Solvers (all agree to float32 tolerance):
  "dense"  — padded [N, N] transition matrix, one matmul per sweep (O(N^2) a sweep);
  "sparse" — the edge list: gather V(s'), segment_sum per sweep (O(N) a sweep);
  "solve"  — direct LU solve of (I - gamma P) V = Rbar plus one refinement step;
             ``iterations`` is 1 and ``converged`` is the same test on TV - V.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .graph import GroupGraph, gather_node

SOLVERS = ("dense", "sparse", "solve")
TOL_FLOOR = 8 * float(jnp.finfo(jnp.float32).eps)
_HI = jax.lax.Precision.HIGHEST  # TPUs default to bf16 passes for f32 matmuls


class FixedPoint(NamedTuple):
    value: Float[Array, "N"]
    iterations: Int[Array, ""]
    converged: Bool[Array, ""]


def _mean_reward(graph: GroupGraph, r: Float[Array, "K T"]) -> Float[Array, "N"]:
    n = graph.num_slots
    total = jax.ops.segment_sum(jnp.where(graph.valid, r, 0.0).reshape(n), graph.state.reshape(n), n)
    return total / jnp.maximum(graph.out_count, 1.0)


def transition_matrix(graph: GroupGraph) -> Float[Array, "N N"]:
    """P(s, s') = #records s -> s' / |E(s)| over state nodes (END columns dropped: V(END) = 0)."""
    n = graph.num_slots
    src = graph.state.reshape(n)
    dst = graph.succ.reshape(n)
    w = (graph.valid.reshape(n) & (dst < n)).astype(jnp.float32)
    counts = jnp.zeros((n, n), jnp.float32).at[jnp.clip(src, 0, n - 1), jnp.clip(dst, 0, n - 1)].add(w)
    return counts / jnp.maximum(graph.out_count, 1.0)[:, None]


def _sparse_sweep(graph: GroupGraph, r, gamma):
    n = graph.num_slots
    src = graph.state.reshape(n)
    dst = graph.succ.reshape(n)
    valid = graph.valid.reshape(n)
    r = r.reshape(n)
    inv_count = 1.0 / jnp.maximum(graph.out_count, 1.0)

    def sweep(v):
        target = jnp.where(valid, r + gamma * gather_node(v, dst), 0.0)
        return jax.ops.segment_sum(target, src, n) * inv_count

    return sweep


def _dense_sweep(graph: GroupGraph, r, gamma):
    p = transition_matrix(graph)
    rbar = _mean_reward(graph, r)
    return lambda v: rbar + gamma * jnp.matmul(p, v, precision=_HI)


def _small_step(v_new, v_old, tol):
    scale = 1.0 + jnp.max(jnp.abs(v_new))
    return jnp.max(jnp.abs(v_new - v_old)) <= tol * scale


def bellman_fixed_point(
    graph: GroupGraph,
    r: Float[Array, "K T"],
    v0: Float[Array, "N"],
    gamma,
    *,
    tol,
    max_iters: int,
    solver: str,
) -> FixedPoint:
    """Evaluate the empirical chain of ``graph`` with edge rewards ``r`` (see module doc)."""
    if solver not in SOLVERS:
        raise ValueError(f"solver={solver!r} is not valid; use one of {SOLVERS}.")
    tol = jnp.maximum(tol, TOL_FLOOR)
    if solver == "solve":
        return _direct_solve(graph, r, gamma, tol)
    sweep = (_dense_sweep if solver == "dense" else _sparse_sweep)(graph, r, gamma)
    done0 = _small_step(sweep(v0), v0, tol)

    def cond(carry):
        k, _, done = carry
        return (~done) & (k < max_iters)

    def body(carry):
        k, v, _ = carry
        v_new = sweep(v)
        return k + 1, v_new, _small_step(v_new, v, tol)

    k, v, done = jax.lax.while_loop(cond, body, (jnp.int32(0), v0, done0))
    return FixedPoint(v, k, done)


def _direct_solve(graph: GroupGraph, r, gamma, tol) -> FixedPoint:
    n = graph.num_slots
    p = transition_matrix(graph)
    rbar = _mean_reward(graph, r)
    a = jnp.eye(n, dtype=jnp.float32) - gamma * p
    lu = jax.scipy.linalg.lu_factor(a)
    v = jax.scipy.linalg.lu_solve(lu, rbar)
    v = v + jax.scipy.linalg.lu_solve(lu, rbar - jnp.matmul(a, v, precision=_HI))  # one refinement step
    tv = rbar + gamma * jnp.matmul(p, v, precision=_HI)
    ok = _small_step(tv, v, tol) & jnp.all(jnp.isfinite(v))
    return FixedPoint(v, jnp.int32(1), ok)
