"""Advantage estimators: every one is (StepBatch, Config) -> Output, registered in ``ESTIMATORS``.

Each module registers its estimators with ``@register_estimator`` when it is imported; the
imports below are the built-ins, in the registry's order (baselines, then the BEPO family).
An estimator of your own registers the same way from your own module (docs/contributing.md).
"""

from .registry import (ESTIMATORS, Estimator, compute_advantages, estimator_settings, estimator_table, get_estimator,
                       make_config, parse_estimator_spec, parse_settings, register_estimator)
from .grpo import GRPOConfig, grpo, grpo_kernel
from .gigpo import GiGPOConfig, gigpo, gigpo_kernel
from .graphgpo import GraphGPOConfig, graphgpo, graphgpo_kernel
from .hgpo import HGPOConfig, hgpo, hgpo_kernel
from .g2po import G2POConfig, g2po, g2po_kernel
from .g2po_abstract import G2POAbstractConfig, g2po_abstract, g2po_abstract_kernel
from .proxmo import ProxMOConfig, proxmo, proxmo_kernel, tfidf_features
from .ecpo import ECPOConfig, ecpo, ecpo_kernel
from .ecpo_abstract import ECPOAbstractConfig, ecpo_abstract, ecpo_abstract_kernel
from .bepo import GatedBEPOConfig, gated_bepo, gated_bepo_kernel
from .ablations import (GAGPOConfig, bepo_additive, bepo_additive_kernel, bepo_mc, bepo_mc_kernel, bepo_nogate,
                        bepo_nogate_kernel, gagpo, gagpo_kernel)
from .pgpo import PGPOConfig, pgpo, pgpo_kernel
from .confidence import ConfidenceConfig, confidence_features, confidence_loss, confidence_returns, confidence_returns_kernel
from .common import max_states_for

__all__ = [
    "ESTIMATORS", "Estimator", "compute_advantages", "estimator_settings", "estimator_table", "get_estimator",
    "make_config", "parse_estimator_spec", "parse_settings", "register_estimator",
    "GRPOConfig", "grpo", "grpo_kernel",
    "GiGPOConfig", "gigpo", "gigpo_kernel",
    "GraphGPOConfig", "graphgpo", "graphgpo_kernel",
    "HGPOConfig", "hgpo", "hgpo_kernel",
    "G2POConfig", "g2po", "g2po_kernel", "G2POAbstractConfig", "g2po_abstract", "g2po_abstract_kernel",
    "ProxMOConfig", "proxmo", "proxmo_kernel", "tfidf_features",
    "ECPOConfig", "ecpo", "ecpo_kernel", "ECPOAbstractConfig", "ecpo_abstract", "ecpo_abstract_kernel",
    "GatedBEPOConfig", "gated_bepo", "gated_bepo_kernel",
    "GAGPOConfig", "gagpo", "gagpo_kernel", "PGPOConfig", "pgpo", "pgpo_kernel",
    "bepo_nogate", "bepo_nogate_kernel", "bepo_mc", "bepo_mc_kernel", "bepo_additive", "bepo_additive_kernel",
    "ConfidenceConfig", "ConfidenceHead", "confidence_features", "confidence_loss", "confidence_returns",
    "confidence_returns_kernel", "max_states_for",
]


def __getattr__(name):  # ConfidenceHead needs Flax: imported on first use, so the kernels load none
    if name == "ConfidenceHead":
        from .confidence_head import ConfidenceHead

        return ConfidenceHead
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
