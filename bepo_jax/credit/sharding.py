"""Running the estimators on a device mesh.

Groups are independent, so the group axis B is the data-parallel axis:

* ``shard_batch(batch, mesh)`` places a StepBatch with ``NamedSharding(mesh, P("data"))``
  on its group axis; any estimator kernel under ``jax.jit`` then runs SPMD and equals
  the single-device result (``jax.jit`` + ``NamedSharding`` is the successor of pjit).
  Under plain jit the fixed-point ``while_loop`` is one loop for the whole batch: every
  device sweeps until the slowest group of *all* devices has converged (its
  per-group counters still stop at each group's own count).
* ``sharded(kernel, mesh)`` wraps a kernel in ``jax.shard_map``: each device runs its
  own groups with its own loop, so it stops when *its* groups have converged.

Meshes are built with explicit ``AxisType.Auto`` axes (``jax.make_mesh`` defaults to
Explicit since JAX 0.9).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from .types import FAILURE, StepBatch

DATA_AXIS = "data"


def make_mesh(shape: Optional[Sequence[int]] = None, names: Sequence[str] = (DATA_AXIS,),
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """A mesh over ``devices`` (default: all) with Auto axis types; ``shape`` defaults to
    all devices on the first axis."""
    devices = list(jax.devices() if devices is None else devices)
    if shape is None:
        shape = (len(devices),) + (1,) * (len(names) - 1)
    if len(shape) != len(names):
        raise ValueError(f"make_mesh: shape {tuple(shape)} and names {tuple(names)} must have one entry per axis.")
    if int(np.prod(shape)) != len(devices):
        raise ValueError(f"make_mesh: shape {tuple(shape)} needs {int(np.prod(shape))} devices, have {len(devices)}.")
    return jax.make_mesh(tuple(shape), tuple(names), axis_types=(AxisType.Auto,) * len(names), devices=devices)


def pad_groups(batch: StepBatch, multiple: int) -> tuple[StepBatch, int]:
    """Append empty groups so B is a multiple of ``multiple``; returns (batch, original B).
    Empty groups have all-zero outputs and do not change the real groups' numbers."""
    B = batch.mask.shape[0]
    extra = (-B) % multiple
    if extra == 0:
        return batch, B

    def pad(x, fill):
        x = np.asarray(x)
        return np.concatenate([x, np.full((extra,) + x.shape[1:], fill, x.dtype)])

    return StepBatch(obs_key=pad(batch.obs_key, 0), reward=pad(batch.reward, 0), mask=pad(batch.mask, False),
                     outcome=pad(batch.outcome, FAILURE),
                     penalty=None if batch.penalty is None else pad(batch.penalty, 0),
                     action_key=None if batch.action_key is None else pad(batch.action_key, 0)), B


def _check_divisible(batch: StepBatch, mesh: Mesh, axis: str) -> None:
    if axis not in mesh.shape:
        raise ValueError(f"mesh has no axis {axis!r}; its axes are {tuple(mesh.shape)}.")
    B, size = batch.mask.shape[0], mesh.shape[axis]
    if B % size:
        raise ValueError(f"the batch has B={B} groups, not a multiple of the {size} devices on mesh axis {axis!r}; "
                         f"pad it with bepo_jax.credit.sharding.pad_groups(batch, {size}).")


def shard_batch(batch: StepBatch, mesh: Mesh, axis: str = DATA_AXIS) -> StepBatch:
    """Place ``batch`` on ``mesh``, its group axis split over ``axis``."""
    _check_divisible(batch, mesh, axis)
    return jax.device_put(batch, NamedSharding(mesh, P(axis)))


def sharded(kernel: Callable, mesh: Mesh, axis: str = DATA_AXIS) -> Callable:
    """``kernel(batch, config)`` under ``jax.shard_map`` over the group axis, jitted.

    Each device evaluates only its groups, and its fixed-point loop stops when they
    have converged. Outputs are sharded like the batch. The config is replicated.
    """
    mapped = jax.shard_map(kernel, mesh=mesh, in_specs=(P(axis), P()), out_specs=P(axis), check_vma=False)
    jitted = jax.jit(mapped)

    def run(batch: StepBatch, config):
        _check_divisible(batch, mesh, axis)
        return jitted(batch, config)

    run.__name__ = f"sharded_{getattr(kernel, '__name__', 'kernel')}"
    run.__doc__ = f"{getattr(kernel, '__name__', 'kernel')} under shard_map over mesh axis {axis!r}."
    return run
