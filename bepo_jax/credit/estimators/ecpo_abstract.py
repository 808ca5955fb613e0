"""ECPO as reconstructed from its abstract alone (``ecpo_abstract``; Li, Zhou, Duan, Chen; arXiv 2606.05885).

Kept under this name because stored results (the credit lab, the diagnostic protocol, the rivals
experiment of docs/results.md) were computed with it before the paper's equations were read;
``ecpo`` is now the estimator from the equations that summaries of the paper give (``estimators/ecpo.py``).

Provenance: no code of the authors is public, and of the paper only its abstract and introduction
(and third-party summaries of them) could be read when this was written. What they state: the step
credit of GiGPO-style anchor states is re-grouped by *canonical action*, low-count action estimates
are *shrunk*, anchors *dominated by within-action noise are suppressed* by a variance gate, and the
result is added to GRPO's outcome advantage. The equations below are this project's reading of those
sentences, not the paper's; every choice they leave open is a field of ``ECPOAbstractConfig``
(docs/estimators.md, ECPO, lists them). Do not quote numbers from this estimator as the paper's method.

Per group, with anchor states s (records with equal ``obs_key``; ``history`` > 0: equal last
``history`` + 1 observations), the step return y_i = G_i + p_i (G_i the discounted return, p_i the
record's penalty, as GiGPO), and action groups (s, a) (records at s with equal action key a):

    n_s, n_sa            records at s, at (s, a)
    ybar_sa              mean of y over (s, a)
    ybar_s               mean of y over s (anchor="rows") or of ybar_sa over the distinct a (anchor="actions")

Evidence-calibrated action advantage (shrink ybar_sa toward ybar_s with prior strength kappa):

    A^S_i = n_sa / (n_sa + kappa) * (ybar_sa - ybar_s)            [/ (sigma_s + eps), norm="mean_std"]

Variance gate (between-action share of the anchor's variance, the correlation ratio):

    B_s = (1/n_s) sum_{i in s} (ybar_{s a_i} - ybar_s)^2,   W_s = (1/n_s) sum_{i in s} (y_i - ybar_{s a_i})^2
    rho_s = B_s / (B_s + W_s)   (0 when B_s + W_s = 0 or fewer than two distinct actions were taken at s)
    g_s = rho_s (gate="ratio"), 1[rho_s >= tau] (gate="threshold"), 1 (gate="none")

    A_i = A^E_i + omega * g_{s_i} * A^S_i        (A^E: GRPO's outcome advantage, docs/estimators.md)

An anchor with one record or one distinct action gets A^S = 0. The action key is
``StepBatch.action_key`` (``action_keys``: the canonical action text, hashed); without one
(``action_from="auto"``) the record's successor node stands for its action (the next state, or the
END node of its outcome): in deterministic worlds an action and its result are the same evidence.
"""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ..configs import check_choice, check_int, check_range, pytree_config
from ..graph import count_distinct
from ..stats import STD_DDOF, scale_deviation, segment_moments
from ..types import StepBatch
from .common import check_outcome_fields, estimator_entry
from .ecpo import (ACTION_SOURCES, ANCHOR_MEANS, ECPOOutput, action_credit_kernel, anchor_action_moments,
                   refuse_missing_action_key)

GATES = ("ratio", "threshold", "none")


@pytree_config(static=("norm", "weighting", "std", "history", "gate", "anchor", "action_from"))
class ECPOAbstractConfig:
    """The abstract-based ECPO's settings (a reconstruction: module docstring; the defaults are this project's choices).

    gamma: discount of the step return y = G + p, in [0, 1] (0.95, as GiGPO).
    omega: weight of the gated step term (1.0).
    kappa: prior strength of the shrinkage, >= 0 (1.0: an action seen once keeps half its deviation;
      0 switches the shrinkage off).
    gate: "ratio" (default: weight rho_s), "threshold" (1 when rho_s >= tau) or "none".
    tau: the threshold of gate="threshold", in [0, 1] (0.5).
    anchor: the anchor mean ybar_s over "rows" (default) or over the distinct "actions".
    action_from: "auto" (default: ``StepBatch.action_key`` when the batch has one, else the
      successor), "action_key" (required; a batch without one is refused) or "successor".
    norm / weighting / std / eps: the outcome term's normalisation (docs/estimators.md, outcome
      advantage; defaults mean, step, unbiased, 1e-6); norm="mean_std" also divides A^S by the
      anchor's std of y.
    history: anchors on the last ``history`` + 1 observations (0: the observation alone).
    """

    gamma: float = 0.95
    omega: float = 1.0
    kappa: float = 1.0
    gate: str = "ratio"
    tau: float = 0.5
    anchor: str = "rows"
    action_from: str = "auto"
    norm: str = "mean"
    weighting: str = "step"
    std: str = "unbiased"
    eps: float = 1e-6
    history: int = 0

    def __post_init__(self):
        check_range("ECPOAbstractConfig", "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range("ECPOAbstractConfig", "omega", self.omega)
        check_range("ECPOAbstractConfig", "kappa", self.kappa, lo=0.0)
        check_choice("ECPOAbstractConfig", "gate", self.gate, GATES)
        check_range("ECPOAbstractConfig", "tau", self.tau, lo=0.0, hi=1.0)
        check_choice("ECPOAbstractConfig", "anchor", self.anchor, ANCHOR_MEANS)
        check_choice("ECPOAbstractConfig", "action_from", self.action_from, ACTION_SOURCES)
        check_int("ECPOAbstractConfig", "history", self.history, lo=0)
        check_outcome_fields("ECPOAbstractConfig", self)


def action_calibrated_credit(
    y: Float[Array, "K T"],
    state: Int[Array, "K T"],
    action: Int[Array, "K T"],
    mask: Bool[Array, "K T"],
    config: ECPOAbstractConfig,
) -> tuple[Float[Array, "K T"], Float[Array, "K T"], Bool[Array, "K T"]]:
    """(A^S, g_s, acting) per record of one group: the shrunk action advantage, its anchor's gate
    weight, and whether the anchor had two or more distinct actions. ``state`` and ``action`` are
    group-local ids in [0, K T) (``action`` numbers the distinct (state, action) pairs)."""
    n = mask.size
    valid = mask.reshape(n)
    s_id, a_id, yv = state.reshape(n), action.reshape(n), y.reshape(n)
    s_safe = jnp.clip(s_id, 0, n - 1)
    ybar_a, n_a, ybar_s, n_s, within_dev = anchor_action_moments(yv, s_id, a_id, valid, n, config.anchor)
    anchor_std = segment_moments(yv, valid, s_id, n, ddof=STD_DDOF[config.std]).std[s_safe]
    distinct = count_distinct(s_id, (a_id.astype(jnp.uint32),), valid, n)[s_safe]
    acting = valid & (distinct >= 2)
    dev = jnp.where(acting, ybar_a - ybar_s, 0.0)
    a_step = n_a / (n_a + config.kappa) * dev
    a_step = scale_deviation(a_step, anchor_std, norm=config.norm, eps=config.eps)
    between = jax.ops.segment_sum(jnp.where(valid, dev * dev, 0.0), s_id, n)[s_safe] / jnp.maximum(n_s, 1.0)
    within = jax.ops.segment_sum(jnp.where(valid, within_dev * within_dev, 0.0), s_id, n)[s_safe] / jnp.maximum(n_s, 1.0)
    total = between + within
    rho = jnp.where(acting & (total > 0), between / jnp.where(total > 0, total, 1.0), 0.0)
    if config.gate == "ratio":
        gate = rho
    elif config.gate == "threshold":
        gate = (acting & (rho >= config.tau)).astype(jnp.float32)
    else:
        gate = acting.astype(jnp.float32)
    a_step = jnp.where(acting, a_step, 0.0)
    shape = mask.shape
    return a_step.reshape(shape), jnp.where(valid, gate, 0.0).reshape(shape), acting.reshape(shape)


ecpo_abstract_kernel = action_credit_kernel(action_calibrated_credit, "ecpo_abstract")
@estimator_entry("ecpo_abstract", kernel=ecpo_abstract_kernel, config=ECPOAbstractConfig, output=ECPOOutput, graph=True,
                    definition="A^E + omega g_s n_sa/(n_sa + kappa)(ybar_sa - ybar_s): action means at equal-observation "
                               "anchors shrunk by their count, gated by the between-action share of the anchor's variance",
                    source="Li et al. 2026 (arXiv 2606.05885); reconstructed from its abstract before its equations were "
                           "read (kept for the stored results; ecpo follows the equations summaries of the paper give)",
                 host_check=functools.partial(refuse_missing_action_key, "ecpo_abstract"))
def ecpo_abstract(batch: StepBatch, config: ECPOAbstractConfig = ECPOAbstractConfig(), *, check: bool = True) -> ECPOOutput:
    """The abstract-based ECPO advantage as this project reconstructed it (module docstring); ``.advantage`` float32 [B, K, T]."""
