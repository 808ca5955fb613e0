"""Plumbing shared by every estimator: the host entry point and the group vmap."""

from __future__ import annotations

from typing import Any, Callable

import warnings

import jax

from ..types import StepBatch, check_batch

NORMS = ("mean", "mean_std")
WEIGHTINGS = ("step", "trajectory")
STDS = ("unbiased", "population")


def per_group(group_fn: Callable, batch: StepBatch, config: Any):
    """Apply ``group_fn(obs_key, reward, mask, outcome, penalty, config)`` to each group.

    Groups are independent, so the group axis is a plain ``vmap`` axis (and the
    data-parallel axis under a mesh).
    """
    fn = lambda o, r, m, c, p: group_fn(o, r, m, c, p, config)
    return jax.vmap(fn)(batch.obs_key, batch.reward, batch.mask, batch.outcome, batch.penalty_or_zeros())


def entry_point(kernel_jit: Callable, batch: StepBatch, config: Any, config_type: type, *, check: bool):
    """Validate ``batch`` and ``config`` on the host, then run the jitted kernel."""
    if not isinstance(config, config_type):
        raise ValueError(
            f"config must be a {config_type.__name__}, got {type(config).__name__}; "
            f"build one with {config_type.__name__}(...)."
        )
    batch = check_batch(batch, values=check)
    out = kernel_jit(batch, config)
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
