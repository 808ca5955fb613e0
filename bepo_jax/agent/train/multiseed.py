"""Several seeds of one run as one compiled program (the PureJaxRL pattern).

``SeedBatch(cfg, seeds)`` stacks S runs that differ only in their seed — the policy's
initial parameters, the optimizer state, the training tasks drawn for the seed, and every
PRNG key — along a leading *run* axis, and maps ``Setup.iteration_fn``'s pieces over it:
one compile, one program per iteration for all seeds. How the program covers the run
axis is ``runs_per_step``: None vmaps every run at once (GPU/TPU, and any mesh); k loops
inside the program over chunks of k vmapped runs (``lax.map``); "auto" (default) is 1 on
CPU, where a wider batch costs more per sequence, None elsewhere. Run i follows the single run
``train(cfg.replace(seed=seeds[i]))`` (same keys, same tasks, same initial parameters;
equal to float32 tolerance: ``tests/agent/test_multiseed.py``).

    runs = SeedBatch(RunConfig(estimator="gated_bepo"), seeds=range(8))
    states = runs.init_states()
    for it in range(1, 61):
        states, metrics = runs.iterate(states, it)     # metrics: one dict per seed
    runs.evaluate_all(states, [s + 60 for s in runs.seeds])   # held-out success of every seed

``train_seeds`` (``bepo_jax.agent.train``) runs this with one ordinary run directory per seed
(metrics, TensorBoard, checkpoints, ``--resume``); ``bepo-jax compare`` uses it.

On a mesh, pass ``mesh`` with a ``"runs"`` axis: the stacked state and tasks are placed
with the run axis sharded over it (seeds x devices), everything else replicated per run.

Only the JAX environments (Sokoban, the maze, registered ones) run this way; TextWorld runs
through the host loop.
The estimator runs once on the S x B groups of all runs (groups are independent), not
under ``vmap``: a kernel that picks its state bucket with ``lax.switch`` keeps doing so
(under ``vmap`` the switch would become a select computing every bucket).
"""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import numpy as np

from ..envs.registry import is_host_env
from ..rl.train_step import TrainState
from .config import RunConfig
from .setup import DEFAULT_HELD_OUT, Setup, evaluation


def host_copy(tree):
    """Arrays on the host; with several processes the run axis is gathered from all of
    them first (each process holds only its devices' runs)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return jax.tree_util.tree_map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def stack(trees: Sequence):
    """Stack pytrees of equal structure along a new leading axis."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *trees)


def unstack(tree, i: int):
    """Run ``i`` of a stacked pytree."""
    return jax.tree_util.tree_map(lambda x: x[i], tree)


def auto_runs_per_step(mesh=None) -> Optional[int]:
    """``runs_per_step="auto"``: on CPU one run per step of an in-program loop (measured
    1.6x eight sequential runs on 2 cores, where vmapping all runs was 1.02x: the CPU's
    cost per sequence grows with the batch); on GPU/TPU, or with a mesh, every run vmapped."""
    return 1 if mesh is None and jax.default_backend() == "cpu" else None


class SeedBatch:
    """S seeds of ``cfg`` as one compiled program (module docstring)."""

    def __init__(self, cfg: RunConfig, seeds: Sequence[int], *, mesh: Optional[Mesh] = None, runs_axis: str = "runs",
                 env=None, runs_per_step: Optional[int] | str = "auto", held_out: str = DEFAULT_HELD_OUT):
        seeds = [int(s) for s in seeds]
        if not seeds:
            raise ValueError("SeedBatch needs at least one seed.")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"SeedBatch seeds must differ; got {seeds}.")
        if env is None and is_host_env(cfg.env):
            raise ValueError("SeedBatch vmaps the fused JAX loop; env='textworld' runs through the host loop — run its "
                             "seeds one after another (train, or bepo-jax compare).")
        if mesh is not None and runs_axis not in mesh.shape:
            raise ValueError(f"SeedBatch: the mesh has axes {tuple(mesh.shape)}; add a {runs_axis!r} axis for the runs.")
        if mesh is not None and len(seeds) % mesh.shape[runs_axis]:
            raise ValueError(f"SeedBatch: {len(seeds)} seeds do not split over the {runs_axis!r} axis of size "
                             f"{mesh.shape[runs_axis]}; use a multiple of it.")
        if runs_per_step == "auto":
            runs_per_step = auto_runs_per_step(mesh)
        if runs_per_step is not None and (isinstance(runs_per_step, bool) or not isinstance(runs_per_step, int)
                                          or runs_per_step < 1):
            raise ValueError(f"SeedBatch.runs_per_step={runs_per_step!r} must be 'auto', None (vmap every run) or "
                             "an int >= 1.")
        if runs_per_step is not None and mesh is not None:
            raise ValueError("SeedBatch: runs_per_step loops over the run axis; with a mesh the run axis is sharded "
                             "and vmapped — leave runs_per_step=None.")
        self.cfg, self.seeds, self.mesh, self.runs_axis = cfg, seeds, mesh, runs_axis
        self.runs_per_step = runs_per_step
        self.setups = [Setup(cfg.replace(seed=s), env=env, held_out=held_out) for s in seeds]
        self.tasks = self.place(stack([jax.tree_util.tree_map(jnp.asarray, s.train_tasks) for s in self.setups]))
        self._step = jax.jit(self._iteration, donate_argnums=(0,))
        evaluate = self.setups[0].rollout_for(cfg.episodes_per_evaluation)  # Setup.evaluate's rollout
        self._eval = jax.jit(lambda params, pools, keys: self._over_runs(evaluate, params, pools, keys))
        self._eval_pools, self._eval_ids = {}, {}

    def _over_runs(self, f, *xs):
        """``f`` on every run: vmapped over all of them, or (``runs_per_step`` = k) a loop
        inside the program over chunks of k vmapped runs (``lax.map``): one compile either way."""
        if self.runs_per_step is None or self.runs_per_step >= len(self.seeds):
            return jax.vmap(f)(*xs)
        return jax.lax.map(lambda a: f(*a), xs, batch_size=self.runs_per_step)

    def _iteration(self, states, tasks, keys):
        """Rollouts and updates over the runs (``_over_runs``); the estimator once on the
        S x B groups of all runs together (groups are independent, so this is each run's
        own credit, without vmapping the kernel's bucket switch into a select of every bucket)."""
        s0 = self.setups[0]
        ros = self._over_runs(s0.rollout_fn, states, tasks, keys)
        S, B = ros.batch.mask.shape[:2]
        out = s0.advantages(jax.tree_util.tree_map(lambda x: x.reshape((S * B,) + x.shape[2:]), ros.batch))
        out = jax.tree_util.tree_map(lambda x: x.reshape((S, B) + x.shape[1:]), out)
        return self._over_runs(s0.learn_from, states, ros, out)

    def place(self, tree):
        """Put a stacked pytree on the mesh (run axis sharded over "runs"); as is without a mesh."""
        if self.mesh is None:
            return tree
        spec = lambda x: NamedSharding(self.mesh, P(self.runs_axis, *([None] * (x.ndim - 1))))
        return jax.tree_util.tree_map(lambda x: jax.device_put(x, spec(x)), tree)

    def init_states(self) -> TrainState:
        """Each seed's first state (its own initial parameters, or the warm start's, and RNG), stacked."""
        return self.place(stack([s.init_state() for s in self.setups]))

    def keys(self, it: int):
        return self.place(jnp.stack([s.iteration_key(it) for s in self.setups]))

    def iterate(self, states: TrainState, it: int) -> tuple[TrainState, list[dict]]:
        """Iteration ``it`` of every seed: (stacked states, one metrics dict of floats per seed)."""
        states, m = self._step(states, self.tasks, self.keys(it))
        m = host_copy(m)
        return states, [{k: float(v[i]) for k, v in m.items()} for i in range(len(self.seeds))]

    def evaluate(self, states: TrainState, i: int, **kw) -> dict:
        """``Setup.evaluate`` of seed ``i`` (held-out tasks; ``training=True`` for its training tasks)."""
        return self.setups[i].evaluate(unstack(states, i).params, **kw)

    def evaluate_all(self, states: TrainState, eval_seeds: Sequence[int], *, training: bool = False) -> list[dict]:
        """Every seed's ``Setup.evaluate(params, seed=eval_seeds[i], training=training)`` as one
        vmapped program (one compile for all seeds; each seed its own tasks and key)."""
        if training not in self._eval_pools:  # the pools and their ids are fixed: built once per kind
            tasks = [s.eval_tasks(training=training) for s in self.setups]
            self._eval_pools[training] = self.place(stack(tasks))
            self._eval_ids[training] = [s.task_ids_of(t) for s, t in zip(self.setups, tasks)]
        keys = self.place(jnp.stack([jax.random.PRNGKey(int(e)) for e in eval_seeds]))
        ro = self._eval(states.params, self._eval_pools[training], keys)
        success, reward = host_copy((ro.success, ro.batch.reward))
        return [evaluation(success[i], reward[i], self._eval_ids[training][i]) for i in range(len(self.seeds))]
