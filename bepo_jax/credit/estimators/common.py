"""The building blocks every estimator shares (and an estimator of your own uses; docs/contributing.md):
``per_group`` (the group vmap), ``with_sanitized_input`` (the in-jit input guard), ``stop_gradient``
and ``entry_point`` (host checks, then the jitted kernel)."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from ..configs import check_choice, check_int, check_range
from ..fixed_point import SOLVERS, TOL_FLOOR
from ..types import StepBatch, check_batch, sanitize
from .registry import register_estimator

NORMS = ("mean", "mean_std")
WEIGHTINGS = ("step", "trajectory")
STDS = ("unbiased", "population")
GATE_ON = ("successor", "reward_successor")


def check_outcome_fields(name: str, cfg: Any) -> None:
    """Validate the outcome-normalisation fields every estimator shares (norm, weighting, std, eps)."""
    check_choice(name, "norm", cfg.norm, NORMS)
    check_choice(name, "weighting", cfg.weighting, WEIGHTINGS)
    check_choice(name, "std", cfg.std, STDS)
    check_range(name, "eps", cfg.eps, lo=0.0, lo_open=True)


def check_graph_fields(name: str, cfg: Any) -> None:
    """Validate the graph / fixed-point fields shared by Gated-BEPO and confidence returns."""
    check_int(name, "min_successors", cfg.min_successors, lo=1)
    check_choice(name, "gate_on", cfg.gate_on, GATE_ON)
    check_range(name, "tol", cfg.tol, lo=0.0)
    if isinstance(cfg.tol, (int, float)) and cfg.tol < TOL_FLOOR:
        warnings.warn(f"{name}.tol={cfg.tol!r} is below the float32 floor {TOL_FLOOR:.3g} (8 ulps) and is raised "
                      "to it: float32 sweeps cannot resolve less.", UserWarning, stacklevel=4)
    check_int(name, "max_iters", cfg.max_iters, lo=0)
    check_choice(name, "solver", cfg.solver, SOLVERS)
    check_int(name, "history", cfg.history, lo=0)
    check_int(name, "max_states", cfg.max_states, lo=0)


def with_sanitized_input(kernel: Callable) -> Callable:
    """Wrap ``kernel(batch, config, ...)`` so that it runs on ``types.sanitize(batch)`` and
    its output carries the per-group invalid-input flags (``invalid`` or
    ``diagnostics.invalid``): inside jit an invalid group is dropped and reported, never
    a silent number, and never reaches its neighbours."""

    @functools.wraps(kernel)
    def wrapped(batch: StepBatch, config: Any, *args, **kwargs):
        clean, flags = sanitize(batch)
        return attach_flags(kernel(clean, config, *args, **kwargs), flags)

    return wrapped


def attach_flags(out: Any, flags) -> Any:
    """``out`` with its ``invalid`` (or ``diagnostics.invalid``) field set to ``flags``."""
    if hasattr(out, "diagnostics"):
        return dataclasses.replace(out, diagnostics=dataclasses.replace(out.diagnostics, invalid=flags))
    return dataclasses.replace(out, invalid=flags)


def per_group(group_fn: Callable, batch: StepBatch, config: Any):
    """Apply ``group_fn(obs_key, reward, mask, outcome, penalty, config)`` to each group.

    Groups are independent, so the group axis is a plain ``vmap`` axis (and the
    data-parallel axis under a mesh).
    """
    fn = lambda o, r, m, c, p: group_fn(o, r, m, c, p, config)
    return jax.vmap(fn)(batch.obs_key, batch.reward, batch.mask, batch.outcome, batch.penalty_or_zeros())


def entry_point(kernel_jit: Callable, batch: StepBatch, config: Any, config_type: type, *, check: bool,
                extra: tuple = ()):
    """Validate ``batch`` and ``config`` on the host, then run the jitted kernel
    ``kernel_jit(batch, config, *extra)``.

    Nothing is remembered between calls: the state bucket of the dense and direct
    solvers is a pure function of the batch (``fixed_point`` module docstring), so a
    call's numbers never depend on what was called before. With an explicit
    ``max_states`` the overflow warning (printed by the kernel) is flushed before
    returning.
    """
    if not isinstance(config, config_type):
        raise ValueError(
            f"config must be a {config_type.__name__}, got {type(config).__name__}; "
            f"build one with {config_type.__name__}(...)."
        )
    batch = check_batch(batch, values=check)
    out = kernel_jit(batch, config, *extra)
    if getattr(config, "max_states", 0) and not isinstance(batch.mask, jax.core.Tracer):
        jax.effects_barrier()
    return out


def estimator_entry(name: str, *, kernel: Callable, config: type, output: type, definition: str, source: str,
                    graph: bool, lab: bool = True, host_check: Optional[Callable] = None) -> Callable[[Callable], Callable]:
    """Make and register an estimator's host entry from its signature: the decorated function gives the
    entry its name, signature and docstring (its body, the docstring alone, never runs).

    ``entry(batch, config=config(), *, check=True)`` runs ``host_check(batch, config)`` when given (a refusal
    the kernel cannot make inside jit), then ``entry_point`` (the batch and config checked on the host;
    ``check=False`` skips the value checks) with ``jax.jit(kernel)``; it is registered under ``name``
    (``register_estimator``: the registry, the command line and the package's exports read it there).
    The one tail of every estimator whose entry takes the batch and its config only.

    >>> import inspect
    >>> from bepo_jax.credit.estimators.grpo import GRPOConfig, grpo
    >>> grpo.__name__, grpo.__module__, inspect.signature(grpo).parameters["config"].default == GRPOConfig()
    ('grpo', 'bepo_jax.credit.estimators.grpo', True)
    """
    jitted = jax.jit(kernel)
    config_type, default = config, config()

    def make(signature: Callable) -> Callable:
        @functools.wraps(signature)
        def entry(batch: StepBatch, config: Any = default, *, check: bool = True):
            if host_check is not None:
                host_check(batch, config)
            return entry_point(jitted, batch, config, config_type, check=check)

        entry.jitted = jitted  # the compiled kernel the entry calls (its cache is the entry's)
        return register_estimator(name, kernel=kernel, config=config_type, output=output, definition=definition,
                                  source=source, graph=graph, lab=lab)(entry)

    return make


MIN_BUCKET = 32  # the smallest bucket max_states_for returns


@functools.partial(jax.jit, static_argnames=("history",))
def _max_states(obs_key, mask, history: int):
    from ..graph import history_keys, state_ids

    return jnp.max(jax.vmap(lambda o, m: state_ids(history_keys(o, history), m)[1])(obs_key, mask))


def max_states_for(batch: StepBatch, *, history: int = 0) -> int:
    """A static ``max_states`` for ``batch``'s shape and kind of data, for configs used
    inside your own jit: the smallest power of two >= 32 that holds the largest group's
    states (with ``history``, the estimator's history-aware keys). Call it once on a
    representative batch; later batches that outgrow it still get right numbers
    (the sparse solver, ``diagnostics.overflow``, a printed warning). Measured on the
    2-core CPU at 64 x 8 x 50: 7.9 ms with a 64-state bucket against 207 ms for a dense
    [K T, K T] matrix (README, "State buckets")."""
    batch = check_batch(batch, values=False)
    most = int(_max_states(batch.obs_key, batch.mask, history))
    return max(MIN_BUCKET, 1 << max(most - 1, 0).bit_length())



def stop_gradient(tree):
    return jax.tree_util.tree_map(jax.lax.stop_gradient, tree)
