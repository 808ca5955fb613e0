"""ECPO, Evidence-Calibrated Policy Optimization (Li, Zhou, Duan, Chen; arXiv 2606.05885), reconstructed.

Provenance: no code of the authors is public, and of the paper only its abstract and introduction
(and third-party summaries of them) could be read when this was written. What they state: the step
credit of GiGPO-style anchor states is re-grouped by *canonical action*, low-count action estimates
are *shrunk*, anchors *dominated by within-action noise are suppressed* by a variance gate, and the
result is added to GRPO's outcome advantage. The equations below are this project's reading of those
sentences, not the paper's; every choice they leave open is a field of ``ECPOConfig``
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

from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, UInt32

from .._config import check_choice, check_int, check_range, pytree_config
from ..graph import build_graph, count_distinct, dense_ids, graph_diagnostics, history_keys
from ..returns import discounted_returns
from ..stats import STD_DDOF, scale_deviation, segment_moments
from ..types import ECPOOutput, GraphDiagnostics, StepBatch
from .common import check_outcome_fields, entry_point, stop_gradient, with_sanitized_input
from .grpo import outcome_advantage
from .registry import register_estimator

GATES = ("ratio", "threshold", "none")
ANCHOR_MEANS = ("rows", "actions")
ACTION_SOURCES = ("auto", "action_key", "successor")


@pytree_config(static=("norm", "weighting", "std", "history", "gate", "anchor", "action_from"))
class ECPOConfig:
    """ECPO settings (a reconstruction: module docstring; the defaults are this project's choices).

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
        check_range("ECPOConfig", "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range("ECPOConfig", "omega", self.omega)
        check_range("ECPOConfig", "kappa", self.kappa, lo=0.0)
        check_choice("ECPOConfig", "gate", self.gate, GATES)
        check_range("ECPOConfig", "tau", self.tau, lo=0.0, hi=1.0)
        check_choice("ECPOConfig", "anchor", self.anchor, ANCHOR_MEANS)
        check_choice("ECPOConfig", "action_from", self.action_from, ACTION_SOURCES)
        check_int("ECPOConfig", "history", self.history, lo=0)
        check_outcome_fields("ECPOConfig", self)


def action_calibrated_credit(
    y: Float[Array, "K T"],
    state: Int[Array, "K T"],
    action: Int[Array, "K T"],
    mask: Bool[Array, "K T"],
    config: ECPOConfig,
) -> tuple[Float[Array, "K T"], Float[Array, "K T"], Bool[Array, "K T"]]:
    """(A^S, g_s, acting) per record of one group: the shrunk action advantage, its anchor's gate
    weight, and whether the anchor had two or more distinct actions. ``state`` and ``action`` are
    group-local ids in [0, K T) (``action`` numbers the distinct (state, action) pairs)."""
    n = mask.size
    valid = mask.reshape(n)
    s_id, a_id, yv = state.reshape(n), action.reshape(n), y.reshape(n)
    s_safe, a_safe = jnp.clip(s_id, 0, n - 1), jnp.clip(a_id, 0, n - 1)
    ma = segment_moments(yv, valid, a_id, n, ddof=0)
    ms = segment_moments(yv, valid, s_id, n, ddof=STD_DDOF[config.std])
    ybar_a, n_a = ma.mean[a_safe], ma.count[a_safe]
    if config.anchor == "rows":
        ybar_s = ms.mean[s_safe]
    else:
        inv = jnp.where(valid, 1.0 / jnp.maximum(n_a, 1.0), 0.0)
        num = jax.ops.segment_sum(ybar_a * inv, s_id, n)
        den = jax.ops.segment_sum(inv, s_id, n)
        ybar_s = (num / jnp.maximum(den, 1e-30))[s_safe]
    n_s = ms.count[s_safe]
    distinct = count_distinct(s_id, (a_id.astype(jnp.uint32),), valid, n)[s_safe]
    acting = valid & (distinct >= 2)
    dev = jnp.where(acting, ybar_a - ybar_s, 0.0)
    a_step = n_a / (n_a + config.kappa) * dev
    a_step = scale_deviation(a_step, ms.std[s_safe], norm=config.norm, eps=config.eps)
    between = jax.ops.segment_sum(jnp.where(valid, dev * dev, 0.0), s_id, n)[s_safe] / jnp.maximum(n_s, 1.0)
    within = jax.ops.segment_sum(jnp.where(valid, ma.dev * ma.dev, 0.0), s_id, n)[s_safe] / jnp.maximum(n_s, 1.0)
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


def _group(obs_key, reward, mask, outcome, penalty, action_key: Optional[UInt32[Array, "K T 2"]], config: ECPOConfig):
    a_ep = outcome_advantage(reward, penalty, mask, norm=config.norm, weighting=config.weighting,
                             std=config.std, eps=config.eps)
    graph = build_graph(history_keys(obs_key, config.history), mask, outcome)
    n = mask.size
    valid = mask.reshape(n)
    src = graph.state.reshape(n).astype(jnp.uint32)
    if action_key is None:  # the successor node stands for the action
        keys = (src, graph.succ.reshape(n).astype(jnp.uint32))
    else:
        ak = action_key.reshape(n, 2)
        keys = (src, ak[:, 0], ak[:, 1])
    pair, _ = dense_ids(keys, valid, pad_id=n + 3)
    y = discounted_returns(reward, mask, config.gamma) + penalty
    a_step, gate, acting = action_calibrated_credit(y, graph.state, pair.reshape(mask.shape), mask, config)
    adv = jnp.where(mask, a_ep + config.omega * gate * a_step, 0.0)
    diag = GraphDiagnostics(*graph_diagnostics(graph, acting & (gate > 0), 0, True))
    return adv, a_ep, a_step, gate, diag


def _uses_action_key(batch: StepBatch, config: ECPOConfig) -> bool:
    return config.action_from == "action_key" or (config.action_from == "auto" and batch.action_key is not None)


@with_sanitized_input
def ecpo_kernel(batch: StepBatch, config: ECPOConfig) -> ECPOOutput:
    """The jittable ECPO kernel (no host checks; invalid groups are dropped and flagged). With
    action_from="action_key" and no ``batch.action_key`` it falls back to the successor (the host
    entry point refuses that batch instead)."""
    action_key = batch.action_key if _uses_action_key(batch, config) else None
    fn = lambda o, r, m, c, p, a: _group(o, r, m, c, p, a, config)  # a None: an empty pytree per group
    adv, a_ep, a_step, gate, diag = jax.vmap(fn)(batch.obs_key, batch.reward, batch.mask, batch.outcome,
                                                 batch.penalty_or_zeros(), action_key)
    return stop_gradient(ECPOOutput(advantage=adv, a_episode=a_ep, a_step=a_step, gate=gate, diagnostics=diag))


_ecpo_jit = jax.jit(ecpo_kernel)


@register_estimator("ecpo", kernel=ecpo_kernel, config=ECPOConfig, output=ECPOOutput, graph=True,
                    definition="A^E + omega g_s n_sa/(n_sa + kappa)(ybar_sa - ybar_s): action means at equal-observation "
                               "anchors shrunk by their count, gated by the between-action share of the anchor's variance",
                    source="Li et al. 2026 (arXiv 2606.05885); reconstructed from its abstract (no code; equations "
                           "not reachable here)")
def ecpo(batch: StepBatch, config: ECPOConfig = ECPOConfig(), *, check: bool = True) -> ECPOOutput:
    """ECPO advantage as this project reconstructs it (module docstring); ``.advantage`` float32 [B, K, T]."""
    if config.action_from == "action_key" and batch.action_key is None:
        raise ValueError("ecpo: ECPOConfig.action_from='action_key' but the batch has no action_key; record the "
                         "actions (StepBatch(..., action_key=bepo_jax.action_keys(actions))) or use "
                         "action_from='auto' / 'successor'.")
    return entry_point(_ecpo_jit, batch, config, ECPOConfig, check=check)
