"""The credit kernels: pure, jittable functions of padded arrays (JAX and NumPy only).

This half imports nothing of the agent stack (``bepo_jax.agent``), of the trainer
integrations or of the lab; ``tests/test_layers.py`` reads the import graph and fails if
it ever does. In the order each module may import the ones before it:

``types`` (StepBatch, outcome codes, validation) and ``_config`` (frozen keyword-only
configs) -> ``hashing`` (content digests) -> ``graph`` (group-local state ids, successors,
diagnostics) -> ``stats`` (masked group moments), ``returns`` (discounted returns, GAE),
``fixed_point`` (the mean-backup Bellman solvers) -> ``estimators/`` (every estimator and the
one registry) -> ``similarity`` (MinHash merging of near-duplicate states), ``tokens``
(record -> token advantages), ``builders`` (StepBatch from Python trajectories),
``sharding`` (meshes, NamedSharding, shard_map). ``reference`` holds the plain-loop float64
implementations the kernels are tested against.

The names users need are re-exported by ``bepo_jax`` itself (``bepo_jax.__all__``).
"""
