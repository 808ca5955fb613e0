"""GRPO: the group-relative outcome advantage (SPEC section 2).

Row score S_i = R_k + penalty_i with R_k = sum_t reward[k, t]. Per group, mu and
sigma are taken over the row scores of the valid records (``weighting="step"``,
verl-agent's ``compute_mean_std_cross_steps=True``) or over the returns R_k of the
non-empty trajectories (``weighting="trajectory"``, Shao et al. 2024, DeepSeekMath):

    A_out_i = S_i - mu                      (norm="mean")
    A_out_i = (S_i - mu) / (sigma + eps)    (norm="mean_std")

n = 1 sample: mu = 0, sigma = 1 (verl-agent). No valid record: all zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._config import pytree_config
from ..stats import STD_DDOF, masked_moments, normalise
from ..types import GRPOOutput, StepBatch
from ._common import check_outcome_fields, entry_point, per_group, stop_gradient


@pytree_config(static=("norm", "weighting", "std"))
class GRPOConfig:
    """GRPO / outcome-advantage settings.

    norm: "mean" or "mean_std" (default; verl-agent ``mean_std_norm``).
    weighting: "step" (default; a trajectory of L steps counts L times, verl-agent)
      or "trajectory" (one return per non-empty trajectory, the GRPO paper).
    std: "unbiased" (n - 1, torch's default; default) or "population" (n).
    eps: added to sigma before dividing (default 1e-6, verl-agent).
    """

    norm: str = "mean_std"
    weighting: str = "step"
    std: str = "unbiased"
    eps: float = 1e-6

    def __post_init__(self):
        check_outcome_fields("GRPOConfig", self)


def outcome_advantage(
    reward: Float[Array, "K T"],
    penalty: Float[Array, "K T"],
    mask: Bool[Array, "K T"],
    *,
    norm: str,
    weighting: str,
    std: str,
    eps,
) -> Float[Array, "K T"]:
    """A_out for one group (module docstring); 0 at padding."""
    ret = jnp.sum(jnp.where(mask, reward, 0.0), axis=-1)  # R_k
    score = ret[:, None] + jnp.where(mask, penalty, 0.0)  # S_i
    if weighting == "step":
        n, mu, sd = masked_moments(score, mask, ddof=STD_DDOF[std])
    else:
        n, mu, sd = masked_moments(ret, jnp.any(mask, axis=-1), ddof=STD_DDOF[std])
    single = n == 1
    mu = jnp.where(single, 0.0, mu)
    sd = jnp.where(single, 1.0, sd)
    constant = (sd == 0) if weighting == "step" else None  # stats over the scores themselves
    return jnp.where(mask, normalise(score, mu, sd, norm=norm, eps=eps, constant=constant), 0.0)


def _group(obs_key, reward, mask, outcome, penalty, config: GRPOConfig):
    del obs_key, outcome
    return outcome_advantage(reward, penalty, mask, norm=config.norm, weighting=config.weighting,
                             std=config.std, eps=config.eps)


def grpo_kernel(batch: StepBatch, config: GRPOConfig) -> GRPOOutput:
    """The jittable GRPO kernel on a validated batch (no host checks)."""
    return stop_gradient(GRPOOutput(advantage=per_group(_group, batch, config)))


_grpo_jit = jax.jit(grpo_kernel)


def grpo(batch: StepBatch, config: GRPOConfig = GRPOConfig(), *, check: bool = True) -> GRPOOutput:
    """Group-relative outcome advantage (SPEC section 2); ``.advantage`` float32 [B, K, T].

    ``check=False`` skips the value checks (prefix masks, finiteness, outcome codes),
    which read the arrays back to the host; shapes and dtypes are always checked.
    """
    return entry_point(_grpo_jit, batch, config, GRPOConfig, check=check)
