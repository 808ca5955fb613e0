"""The policy-gradient update: PPO loss, the sharded training step, checkpoints."""

from .loss import PPOLossConfig, ppo_loss
from .train_step import TrainConfig, TrainState, Trainer, make_optimizer

__all__ = ["PPOLossConfig", "ppo_loss", "TrainConfig", "TrainState", "Trainer", "make_optimizer"]
