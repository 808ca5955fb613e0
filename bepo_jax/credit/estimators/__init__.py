"""Advantage estimators: every one is (StepBatch, Config) -> Output, listed in ``ESTIMATORS``."""

from .ablations import (GAGPOConfig, bepo_additive, bepo_additive_kernel, bepo_mc, bepo_mc_kernel, bepo_nogate,
                        bepo_nogate_kernel, gagpo, gagpo_kernel)
from .bepo import GatedBEPOConfig, gated_bepo, gated_bepo_kernel
from .confidence import (ConfidenceConfig, confidence_features, confidence_loss,
                         confidence_returns, confidence_returns_kernel)
from .g2po import G2POConfig, g2po, g2po_kernel
from .gigpo import GiGPOConfig, gigpo, gigpo_kernel, step_group_advantage
from .graphgpo import GraphGPOConfig, graphgpo, graphgpo_kernel
from .grpo import GRPOConfig, grpo, grpo_kernel, outcome_advantage
from .hgpo import HGPOConfig, hgpo, hgpo_kernel
from ._common import max_states_for
from .registry import ESTIMATORS, Estimator, compute_advantages, get_estimator, make_config, parse_estimator_spec

__all__ = [
    "GRPOConfig", "grpo", "grpo_kernel", "outcome_advantage",
    "GiGPOConfig", "gigpo", "gigpo_kernel", "step_group_advantage",
    "GraphGPOConfig", "graphgpo", "graphgpo_kernel",
    "HGPOConfig", "hgpo", "hgpo_kernel",
    "GAGPOConfig", "gagpo", "gagpo_kernel",
    "G2POConfig", "g2po", "g2po_kernel",
    "GatedBEPOConfig", "gated_bepo", "gated_bepo_kernel",
    "bepo_nogate", "bepo_nogate_kernel", "bepo_mc", "bepo_mc_kernel", "bepo_additive", "bepo_additive_kernel",
    "ConfidenceConfig", "ConfidenceHead", "confidence_features", "confidence_loss", "confidence_returns",
    "confidence_returns_kernel",
    "ESTIMATORS", "Estimator", "compute_advantages", "get_estimator", "make_config", "max_states_for",
    "parse_estimator_spec",
]


def __getattr__(name):  # ConfidenceHead needs Flax: imported on first use, so the kernels load none
    if name == "ConfidenceHead":
        from .confidence_head import ConfidenceHead

        return ConfidenceHead
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
