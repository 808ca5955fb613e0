"""Multi-host set-up: one ``jax.distributed.initialize()`` per process, and who owns what.

On a TPU pod slice or a Slurm/Open MPI GPU cluster, ``initialize()`` with no arguments
reads the coordinator, process count and id from the environment. Elsewhere pass them
(``coordinator_address="host0:1234", num_processes=N, process_id=i``). CPU processes
(tests, debugging) use the gloo collectives, set here (the setting only concerns the CPU
backend). Afterwards ``jax.devices()`` lists every process's devices; build the mesh over
all of them and feed each process's slice of a batch with
``jax.make_array_from_process_local_data``.

A process that dies (killed, out of memory, a lost host) stops sending heartbeats; after
``heartbeat_timeout_seconds`` the runtime stops every other process with an error naming
the distributed service, instead of leaving them blocked in a collective forever. Relaunch
every process with the same command (``compare`` resumes by itself; ``train_seeds`` with
``resume=True``): each run continues from the newest checkpoint that all runs of the
program have.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import jax
import numpy as np


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, *, heartbeat_timeout_seconds: int = 100,
               initialization_timeout: int = 300, cpu: Optional[bool] = None) -> None:
    """Join the multi-process JAX runtime (see module docstring). ``heartbeat_timeout_seconds``:
    how long the other processes wait for a dead one before they stop. ``cpu`` is accepted for
    older callers; the gloo CPU collectives are always selected."""
    del cpu
    if heartbeat_timeout_seconds < 1:
        raise ValueError(f"heartbeat_timeout_seconds={heartbeat_timeout_seconds} must be >= 1.")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                               initialization_timeout=initialization_timeout)
    print(f"bepo_jax: process {jax.process_index()} of {jax.process_count()} joined ({jax.local_device_count()} "
          f"local / {jax.device_count()} devices); if another process dies this one stops within about "
          f"{heartbeat_timeout_seconds} s; relaunching every process with the same command continues the runs.",
          file=sys.stderr, flush=True)


def run_owners(mesh, runs: int, axis: str = "runs") -> list[int]:
    """The process that owns each of ``runs`` runs stacked along ``mesh``'s ``axis``: the one whose
    device holds the run's first shard (the lowest process index among the devices the run's slice
    of the axis spans). Without several processes, every run is process 0's."""
    if jax.process_count() == 1:
        return [0] * runs
    if mesh is None or axis not in mesh.shape:
        raise ValueError(f"with {jax.process_count()} processes the runs must be sharded over a mesh axis {axis!r} "
                         "(make_mesh((jax.device_count(),), ('runs',))); otherwise every process would train and "
                         "write every run.")
    size = mesh.shape[axis]
    if runs % size:
        raise ValueError(f"{runs} runs do not split over the {axis!r} axis of size {size}; use a multiple of it.")
    devices = np.moveaxis(np.asarray(mesh.devices), list(mesh.axis_names).index(axis), 0).reshape(size, -1)
    per = runs // size
    return [min(d.process_index for d in devices[i // per]) for i in range(runs)]


def agree(flags) -> np.ndarray:
    """Every process's ``flags`` (a bool or a 1-D array of them, the same length everywhere), on every
    process, as bool [processes, n] (a collective: all must call it)."""
    flags = np.atleast_1d(np.asarray(flags, bool)).astype(np.int32)
    if jax.process_count() == 1:
        return flags[None].astype(bool)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(flags, tiled=False)).reshape(-1, flags.size).astype(bool)


def gather_owned(values: Sequence, owners: Sequence[int]):
    """``values[i]`` from the process that owns run i, on every process (a collective). Each
    process passes its own runs' values and a placeholder of the same structure for the others."""
    if jax.process_count() == 1:
        return list(values)
    from jax.experimental import multihost_utils

    stacked = jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *values)
    everyone = multihost_utils.process_allgather(stacked, tiled=False)  # [processes, runs, ...]
    return [jax.tree_util.tree_map(lambda x, i=i: np.asarray(x)[owners[i], i], everyone) for i in range(len(values))]


def gather_owned_json(values: Sequence, owners: Sequence[int]) -> list:
    """``gather_owned`` for JSON-able values (metrics rows): every process gets run i's value from
    its owner. Each process passes its own runs' values (anything, e.g. None, for the others)."""
    if jax.process_count() == 1:
        return list(values)
    import json

    me = jax.process_index()
    data = [json.dumps(v if owners[i] == me else None).encode() for i, v in enumerate(values)]
    lengths = gather_owned([np.array(len(d), np.int64) for d in data], owners)  # each run's, from its owner
    width = max([4, *(int(x) for x in lengths)])  # 4: b"null", what the other processes send
    buf = [np.frombuffer(d.ljust(width), np.uint8) for d in data]
    return [json.loads(bytes(np.asarray(b)).decode()) for b in gather_owned(buf, owners)]
