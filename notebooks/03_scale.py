# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/bepo-jax/bepo_jax/blob/main/notebooks/03_scale.ipynb)
#
# # Scale: the kernels on a device mesh, and a short training run
#
# 1. A batch of many groups sharded over 8 devices (simulated on a CPU runtime; the real
#    chips on a GPU/TPU runtime with 8 of them): `jit` with a `NamedSharding` and
#    `shard_map`, same numbers; per-group fixed-point iteration counts.
# 2. A short training run, `bepo-jax train --env sokoban --estimator gated_bepo` (the
#    library's default config; `make train` runs a larger recipe), and its learning curve.

# %%
# Set-up (CPU, GPU or TPU runtime). A checkout with `make test` already has bepo_jax; elsewhere (Colab) set
# BEPO_JAX_SOURCE first (`%env BEPO_JAX_SOURCE=git+https://github.com/<you>/bepo_jax`, or an uploaded folder).
import importlib.util, os, subprocess, sys

if importlib.util.find_spec("bepo_jax") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", os.environ["BEPO_JAX_SOURCE"]])
    importlib.invalidate_caches()
    import bepo_jax_install  # installs the dependencies beside the runtime's own JAX (docs/notebooks.md)

    bepo_jax_install.install()
import jax
import matplotlib.pyplot as plt
import numpy as np
import bepo_jax as bj
from bepo_jax import viz
from bepo_jax.credit import sharding

devices = jax.devices() if len(jax.devices()) >= 8 else jax.devices("cpu")
print("JAX", jax.__version__, "devices:", len(devices), devices[0].platform)

# %% [markdown]
# ## Many groups on a mesh
#
# Grid-room random walks (the benchmark's generator): G groups x K = 8 trajectories x
# T = 50 steps. The group axis is the data-parallel axis.

# %%
from bepo_jax.credit.builders import grid_room_batch

G = int(os.environ.get("BEPO_NB_GROUPS", 64))
batch = grid_room_batch(G, 8, 50, seed=0)
mesh = sharding.make_mesh((8,), ("data",), devices=devices[:8])
sharded_batch = sharding.shard_batch(batch, mesh)
cfg = bj.GatedBEPOConfig(max_states=64)
single = bj.gated_bepo(batch, cfg)
on_mesh = jax.jit(bj.credit.estimators.gated_bepo_kernel)(sharded_batch, cfg)
per_device = sharding.sharded(bj.credit.estimators.gated_bepo_kernel, mesh)(sharded_batch, cfg)
for name, out in (("jit + NamedSharding", on_mesh), ("shard_map", per_device)):
    err = float(np.abs(np.asarray(out.advantage) - np.asarray(single.advantage)).max())
    print(f"{name:>20}: max |A - A_single| = {err:.2e}; advantage sharding: {out.advantage.sharding}")
    assert err < 1e-4

# %% [markdown]
# Under `jit` the fixed-point loop of the whole batch runs until its slowest group
# converges; under `shard_map` each device stops with its own groups. The per-group
# counts agree either way (each group stops updating when it converges) — to within one
# sweep: the two programs may round a group's stopping test differently (seen on JAX 0.12
# for one group of 16: 66 sweeps against 67; identical on JAX 0.10.2):

# %%
it_jit = np.asarray(on_mesh.iterations)
it_map = np.asarray(per_device.iterations)
assert np.abs(it_jit - it_map).max() <= 1
per_dev = it_map.reshape(8, -1).max(axis=1)
plt.bar(np.arange(8), per_dev, color="C1", label="sweeps run on each device (shard_map)")
plt.axhline(it_jit.max(), color="C0", label=f"sweeps run everywhere under jit ({it_jit.max()})")
plt.xlabel("device")
plt.ylabel("Jacobi sweeps")
plt.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## A short training run
#
# `bepo_jax.agent.train.train` is what `bepo-jax train` runs: rollouts of a small token policy
# in JAX Sokoban (K = 8 per level), Gated-BEPO credit, a PPO update — one jitted program
# per iteration. The defaults take about 4 minutes on a 2-core CPU; `BEPO_NB_ITERATIONS`
# shortens it (CI runs 2).

# %%
import tempfile

from bepo_jax.agent.train import RunConfig, train

iterations = int(os.environ.get("BEPO_NB_ITERATIONS", 60))
small = iterations < 10
cfg = RunConfig(iterations=iterations, **(dict(groups=2, group_size=4, width=16, heads=2, eval_tasks=4, eval_every=1,
                                               task_pool=4) if small else {}))
run_dir = tempfile.mkdtemp(prefix="bepo_run_")
result = train(cfg, run_dir, progress=True)
print("training tasks:", result["initial_train"]["success_rate"], "->", result["final_train"]["success_rate"])
print("held-out tasks:", result["initial"]["success_rate"], "->", result["final"]["success_rate"])
viz.plot_run(run_dir)
plt.show()
