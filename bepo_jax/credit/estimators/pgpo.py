"""PGPO (arXiv 2609.02236): a one-step TD residual on the group's Monte-Carlo state means.

Provenance (docs/estimators.md, provenance table): neither the paper nor code could be read here;
this is the method as a summary states it, and every choice the summary leaves open is a config
field whose default is this project's, marked [ours].

Per group, with the group's state graph (identical observations merged across the K trajectories;
``history`` > 0: equal last ``history`` + 1 observations), the edge reward r_i = reward_i + penalty_i
and the discounted return G_i = sum_l gamma^l r_{t+l}:

    Phi(s)   = mean of G over the records at s           (the anchor group's Monte-Carlo mean return)
    Phi(END) = 0
    delta_i  = r_i + gamma Phi(s'_i) - Phi(s_i)          (s'_i the record's successor)
    A_i      = A_GRPO,i + omega delta_i                   (delta in reward units [ours];
                                                          step_scale="std" divides it by its std
                                                          over the group's records, norm="mean_std")

It is the ladder's MC rung without the fixed point, the gate or GAE: GAGPO with lambda = 0, and
``bepo_mc`` with rho = 1 everywhere, lambda = 0 and eta = 1. It runs on the Gated-BEPO kernel with
those settings, and tests/credit/test_pgpo.py checks it against a record loop written from the
equations above.
"""

from __future__ import annotations


from ..configs import check_choice, check_int, check_range, pytree_config
from ..types import StepBatch
from .bepo import GatedBEPOConfig, GatedBEPOOutput, bepo_batch
from .common import check_outcome_fields, estimator_entry, stop_gradient


@pytree_config(static=("norm", "weighting", "std", "history", "step_scale"))
class PGPOConfig:
    """PGPO settings: A = A_GRPO + omega (r + gamma Phi(s') - Phi(s)).

    gamma: discount of the returns and of Phi(s'), in [0, 1] (0.95 [ours], GiGPO's).
    omega: weight of the TD term (1.0 [ours]).
    step_scale: "none" (default: delta in reward units) or "std" (delta over its std across the
      group's records, as Gated-BEPO's mean_std does, with its rule that a spread within float
      residue is not divided; needs norm="mean_std").
    norm / weighting / std / eps: GRPO's outcome term (docs/estimators.md, outcome advantage).
    history: history-aware state keys (0: the observation alone).
    """

    gamma: float = 0.95
    omega: float = 1.0
    step_scale: str = "none"
    norm: str = "mean_std"
    weighting: str = "step"
    std: str = "unbiased"
    eps: float = 1e-6
    history: int = 0

    def __post_init__(self):
        name = "PGPOConfig"
        check_range(name, "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range(name, "omega", self.omega)
        check_choice(name, "step_scale", self.step_scale, ("none", "std"))
        if self.step_scale == "std" and self.norm != "mean_std":
            raise ValueError(f"{name}: step_scale='std' divides delta by its std as norm='mean_std' divides the "
                             f"outcome term; with norm={self.norm!r} set step_scale='none' (or norm='mean_std').")
        check_outcome_fields(name, self)
        check_int(name, "history", self.history, lo=0)

    def as_bepo(self) -> GatedBEPOConfig:
        """The Gated-BEPO settings PGPO runs with: MC values (no sweeps), lambda = 0, eta = 1, gate forced on."""
        return GatedBEPOConfig(gamma=self.gamma, lam=0.0, w=self.omega, eta_gated=1.0, norm=self.norm,
                               weighting=self.weighting, std=self.std, eps=self.eps, max_iters=0,
                               solver="sparse", max_states=0, history=self.history)


def pgpo_kernel(batch: StepBatch, config: PGPOConfig) -> GatedBEPOOutput:
    """The jittable PGPO kernel on a validated batch (no host checks)."""
    return stop_gradient(bepo_batch(batch, config.as_bepo(), gate_all=True, rescale=config.step_scale == "std"))


@estimator_entry("pgpo", kernel=pgpo_kernel, config=PGPOConfig, output=GatedBEPOOutput, graph=True,
                    definition="A_GRPO + omega (r + gamma Phi(s') - Phi(s)), Phi the per-state Monte-Carlo mean return",
                    source="arXiv 2609.02236, as a summary states it (paper not readable here; gamma, omega, "
                           "scale ours)")
def pgpo(batch: StepBatch, config: PGPOConfig = PGPOConfig(), *, check: bool = True) -> GatedBEPOOutput:
    """PGPO advantage (module docstring); ``.advantage`` float32 [B, K, T]."""
