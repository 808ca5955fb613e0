"""One process of the two-process test (tests/agent/test_rl.py): joins jax.distributed on
localhost, runs one sharded training step over the global 4-device mesh, writes the
parameters' checksum."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.helpers import xla_flags  # noqa: E402

# 2 devices per process, with the test run's compiler settings (those of the single-process
# update it is compared with).
os.environ["XLA_FLAGS"] = xla_flags(2)
os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

from bepo_jax.agent.rl import multihost  # noqa: E402

port, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
multihost.initialize(f"localhost:{port}", 2, pid, cpu=True)

import jax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from bepo_jax.credit.sharding import make_mesh  # noqa: E402
from tests.agent.test_rl import make_trainer, make_update_batch  # noqa: E402

assert jax.device_count() == 4 and jax.local_device_count() == 2
mesh = make_mesh((4,), ("data",))
trainer = make_trainer(mesh)
state = trainer.init_state()
full = make_update_batch()
n = full.tokens.shape[0] // 2
local = jax.tree_util.tree_map(lambda x: None if x is None else np.asarray(x)[pid * n:(pid + 1) * n], full)
sharding = NamedSharding(mesh, P("data"))
glob = jax.tree_util.tree_map(lambda x: jax.make_array_from_process_local_data(sharding, x), local)
state, _ = trainer.step(state, glob)
leaves = [np.asarray(jax.experimental.multihost_utils.process_allgather(x, tiled=True)) for x in
          jax.tree_util.tree_leaves(state.params)]
np.save(out, np.concatenate([x.ravel() for x in leaves]))
jax.distributed.shutdown()
