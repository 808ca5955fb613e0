"""Token-level PPO loss (docs/estimators.md, tokens and the policy loss).

With token log-ratio rho_j = exp(log pi(a_j) - log pi_old(a_j)) and the step's advantage
A_j broadcast to its response tokens:

    l_clip_j = max(-A_j rho_j, -A_j clip(rho_j, 1 - eps_low, 1 + eps_high))
    l_pg_j   = min(l_clip_j, -A_j c)  where A_j < 0      (dual clip, Ye et al. 2020; c > 1)
    k3_j     = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1   (low-variance KL, Schulman 2020)
    loss     = agg(l_pg) + kl_coef * agg(k3) - entropy_coef * agg(H)

agg = "token-mean" (mean over all valid response tokens, default) or
"seq-mean-token-mean" (mean over responses of each response's token mean).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ...credit.configs import check_choice, check_range

AGGREGATIONS = ("token-mean", "seq-mean-token-mean")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOLossConfig:
    """clip_low / clip_high: the ratio clip range [1 - clip_low, 1 + clip_high] (0.2 / 0.2).
    dual_clip: c > 1 bounds the loss of negative-advantage tokens by -A c (None: off).
    kl_coef: weight of the k3 KL to the reference policy (0: off; 0.01 is the usual value).
    entropy_coef: entropy bonus (0: off). aggregation: "token-mean" or "seq-mean-token-mean"."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: Optional[float] = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aggregation: str = "token-mean"

    def __post_init__(self):
        n = "PPOLossConfig"
        check_range(n, "clip_low", self.clip_low, lo=0.0, hi=1.0)
        check_range(n, "clip_high", self.clip_high, lo=0.0)
        if self.dual_clip is not None:
            check_range(n, "dual_clip", self.dual_clip, lo=1.0, lo_open=True)
        check_range(n, "kl_coef", self.kl_coef, lo=0.0)
        check_range(n, "entropy_coef", self.entropy_coef, lo=0.0)
        check_choice(n, "aggregation", self.aggregation, AGGREGATIONS)


def aggregate(x: Float[Array, "N L"], mask: Bool[Array, "N L"], how: str) -> Float[Array, ""]:
    w = mask.astype(jnp.float32)
    if how == "token-mean":
        return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)
    per_seq = jnp.sum(x * w, axis=-1) / jnp.maximum(jnp.sum(w, axis=-1), 1.0)
    has = jnp.any(mask, axis=-1).astype(jnp.float32)
    return jnp.sum(per_seq * has) / jnp.maximum(jnp.sum(has), 1.0)


def ppo_loss(
    logp: Float[Array, "N L"],
    old_logp: Float[Array, "N L"],
    advantage: Float[Array, "N L"],
    response_mask: Bool[Array, "N L"],
    config: PPOLossConfig,
    *,
    entropy: Float[Array, "N L"] | None = None,
    ref_logp: Float[Array, "N L"] | None = None,
):
    """The PPO objective (module docstring) and its metrics.

    Returns (loss, metrics) with metrics: pg_loss, clip_frac, approx_kl (k3 of the new
    policy against the old), kl_ref, entropy, adv_mean, adv_std, adv_min, adv_max.
    """
    m = response_mask
    adv = jax.lax.stop_gradient(jnp.where(m, advantage, 0.0))
    log_ratio = jnp.where(m, logp - old_logp, 0.0)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    l1, l2 = -adv * ratio, -adv * clipped
    pg = jnp.maximum(l1, l2)
    if config.dual_clip is not None:
        pg = jnp.where(adv < 0, jnp.minimum(pg, -adv * config.dual_clip), pg)
    agg = lambda x: aggregate(x, m, config.aggregation)
    pg_loss = agg(pg)
    loss = pg_loss
    kl_ref = jnp.zeros(())
    if ref_logp is not None and config.kl_coef > 0:
        d = jnp.where(m, ref_logp - logp, 0.0)
        kl_ref = agg(jnp.exp(d) - d - 1.0)
        loss = loss + config.kl_coef * kl_ref
    ent = jnp.zeros(())
    if entropy is not None:
        ent = agg(entropy)
        loss = loss - config.entropy_coef * ent
    w = m.astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    adv_mean = (adv * w).sum() / n
    metrics = dict(
        pg_loss=pg_loss,
        clip_frac=(((ratio < 1.0 - config.clip_low) | (ratio > 1.0 + config.clip_high)) * w).sum() / n,
        approx_kl=((jnp.exp(-log_ratio) + log_ratio - 1.0) * w).sum() / n,
        kl_ref=kl_ref,
        entropy=ent,
        adv_mean=adv_mean,
        adv_std=jnp.sqrt((((adv - adv_mean) ** 2) * w).sum() / n),
        adv_min=jnp.min(jnp.where(m, adv, jnp.inf)),
        adv_max=jnp.max(jnp.where(m, adv, -jnp.inf)),
    )
    return loss, metrics
