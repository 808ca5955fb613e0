"""bepo_jax: critic-free, step-level credit assignment for LLM agents, in JAX.

Gated-BEPO (confidence-gated Bellman credit on the empirical state graph of each
group of K trajectories) and the baselines it is compared with, as jittable,
vmappable kernels. The numerics contract is docs/ in the repository
(data model, every estimator's equations and conventions, defaults, test vectors).
"""

from .credit import estimators as _estimators
from .credit.estimators import __all__ as _estimator_names

# the estimators' names, but ConfidenceHead (Flax): bepo_jax.ConfidenceHead imports it on first use
globals().update({_n: getattr(_estimators, _n) for _n in _estimator_names if _n != "ConfidenceHead"})
from .credit.builders import Trajectory, batch_from_trajectories
from .credit.hashing import hash_observation, hash_observations, hash_tokens, token_words
from .integrations.rows import RowIndex, from_rows, to_rows
from .credit.similarity import SimilarityConfig, merge_similar
from .credit.tokens import to_token_advantages
from .credit.types import (
    FAILURE,
    SUCCESS,
    TRUNCATED,
    DROPPED,
    INVALID_FLAGS,
    INVALID_MASK,
    INVALID_OUTCOME,
    INVALID_PENALTY,
    INVALID_SCALE,
    INVALID_VALUE,
    SCALE_LIMIT,
    SINGLE_TRAJECTORY,
    ConfidenceOutput,
    G2POOutput,
    GatedBEPOOutput,
    GiGPOOutput,
    GraphDiagnostics,
    GraphGPOOutput,
    GRPOOutput,
    StepBatch,
    check_batch,
    group_flags,
    sanitize,
    split_key64,
)

from ._version import __version__

__all__ = [
    "StepBatch", "SUCCESS", "FAILURE", "TRUNCATED", "check_batch", "split_key64",
    "group_flags", "sanitize", "INVALID_FLAGS", "INVALID_OUTCOME", "INVALID_MASK", "INVALID_VALUE", "INVALID_PENALTY",
    "INVALID_SCALE", "SCALE_LIMIT", "SINGLE_TRAJECTORY", "DROPPED",
    "GRPOOutput", "GiGPOOutput", "GraphGPOOutput", "G2POOutput", "GatedBEPOOutput", "ConfidenceOutput", "GraphDiagnostics",
    *_estimator_names,
    "hash_observation", "hash_observations", "hash_tokens", "token_words", "to_token_advantages",
    "Trajectory", "batch_from_trajectories", "RowIndex", "from_rows", "to_rows", "SimilarityConfig", "merge_similar",
    "__version__",
]


def __getattr__(name):  # ConfidenceHead (Flax) on first use: bepo_jax.credit.estimators loads it
    if name == "ConfidenceHead":
        return _estimators.ConfidenceHead
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
