"""One registry for every estimator: ``ESTIMATORS[name]`` and ``compute_advantages``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Mapping

from ..types import StepBatch
from .ablations import (GAGPOConfig, bepo_additive, bepo_additive_kernel, bepo_mc, bepo_mc_kernel, bepo_nogate,
                        bepo_nogate_kernel, gagpo, gagpo_kernel)
from .bepo import GatedBEPOConfig, gated_bepo, gated_bepo_kernel
from .confidence import ConfidenceConfig, confidence_returns, confidence_returns_kernel
from .g2po import G2POConfig, g2po, g2po_kernel
from .gigpo import GiGPOConfig, gigpo, gigpo_kernel
from .graphgpo import GraphGPOConfig, graphgpo, graphgpo_kernel
from .grpo import GRPOConfig, grpo, grpo_kernel
from .hgpo import HGPOConfig, hgpo, hgpo_kernel


@dataclasses.dataclass(frozen=True)
class Estimator:
    """A registered estimator: host entry ``fn``, jittable ``kernel``, its config type."""

    name: str
    fn: Callable
    kernel: Callable
    config_type: type
    definition: str
    source: str
    graph: bool  # whether it builds the state graph (and takes ``history``)


_ENTRIES = [
    Estimator("grpo", grpo, grpo_kernel, GRPOConfig,
              "group-normalised outcome: (S_i - mu) / (sigma + eps)", "Shao et al. 2024; verl-agent", False),
    Estimator("gigpo", gigpo, gigpo_kernel, GiGPOConfig,
              "A^E + omega A^S, step groups of equal observations", "Feng et al. 2025, arXiv 2505.10978; verl-agent", True),
    Estimator("graphgpo", graphgpo, graphgpo_kernel, GraphGPOConfig,
              "step return 10 omega_g^d(s') (or ^(d(s')-d(s)+1)) from shortest paths to SUCCESS, normalised in step groups, + A^E",
              "Cheng et al. 2026 (GraphGPO)", True),
    Estimator("hgpo", hgpo, hgpo_kernel, HGPOConfig,
              "weighted mean over history levels k of step-return advantages in groups of equal last-k observations",
              "He et al. 2026 (HGPO); verl-agent HGPO recipe", True),
    Estimator("gagpo", gagpo, gagpo_kernel, GAGPOConfig,
              "A_out + w GAE(TD residuals of per-state MC means), no gate", "Zhu et al. 2026 (GAGPO)", True),
    Estimator("g2po", g2po, g2po_kernel, G2POConfig,
              "beta_G (delta_e - mu_E) / sigma_E + beta_E A^E: TD errors of edges (s, s') with V = per-state MC means, "
              "standardised over the group's edges", "Wang et al. 2026, arXiv 2606.22995 (from its abstract)", True),
    Estimator("gated_bepo", gated_bepo, gated_bepo_kernel, GatedBEPOConfig,
              "eta A_out + w rho GAE(TD residuals of the mean-backup fixed point)", "arXiv 2608.06861", True),
    Estimator("bepo_nogate", bepo_nogate, bepo_nogate_kernel, GatedBEPOConfig,
              "Gated-BEPO with rho = 1 everywhere", "ablation, arXiv 2608.06861", True),
    Estimator("bepo_mc", bepo_mc, bepo_mc_kernel, GatedBEPOConfig,
              "Gated-BEPO with V = MC means (no fixed point)", "ablation, arXiv 2608.06861", True),
    Estimator("bepo_additive", bepo_additive, bepo_additive_kernel, GatedBEPOConfig,
              "Gated-BEPO with eta_gated = 1", "ablation, arXiv 2608.06861", True),
    Estimator("confidence_returns", confidence_returns, confidence_returns_kernel, ConfidenceConfig,
              "R_t = r_t + c_t gamma R_{t+1} minus the fixed-point value", "a blog reading of the paper (docs/estimators.md)", True),
]

ESTIMATORS: Mapping[str, Estimator] = {e.name: e for e in _ENTRIES}


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; valid names: {', '.join(ESTIMATORS)}.")
    return ESTIMATORS[name]


def make_config(name: str, config: Any = None, **overrides):
    """The estimator's config: ``config`` (an instance or a plain dict) or the defaults, plus overrides."""
    est = get_estimator(name)
    if config is None:
        config = est.config_type()
    elif isinstance(config, Mapping):
        config = est.config_type.from_dict(dict(config))
    elif not isinstance(config, est.config_type):
        raise ValueError(f"estimator {name!r} takes a {est.config_type.__name__}, got {type(config).__name__}.")
    return config.replace(**overrides) if overrides else config


def parse_estimator_spec(text: str) -> tuple[str, str, dict]:
    """One estimator setting as text, the grammar every command shares: ``NAME`` or
    ``LABEL=NAME:field=value:field=value`` (values read as JSON, else kept as strings), e.g.
    ``lam0=gated_bepo:lam=0:eta_gated=1``. Returns ``(label, name, overrides)``; the name and
    the fields are validated here (an unknown one raises, listing the valid ones)."""
    head, *fields = text.strip().split(":")
    label, _, name = head.partition("=")
    label, name = label.strip(), (name or label).strip()
    if not label:
        raise ValueError(f"estimator spec {text!r} is empty; write NAME or LABEL=NAME:field=value "
                         "(e.g. lam0=gated_bepo:lam=0).")
    over = {}
    for item in fields:
        if "=" not in item:
            raise ValueError(f"estimator spec {text!r}: write LABEL=NAME:field=value:field=value "
                             "(e.g. lam0=gated_bepo:lam=0).")
        k, v = item.split("=", 1)
        try:
            over[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            over[k.strip()] = v
    make_config(name, **over)
    return label, name, over


def compute_advantages(name: str, batch: StepBatch, config: Any = None, *, check: bool = True, **overrides):
    """Run estimator ``name`` on ``batch``.

    ``compute_advantages("gated_bepo", batch, lam=0.3)`` — config fields may be given as
    keyword overrides or as ``config`` (an instance or a dict); unknown names and
    fields raise a ValueError listing the valid ones.
    """
    est = get_estimator(name)
    return est.fn(batch, make_config(name, config, **overrides), check=check)
