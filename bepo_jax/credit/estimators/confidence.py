"""Confidence-discounted returns (docs/estimators.md; a blog reading of the paper). Never the default.

    R_t = r_t + c_t gamma R_{t+1},     A_t = R_t - V(s_t)

with V the Gated-BEPO fixed-point value of the record's state (a critic-free
baseline) and c_t in (0, 1) a confidence that the future beyond step t is worth
trusting. ``confidence`` picks c:

* ``"constant"`` — c_t = c (default 0.7);
* ``"gate"``     — c_t = 1 at gated (branching) states, c elsewhere [reconstructed:
  the graph has evidence about the future only where several successors were seen];
* ``"given"``    — c_t passed in, e.g. from ``ConfidenceHead`` (a small Flax NNX MLP
  with a sigmoid output whose bias starts at logit(0.7)), trained with
  ``confidence_loss``: binary cross-entropy of c_t against the trajectory's success,
  minus an entropy bonus that keeps c away from 0 and 1 [reconstructed: the seed
  says only "trained on the group outcome, entropy regulariser"].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..configs import check_choice, check_range, pytree_config
from ..returns import discounted_cumsum
from ..types import SUCCESS, GraphDiagnostics, PerRecord, StepBatch, pytree_dataclass
from .common import check_graph_fields, entry_point, with_sanitized_input
from .registry import register_estimator
from .bepo import GatedBEPOConfig, bepo_batch_sanitized

@pytree_dataclass
class ConfidenceOutput:
    """Confidence-discounted returns (docs/estimators.md): ``advantage`` = R_t - V(s_t)."""

    advantage: PerRecord
    returns: PerRecord
    baseline: PerRecord
    confidence: PerRecord
    diagnostics: GraphDiagnostics


CONFIDENCE_SOURCES = ("constant", "gate", "given")
_C_MIN = float(np.finfo(np.float32).epsneg)  # 2**-24: 1 - _C_MIN is the largest float32 below 1


@pytree_config(static=("confidence", "gate_on", "solver", "history", "max_states"))
class ConfidenceConfig:
    """Confidence-discounted returns settings.

    gamma: discount (0.95). c: the constant confidence, in the open interval (0, 1) (0.7).
    confidence: "constant" (default), "gate" or "given" (module docstring).
    min_successors, gate_on, tol, max_iters, solver, history, max_states: the
      fixed-point baseline's graph settings, as Gated-BEPO.
    """

    gamma: float = 0.95
    c: float = 0.7
    confidence: str = "constant"
    min_successors: int = 2
    gate_on: str = "successor"
    tol: float = 1e-6
    max_iters: int = 1000
    solver: str = "dense"
    history: int = 0
    max_states: int = 0

    def __post_init__(self):
        name = "ConfidenceConfig"
        check_range(name, "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range(name, "c", self.c, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        check_choice(name, "confidence", self.confidence, CONFIDENCE_SOURCES)
        check_graph_fields(name, self)

    def as_bepo(self) -> GatedBEPOConfig:
        return GatedBEPOConfig(gamma=self.gamma, min_successors=self.min_successors, gate_on=self.gate_on,
                               tol=self.tol, max_iters=self.max_iters, solver=self.solver, history=self.history,
                               max_states=self.max_states)


@with_sanitized_input
def confidence_returns_kernel(batch: StepBatch, config: ConfidenceConfig,
                              confidence: Float[Array, "B K T"] | None = None) -> ConfidenceOutput:
    """The jittable kernel on a validated batch (no host checks)."""
    base = bepo_batch_sanitized(batch, config.as_bepo())  # the wrapper sanitized the batch once
    mask = batch.mask
    if config.confidence == "constant":
        conf = jnp.full(mask.shape, config.c, jnp.float32)
    elif config.confidence == "gate":
        conf = jnp.where(base.gate, 1.0, config.c)
    else:
        conf = jnp.asarray(confidence, jnp.float32)
    conf = jnp.where(mask, conf, 0.0)
    r = jnp.where(mask, batch.reward + batch.penalty_or_zeros(), 0.0)
    # R_t = r_t + (c_t gamma) R_{t+1}
    ret = discounted_cumsum(r, mask, conf * config.gamma)
    adv = jnp.where(mask, ret - base.value, 0.0)
    out = ConfidenceOutput(advantage=adv, returns=ret, baseline=base.value, confidence=conf,
                           diagnostics=base.diagnostics)
    return jax.tree_util.tree_map(jax.lax.stop_gradient, out)


_confidence_jit = jax.jit(confidence_returns_kernel)


@register_estimator("confidence_returns", kernel=confidence_returns_kernel, config=ConfidenceConfig,
                    output=ConfidenceOutput, graph=True, lab=False,
                    definition="R_t = r_t + c_t gamma R_{t+1} minus the fixed-point value; c constant, the gate, or a "
                               "learned `ConfidenceHead`",
                    source="a blog reading of the paper (docs/estimators.md)")
def confidence_returns(batch: StepBatch, config: ConfidenceConfig = ConfidenceConfig(),
                       confidence: Float[Array, "B K T"] | None = None, *, check: bool = True) -> ConfidenceOutput:
    """Confidence-discounted returns minus the fixed-point baseline (docs/estimators.md).

    Batch and config checks, and the automatic state bucket, are ``entry_point``'s."""
    if isinstance(config, ConfidenceConfig) and config.confidence == "given":
        if confidence is None:
            raise ValueError('ConfidenceConfig.confidence="given" needs the confidence array [B, K, T] '
                             "(e.g. from ConfidenceHead); pass confidence=...")
        if tuple(np.shape(confidence)) != tuple(np.shape(batch.mask)):
            raise ValueError(f"confidence has shape {tuple(np.shape(confidence))}, expected {tuple(np.shape(batch.mask))}.")
        if check and not isinstance(confidence, jax.core.Tracer):
            c = np.asarray(confidence, np.float64)[np.asarray(batch.mask, bool)]
            bad = ~((c > 0) & (c < 1))
            if bad.any():
                raise ValueError(f"confidence must lie in the open interval (0, 1) on valid steps; got {c[bad][0]!r}. "
                                 "c = 1 is the plain return (use another estimator), c = 0 drops the future; "
                                 "ConfidenceHead outputs are in (0, 1).")
    elif confidence is not None:
        raise ValueError(f'a confidence array was passed but ConfidenceConfig.confidence="{config.confidence}"; '
                         'set confidence="given" to use it.')
    return entry_point(_confidence_jit, batch, config, ConfidenceConfig, check=check, extra=(confidence,))


# ------------------------------------------------------------------- the learned head


def confidence_features(batch: StepBatch, base) -> Float[Array, "B K T 6"]:
    """Per-record features for ``ConfidenceHead`` from a Gated-BEPO output ``base``:
    V(s), rho(s), delta, A_out, A_FP and the step's position t / T."""
    B, K, T = batch.mask.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.float32) / T, (B, K, T))
    feats = jnp.stack([base.value, base.gate.astype(jnp.float32), base.td, base.a_out, base.a_fp, pos], axis=-1)
    return jnp.where(batch.mask[..., None], feats, 0.0)


def confidence_loss(head: "ConfidenceHead", features: Float[Array, "B K T F"], mask: Bool[Array, "B K T"],
                    outcome: Int[Array, "B K"], *, entropy_coef: float = 0.01):
    """mean over valid records of BCE(c_t, 1[trajectory succeeded]) - entropy_coef * H(c_t).

    Returns (loss, metrics) with metrics {"bce", "entropy", "mean_confidence"}.
    """
    logits = head.logits(features)
    target = jnp.broadcast_to((outcome == SUCCESS)[..., None], mask.shape).astype(jnp.float32)
    log_p = jax.nn.log_sigmoid(logits)
    log_q = jax.nn.log_sigmoid(-logits)
    bce = -(target * log_p + (1.0 - target) * log_q)
    p = jnp.exp(log_p)
    entropy = -(p * log_p + (1.0 - p) * log_q)
    w = mask.astype(jnp.float32)
    denom = jnp.maximum(w.sum(), 1.0)
    bce_m = (bce * w).sum() / denom
    ent_m = (entropy * w).sum() / denom
    return bce_m - entropy_coef * ent_m, {"bce": bce_m, "entropy": ent_m, "mean_confidence": (p * w).sum() / denom}
