"""GAGPO and the Gated-BEPO ablations (docs/estimators.md), all on the Gated-BEPO kernel.

| name            | change to Gated-BEPO                                                  |
|-----------------|-----------------------------------------------------------------------|
| ``bepo_nogate`` | rho = 1 at every record (uniform fixed-weight fusion)                  |
| ``bepo_mc``     | V = the Monte-Carlo initialisation, no sweeps (isolates the fixed point) |
| ``bepo_additive`` | eta_gated = 1 (no outcome reduction at gated states)                 |
| ``gagpo``       | V = MC means, GAE of the TD residuals, no gate: A = A_out + w A_FP     |
|                 | (A_FP in reward units; ``fp_scale="std"`` rescales it)                  |

GAGPO (Zhu et al. 2026) builds a group return proxy and propagates it with TD/GAE;
docs/estimators.md fixes its proxy as the per-state mean of the Monte-Carlo returns.
"""

from __future__ import annotations

import dataclasses

from ..configs import check_choice, check_int, check_range, pytree_config
from ..types import StepBatch
from .bepo import GatedBEPOConfig, GatedBEPOOutput, bepo_batch
from .common import check_outcome_fields, estimator_entry, stop_gradient


def _ablation(name: str, doc: str, *, definition: str, gate_all: bool = False, **forced):
    """An ablation of Gated-BEPO: its kernel (``bepo_batch`` with ``forced`` config fields, every record
    gated when ``gate_all``) and its registered host entry (``estimator_entry``)."""
    def kernel(batch: StepBatch, config: GatedBEPOConfig) -> GatedBEPOOutput:
        cfg = dataclasses.replace(config, **forced) if forced else config
        return stop_gradient(bepo_batch(batch, cfg, gate_all=gate_all))

    def signature(batch: StepBatch, config: GatedBEPOConfig = GatedBEPOConfig(), *,
                  check: bool = True) -> GatedBEPOOutput:
        """The ablation's host entry."""

    for fn, suffix in ((kernel, "_kernel"), (signature, "")):
        fn.__name__ = fn.__qualname__ = name + suffix
        fn.__doc__ = doc + ("\n\nThe jittable kernel (no host checks)." if suffix else
                            "\n\nTakes a GatedBEPOConfig; returns a GatedBEPOOutput.")
    entry = estimator_entry(name, kernel=kernel, config=GatedBEPOConfig, output=GatedBEPOOutput, graph=True,
                            definition=definition, source="ablation of arXiv 2608.06861")(signature)
    return entry, kernel


bepo_nogate, bepo_nogate_kernel = _ablation(
    "bepo_nogate", "Gated-BEPO with rho = 1 everywhere: A = eta_gated A_out + w A_FP at every record.", gate_all=True,
    definition="Gated-BEPO with rho = 1 everywhere (uniform fixed-weight fusion)")
# With max_iters = 0 the solver only checks whether V^0 is a fixed point (one sweep):
# the O(records) sparse sweep, not an [S, S] matrix.
bepo_mc, bepo_mc_kernel = _ablation(
    "bepo_mc", "Gated-BEPO with V = the Monte-Carlo means (max_iters = 0): isolates the fixed point.", max_iters=0,
    solver="sparse", max_states=0, definition="Gated-BEPO with V = the Monte-Carlo initialisation (no fixed point)")
bepo_additive, bepo_additive_kernel = _ablation(
    "bepo_additive", "Gated-BEPO with eta_gated = 1: the outcome credit is not reduced at gated states.", eta_gated=1.0,
    definition="Gated-BEPO with eta_gated = 1 (no outcome reduction)")


@pytree_config(static=("norm", "weighting", "std", "history", "fp_scale"))
class GAGPOConfig:
    """GAGPO settings: A = A_out + w A_FP.

    gamma: discount (0.95). lam: GAE lambda (0.95, the usual GAE default) [reconstructed].
    w: weight of the temporal term (1.0).
    norm, weighting, std, eps: the outcome term's, as GRPO.
    fp_scale: "none" (default; the definition: A_FP in reward units) or "std" (divide
      A_FP by its std over the group's records, as Gated-BEPO does under mean_std).
    history: history-aware state keys (0 = the observation alone).
    """

    gamma: float = 0.95
    lam: float = 0.95
    w: float = 1.0
    norm: str = "mean_std"
    weighting: str = "step"
    std: str = "unbiased"
    eps: float = 1e-6
    history: int = 0
    fp_scale: str = "none"

    def __post_init__(self):
        name = "GAGPOConfig"
        check_choice(name, "fp_scale", self.fp_scale, ("none", "std"))
        check_range(name, "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range(name, "lam", self.lam, lo=0.0, hi=1.0)
        check_range(name, "w", self.w)
        check_outcome_fields(name, self)
        check_int(name, "history", self.history, lo=0)

    def as_bepo(self) -> GatedBEPOConfig:
        """The Gated-BEPO settings GAGPO runs with (MC values, eta = 1; the gate is forced on)."""
        return GatedBEPOConfig(gamma=self.gamma, lam=self.lam, w=self.w, eta_gated=1.0, norm=self.norm,
                               weighting=self.weighting, std=self.std, eps=self.eps, max_iters=0,
                               solver="sparse", history=self.history)


def gagpo_kernel(batch: StepBatch, config: GAGPOConfig) -> GatedBEPOOutput:
    """The jittable GAGPO kernel on a validated batch (no host checks)."""
    return stop_gradient(bepo_batch(batch, config.as_bepo(), gate_all=True, rescale=config.fp_scale == "std"))


@estimator_entry("gagpo", kernel=gagpo_kernel, config=GAGPOConfig, output=GatedBEPOOutput, graph=True,
                 definition="A_out + w GAE(TD residuals of per-state Monte-Carlo means), no gate",
                 source="Zhu et al. 2026")
def gagpo(batch: StepBatch, config: GAGPOConfig = GAGPOConfig(), *, check: bool = True) -> GatedBEPOOutput:
    """GAGPO: A = A_out + w GAE(delta) with V = per-state MC means (docs/estimators.md)."""
