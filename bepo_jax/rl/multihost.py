"""Multi-host set-up: one ``jax.distributed.initialize()`` per process.

On a TPU pod slice or a Slurm/Open MPI GPU cluster, ``jax.distributed.initialize()``
with no arguments reads the coordinator, process count and id from the environment.
Elsewhere pass them (``coordinator_address="host0:1234", num_processes=N,
process_id=i``). CPU processes (tests, debugging) need the gloo collectives, set here.
Afterwards ``jax.devices()`` lists every process's devices; build the mesh over all of
them and feed each process's slice of the batch with
``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

from typing import Optional

import jax


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, *, cpu: bool = False) -> None:
    """Join the multi-process JAX runtime (see module docstring)."""
    if cpu:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)
