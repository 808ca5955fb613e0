"""Several seeds of one run as one compiled program (the PureJaxRL pattern).

``SeedBatch(cfg, seeds)`` stacks S runs that differ only in their seed — the policy's
initial parameters, the optimizer state, the training tasks drawn for the seed, and every
PRNG key — along a leading *run* axis, and ``jax.vmap``s ``Setup.iteration_fn`` over it:
one compile, one program per iteration for all seeds. Run i follows the single run
``train(cfg.replace(seed=seeds[i]))`` (same keys, same tasks, same initial parameters;
equal to float32 tolerance: ``tests/test_multiseed.py``).

    runs = SeedBatch(RunConfig(estimator="gated_bepo"), seeds=range(8))
    states = runs.init_states()
    for it in range(1, 61):
        states, metrics = runs.iterate(states, it)     # metrics: one dict per seed
    runs.evaluate(states, i)                          # held-out success of seed i

On a mesh, pass ``mesh`` with a ``"runs"`` axis: the stacked state and tasks are placed
with the run axis sharded over it (seeds x devices), everything else replicated per run.

Only the JAX environments (Sokoban, the maze) vmap; TextWorld runs through the host loop.
The estimator runs once on the S x B groups of all runs (groups are independent), not
under ``vmap``: a kernel that picks its state bucket with ``lax.switch`` keeps doing so
(under ``vmap`` the switch would become a select computing every bucket).
"""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .rl.train_step import TrainState
from .train import RunConfig, Setup


def stack(trees: Sequence):
    """Stack pytrees of equal structure along a new leading axis."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *trees)


def unstack(tree, i: int):
    """Run ``i`` of a stacked pytree."""
    return jax.tree_util.tree_map(lambda x: x[i], tree)


class SeedBatch:
    """S seeds of ``cfg`` as one vmapped program (module docstring)."""

    def __init__(self, cfg: RunConfig, seeds: Sequence[int], *, mesh: Optional[Mesh] = None, runs_axis: str = "runs"):
        seeds = [int(s) for s in seeds]
        if not seeds:
            raise ValueError("SeedBatch needs at least one seed.")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"SeedBatch seeds must differ; got {seeds}.")
        if cfg.env == "textworld":
            raise ValueError("SeedBatch vmaps the fused JAX loop; env='textworld' runs through the host loop — run its "
                             "seeds one after another (train, or bepo-jax compare).")
        if mesh is not None and runs_axis not in mesh.shape:
            raise ValueError(f"SeedBatch: the mesh has axes {tuple(mesh.shape)}; add a {runs_axis!r} axis for the runs.")
        if mesh is not None and len(seeds) % mesh.shape[runs_axis]:
            raise ValueError(f"SeedBatch: {len(seeds)} seeds do not split over the {runs_axis!r} axis of size "
                             f"{mesh.shape[runs_axis]}; use a multiple of it.")
        self.cfg, self.seeds, self.mesh, self.runs_axis = cfg, seeds, mesh, runs_axis
        self.setups = [Setup(cfg.replace(seed=s)) for s in seeds]
        self.tasks = self._place(stack([jax.tree_util.tree_map(jnp.asarray, s.train_tasks) for s in self.setups]))
        self._step = jax.jit(self._iteration, donate_argnums=(0,))

    def _iteration(self, states, tasks, keys):
        """Rollouts and updates vmapped over the runs; the estimator once on the S x B
        groups of all runs together (groups are independent, so this is each run's own
        credit, without vmapping the kernel's bucket switch into a select of every bucket)."""
        s0 = self.setups[0]
        ros = jax.vmap(s0.rollout_fn)(states, tasks, keys)
        S, B = ros.batch.mask.shape[:2]
        out = s0.advantages(jax.tree_util.tree_map(lambda x: x.reshape((S * B,) + x.shape[2:]), ros.batch))
        out = jax.tree_util.tree_map(lambda x: x.reshape((S, B) + x.shape[1:]), out)
        return jax.vmap(s0.learn_from)(states, ros, out)

    def _place(self, tree):
        if self.mesh is None:
            return tree
        spec = lambda x: NamedSharding(self.mesh, P(self.runs_axis, *([None] * (x.ndim - 1))))
        return jax.tree_util.tree_map(lambda x: jax.device_put(x, spec(x)), tree)

    def init_states(self) -> TrainState:
        """Each seed's fresh state (its own initial parameters and RNG), stacked."""
        return self._place(stack([s.trainer.init_state() for s in self.setups]))

    def keys(self, it: int):
        return self._place(jnp.stack([s.iteration_key(it) for s in self.setups]))

    def iterate(self, states: TrainState, it: int) -> tuple[TrainState, list[dict]]:
        """Iteration ``it`` of every seed: (stacked states, one metrics dict of floats per seed)."""
        states, m = self._step(states, self.tasks, self.keys(it))
        m = jax.device_get(m)
        return states, [{k: float(v[i]) for k, v in m.items()} for i in range(len(self.seeds))]

    def evaluate(self, states: TrainState, i: int, **kw) -> dict:
        """``Setup.evaluate`` of seed ``i`` (held-out tasks; ``training=True`` for its training tasks)."""
        return self.setups[i].evaluate(unstack(states, i).params, **kw)
