"""Plumbing shared by every estimator: the host entry point and the group vmap."""

from __future__ import annotations

from typing import Any, Callable

import warnings

import jax

from .._config import check_choice, check_int, check_range
from ..fixed_point import SOLVERS
from ..types import StepBatch, check_batch

NORMS = ("mean", "mean_std")
WEIGHTINGS = ("step", "trajectory")
STDS = ("unbiased", "population")
GATE_ON = ("successor", "reward_successor")


def check_outcome_fields(name: str, cfg: Any) -> None:
    """Validate the outcome-normalisation fields every estimator shares (norm, weighting, std, eps)."""
    check_choice(name, "norm", cfg.norm, NORMS)
    check_choice(name, "weighting", cfg.weighting, WEIGHTINGS)
    check_choice(name, "std", cfg.std, STDS)
    check_range(name, "eps", cfg.eps, lo=0.0)


def check_graph_fields(name: str, cfg: Any) -> None:
    """Validate the graph / fixed-point fields shared by Gated-BEPO and confidence returns."""
    check_int(name, "min_successors", cfg.min_successors, lo=1)
    check_choice(name, "gate_on", cfg.gate_on, GATE_ON)
    check_range(name, "tol", cfg.tol, lo=0.0)
    check_int(name, "max_iters", cfg.max_iters, lo=0)
    check_choice(name, "solver", cfg.solver, SOLVERS)
    check_int(name, "history", cfg.history, lo=0)
    check_int(name, "max_states", cfg.max_states, lo=0)


def per_group(group_fn: Callable, batch: StepBatch, config: Any):
    """Apply ``group_fn(obs_key, reward, mask, outcome, penalty, config)`` to each group.

    Groups are independent, so the group axis is a plain ``vmap`` axis (and the
    data-parallel axis under a mesh).
    """
    fn = lambda o, r, m, c, p: group_fn(o, r, m, c, p, config)
    return jax.vmap(fn)(batch.obs_key, batch.reward, batch.mask, batch.outcome, batch.penalty_or_zeros())


# Host-side state buckets: record slots N -> the smallest power-of-two bucket that has
# fitted every batch of that N so far (see ``entry_point``).
MIN_BUCKET = 32
_BUCKETS: dict[int, int] = {}


def _next_pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def entry_point(kernel_jit: Callable, batch: StepBatch, config: Any, config_type: type, *, check: bool,
                extra: tuple = ()):
    """Validate ``batch`` and ``config`` on the host, then run the jitted kernel
    ``kernel_jit(batch, config, *extra)``.

    Configs with ``max_states == 0`` (automatic) and a bucketed solver get their state
    bucket here: the smallest power of two (>= MIN_BUCKET) that fitted the earlier
    batches of this K * T; a batch that overflows it is re-run at once with the next
    power of two above its largest group, which is remembered. So the dense and direct
    solvers work on [S, S] with S near the real number of states, and each bucket
    compiles once. (Inside a user's jit there is no host: 0 there means S = K * T.)
    """
    if not isinstance(config, config_type):
        raise ValueError(
            f"config must be a {config_type.__name__}, got {type(config).__name__}; "
            f"build one with {config_type.__name__}(...)."
        )
    batch = check_batch(batch, values=check)
    on_host = not isinstance(batch.mask, jax.core.Tracer)
    if on_host and getattr(config, "max_states", None) == 0 and getattr(config, "solver", "sparse") != "sparse":
        n = batch.mask.shape[1] * batch.mask.shape[2]
        bucket = min(_BUCKETS.get(n, MIN_BUCKET), n)
        out = kernel_jit(batch, config.replace(max_states=bucket), *extra)
        overflow = jax.device_get(out.diagnostics.overflow)
        if overflow.any():
            bucket = min(max(_next_pow2(int(jax.device_get(out.diagnostics.num_states).max())), MIN_BUCKET), n)
            out = kernel_jit(batch, config.replace(max_states=bucket), *extra)
        _BUCKETS[n] = bucket
        return out
    out = kernel_jit(batch, config, *extra)
    if check:
        warn_on_overflow(out, config)
    return out


def warn_on_overflow(out: Any, config: Any) -> None:
    """Host-side: say when a group outgrew the solver's state bucket (its batch then ran
    the sparse solver, so the numbers are right, but the bucket is too small)."""
    diag = getattr(out, "diagnostics", None)
    if diag is None or isinstance(diag.overflow, jax.core.Tracer) or not bool(jax.device_get(diag.overflow).any()):
        return
    most = int(jax.device_get(diag.num_states).max())
    warnings.warn(
        f"{int(jax.device_get(diag.overflow).sum())} group(s) have more states than "
        f"{type(config).__name__}.max_states={getattr(config, 'max_states', '?')} (up to {most}); the batch was "
        f"evaluated with the sparse solver instead. Set max_states >= {most} to keep the dense/direct solver.",
        RuntimeWarning, stacklevel=3)


def stop_gradient(tree):
    return jax.tree_util.tree_map(jax.lax.stop_gradient, tree)
