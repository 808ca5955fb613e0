"""Advantage estimators: every one is (StepBatch, Config) -> Output."""

from .bepo import GatedBEPOConfig, gated_bepo, gated_bepo_kernel
from .gigpo import GiGPOConfig, gigpo, gigpo_kernel, step_group_advantage
from .grpo import GRPOConfig, grpo, grpo_kernel, outcome_advantage

__all__ = [
    "GRPOConfig", "grpo", "grpo_kernel", "outcome_advantage",
    "GiGPOConfig", "gigpo", "gigpo_kernel", "step_group_advantage",
    "GatedBEPOConfig", "gated_bepo", "gated_bepo_kernel",
]
