"""bepo_jax: critic-free, step-level credit assignment for LLM agents, in JAX.

Gated-BEPO (confidence-gated Bellman credit on the empirical state graph of each
group of K trajectories) and the baselines it is compared with, as jittable,
vmappable kernels. See SPEC.md sections 1-6 for the numerics contract.
"""

from .estimators import (
    GatedBEPOConfig,
    GiGPOConfig,
    GRPOConfig,
    gated_bepo,
    gated_bepo_kernel,
    gigpo,
    gigpo_kernel,
    grpo,
    grpo_kernel,
)
from .hashing import hash_observation, hash_observations, hash_tokens
from .tokens import to_token_advantages
from .types import (
    FAILURE,
    SUCCESS,
    TRUNCATED,
    GatedBEPOOutput,
    GiGPOOutput,
    GRPOOutput,
    StepBatch,
    check_batch,
    split_key64,
)

__version__ = "0.1.0"

__all__ = [
    "StepBatch", "SUCCESS", "FAILURE", "TRUNCATED", "check_batch", "split_key64",
    "GRPOConfig", "GRPOOutput", "grpo", "grpo_kernel",
    "GiGPOConfig", "GiGPOOutput", "gigpo", "gigpo_kernel",
    "GatedBEPOConfig", "GatedBEPOOutput", "gated_bepo", "gated_bepo_kernel",
    "hash_observation", "hash_observations", "hash_tokens", "to_token_advantages",
    "__version__",
]
