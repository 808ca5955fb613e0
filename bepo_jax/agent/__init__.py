"""The agent stack: environments, policies, rollouts, the RL step and the run code.

Built on the credit kernels (``bepo_jax.credit``) and never imported by them. Flax NNX,
optax, orbax, tensorboardX and matplotlib live here, so ``import bepo_jax`` stays light:
import a room when you need it.

``envs/`` (the JaxEnv / HostEnv interface, Sokoban and its solver, the diagnostic worlds,
Jumanji, TextWorld, the registry) -> ``models/`` (the policy interface and decode contract, a
small NNX transformer) -> ``rollouts/`` (``jitted``: the jitted rollouts; ``host``: the host loop;
``chat``: a pretrained model's chat) -> ``rl/`` (PPO loss, the training step, orbax checkpoints, multi-host) -> ``train/``
(run config, recipes, the iteration, the loop, seeds, arms, supervised warm start).
"""
