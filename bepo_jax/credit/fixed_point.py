"""Mean-backup Bellman fixed point on one group's empirical graph (docs/estimators.md, Gated-BEPO step 2).

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
tol would only burn max_iters and report non-convergence. The configs warn when
they are given a tol below it.

The initial point is checked first, so an initialisation that already is a fixed
point costs 0 iterations, and ``max_iters = 0`` returns V^0 on EVERY solver (the
Monte-Carlo values; ``converged`` says whether V^0 already is a fixed point).

Solvers:
  "dense"  — padded [S, S] transition matrix, one matmul per sweep (O(S^2) a sweep);
  "sparse" — the edge list: gather V(s'), segment_sum per sweep (O(N) a sweep);
  "auto"   — "dense" while the bucket S <= AUTO_DENSE_MAX, else "sparse" (both Jacobi:
             identical semantics for every max_iters);
  "solve"  — direct LU solve of (I - gamma P) V = Rbar plus one refinement step (O(S^3)
             once). It has no intermediate iterates: max_iters = 0 returns V^0, any
             max_iters >= 1 returns the fixed point with ``iterations`` 1 and
             ``converged`` the same tolerance test on T V - V.
dense, sparse and auto agree to float32 tolerance for every config; solve agrees with
them whenever they report ``converged`` (and always at max_iters = 0). With
0 < max_iters below the sweeps Jacobi needs, the iterative solvers stop early and say
so (``converged`` false); solve does not stop early.

State buckets S (the static size of the dense and direct solvers' [S, S] matrices):
  * ``max_states = 0`` (automatic, the default) — S is a pure function of the batch:
    the smallest of AUTO_BUCKETS (32, 64) that holds the largest group's states,
    chosen on the device by ``lax.switch`` (each bucket compiles once, inside or
    outside a user's jit alike); batches whose largest group has more than
    AUTO_BUCKETS[-1] states run the bucket-free sparse solver. ``state_bucket(n)``
    is the same rule on the host. (XLA:CPU reserves the temporary memory of every
    branch: with 128/256-state branches the peak was ~1.6 kB per record at 8 x 50,
    10x the 32/64 buckets'; we did not measure dense at 128/256 against sparse, but
    dense over all 400 slots of an 8 x 50 group measured 4-17x slower than sparse.)
  * ``max_states = S > 0`` — that bucket. If a group has more states than S
    (``overflow``), the whole batch is evaluated by the sparse solver instead
    (``lax.cond``, no cost when nothing overflows) and a debug warning is printed —
    never a truncated graph.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .graph import GroupGraph, gather_node

SOLVERS = ("dense", "sparse", "solve", "auto")
AUTO_DENSE_MAX = 256
AUTO_BUCKETS = (32, 64)  # larger dense buckets cost more memory than the sparse solver saves time
TOL_FLOOR = 8 * float(jnp.finfo(jnp.float32).eps)
_HI = jax.lax.Precision.HIGHEST  # TPUs default to bf16 passes for f32 matmuls


class FixedPoint(NamedTuple):
    value: Float[Array, "N"]
    iterations: Int[Array, ""]
    converged: Bool[Array, ""]


def resolve_solver(solver: str, bucket: int) -> str:
    """The concrete solver for ``solver`` at state bucket ``bucket`` (static)."""
    if solver != "auto":
        return solver
    return "dense" if bucket <= AUTO_DENSE_MAX else "sparse"


def state_bucket(num_states: int, num_slots: int) -> int:
    """The automatic bucket for a batch whose largest group has ``num_states`` states and
    ``num_slots`` = K * T record slots: the smallest AUTO_BUCKETS entry >= num_states
    (capped at num_slots), or 0 = bucket-free sparse solver above AUTO_BUCKETS[-1]."""
    for b in _auto_buckets(num_slots):
        if num_states <= b:
            return b
    return 0


def _auto_buckets(n: int) -> tuple[int, ...]:
    """The buckets the automatic rule chooses from for N = n record slots (each < n, then n if small)."""
    smaller = tuple(b for b in AUTO_BUCKETS if b < n)
    return smaller + ((n,) if n <= AUTO_BUCKETS[-1] else ())


def _mean_reward(graph: GroupGraph, r: Float[Array, "K T"], size: int) -> Float[Array, "S"]:
    n = graph.num_slots
    total = jax.ops.segment_sum(jnp.where(graph.valid, r, 0.0).reshape(n), graph.state.reshape(n), size)
    return total / jnp.maximum(graph.out_count[:size], 1.0)


def transition_matrix(graph: GroupGraph, size: int | None = None) -> Float[Array, "S S"]:
    """P(s, s') = #records s -> s' / |E(s)| over the first ``size`` state slots (END columns
    dropped: V(END) = 0). Edges of states beyond ``size`` are dropped: callers check overflow."""
    n = graph.num_slots
    size = n if size is None else size
    src = graph.state.reshape(n)
    dst = graph.succ.reshape(n)
    w = (graph.valid.reshape(n) & (dst < size) & (src < size)).astype(jnp.float32)
    counts = jnp.zeros((size, size), jnp.float32).at[jnp.clip(src, 0, size - 1), jnp.clip(dst, 0, size - 1)].add(w)
    return counts / jnp.maximum(graph.out_count[:size], 1.0)[:, None]


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


def _dense_sweep(p: Float[Array, "S S"], rbar: Float[Array, "S"], gamma):
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
    max_iters,
    solver: str,
    max_states: int = 0,
) -> FixedPoint:
    """Evaluate the empirical chain of ``graph`` with edge rewards ``r`` (see module doc)
    on one bucket: ``max_states`` is the static S of the dense and direct solvers (0: N).

    The caller handles overflow (``graph.num_states > S``) and automatic buckets; see
    ``bellman_fixed_point_batched``.

    The worked example of docs/estimators.md (gamma 1): s0 -> s1 -> SUCCESS paying 10,
    s0 -> s2 -> FAILURE, s0 -> s1 -> FAILURE gives V(s0) = 10/3, V(s1) = 5, V(s2) = 0:

    >>> import jax.numpy as jnp
    >>> from bepo_jax import FAILURE, SUCCESS, hash_observations
    >>> from bepo_jax.credit.graph import build_graph
    >>> keys = jnp.asarray(hash_observations([["s0", "s1"], ["s0", "s2"], ["s0", "s1"]]))
    >>> g = build_graph(keys, jnp.ones((3, 2), bool), jnp.array([SUCCESS, FAILURE, FAILURE]))
    >>> r = jnp.array([[0.0, 10.0], [0.0, 0.0], [0.0, 0.0]])
    >>> fp = bellman_fixed_point(g, r, jnp.zeros(6), 1.0, tol=1e-6, max_iters=100, solver="dense")
    >>> [round(float(v), 4) for v in fp.value[:3]], bool(fp.converged)
    ([3.3333, 5.0, 0.0], True)
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver={solver!r} is not valid; use one of {SOLVERS}.")
    n = graph.num_slots
    size = n if max_states <= 0 else min(max_states, n)
    solver = resolve_solver(solver, size)
    tol = jnp.maximum(tol, TOL_FLOOR)
    if solver == "sparse":
        sweep = _sparse_sweep(graph, r, gamma)
    else:  # dense and direct: one [S, S] matrix serves the sweep, the solve and its check
        p, rbar = transition_matrix(graph, size), _mean_reward(graph, r, size)
        sweep = _dense_sweep(p, rbar, gamma)
        v0 = v0[:size]
    done0 = _small_step(sweep(v0), v0, tol)
    if solver == "solve":
        fp = _direct_solve(p, rbar, gamma, sweep, tol)
        start = max_iters <= 0  # no iterations allowed: the Monte-Carlo initialisation
        return FixedPoint(_pad(jnp.where(start, v0, fp.value), n), jnp.where(start, 0, fp.iterations),
                          jnp.where(start, done0, fp.converged))

    def cond(carry):
        k, _, done = carry
        return (~done) & (k < max_iters)

    def body(carry):
        k, v, _ = carry
        v_new = sweep(v)
        return k + 1, v_new, _small_step(v_new, v, tol)

    k, v, done = jax.lax.while_loop(cond, body, (jnp.int32(0), v0, done0))
    return FixedPoint(_pad(v, n), k, done)


def _pad(v, n):
    return v if v.shape[0] == n else jnp.zeros((n,), v.dtype).at[: v.shape[0]].set(v)


def _warn_overflow(any_overflow, most, bucket):
    if not bool(any_overflow):  # under vmap both branches of a cond run: warn only on a real overflow
        return
    warnings.warn(f"a group has {int(most)} states, more than the state bucket max_states={bucket}; the batch was "
                  f"evaluated with the sparse solver instead (right numbers, slower). Set max_states >= {int(most)} "
                  "or 0 (automatic).", RuntimeWarning, stacklevel=2)


def bellman_fixed_point_batched(graphs: GroupGraph, r, v0, gamma, *, tol, max_iters, solver: str,
                                max_states: int = 0) -> tuple[FixedPoint, Bool[Array, "B"]]:
    """``bellman_fixed_point`` over a batch of groups (leading axis B), with the state
    buckets of the module docstring. Returns (fixed points, overflow [B]); overflow is
    only ever true for an explicit ``max_states`` that a group outgrew."""
    n = graphs.valid.shape[1] * graphs.valid.shape[2]

    def run(which, size):
        fn = lambda g, rr, vv: bellman_fixed_point(g, rr, vv, gamma, tol=tol, max_iters=max_iters,
                                                   solver=which, max_states=size)
        return jax.vmap(fn)(graphs, r, v0)

    no_overflow = jnp.zeros(graphs.num_states.shape, bool)
    if solver == "sparse":
        return run("sparse", n), no_overflow
    most = jnp.max(graphs.num_states)
    if max_states <= 0:  # automatic: the smallest bucket that holds the largest group
        buckets = _auto_buckets(n)
        branches = [lambda b=b: run(solver, b) for b in buckets]
        if n > AUTO_BUCKETS[-1]:
            branches.append(lambda: run("sparse", n))
        index = jnp.searchsorted(jnp.asarray(buckets, jnp.int32), most.astype(jnp.int32), side="left")
        if len(branches) == 1:
            return branches[0](), no_overflow
        return jax.lax.switch(jnp.minimum(index, len(branches) - 1), branches), no_overflow
    size = min(max_states, n)
    overflow = graphs.num_states > size
    if size == n:
        return run(solver, size), overflow

    def fallback():
        jax.debug.callback(_warn_overflow, jnp.any(overflow), most, size)
        return run("sparse", n)

    return jax.lax.cond(jnp.any(overflow), fallback, lambda: run(solver, size)), overflow


def _direct_solve(p: Float[Array, "S S"], rbar: Float[Array, "S"], gamma, sweep, tol) -> FixedPoint:
    a = jnp.eye(p.shape[0], dtype=jnp.float32) - gamma * p
    lu = jax.scipy.linalg.lu_factor(a)
    v = jax.scipy.linalg.lu_solve(lu, rbar)
    v = v + jax.scipy.linalg.lu_solve(lu, rbar - jnp.matmul(a, v, precision=_HI))  # one refinement step
    ok = _small_step(sweep(v), v, tol) & jnp.all(jnp.isfinite(v))
    return FixedPoint(v, jnp.int32(1), ok)
