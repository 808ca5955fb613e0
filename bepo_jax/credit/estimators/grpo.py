"""GRPO: the group-relative outcome advantage (docs/estimators.md, "Outcome advantage").

Row score S_i = R_k + penalty_i with R_k = sum_t reward[k, t]. Per group:

* ``weighting="step"`` (verl-agent's ``compute_mean_std_cross_steps=True``): mu and
  sigma over the row scores S_i of the valid records, A_out_i = (S_i - mu) / (sigma + eps);
* ``weighting="trajectory"`` (Shao et al. 2024, DeepSeekMath): mu and sigma over the
  returns R_k of the non-empty trajectories, A_out_i = (R_k - mu) / (sigma + eps) + penalty_i
  (the penalty is added in reward units, unnormalised, so equal returns with a penalty
  give A = penalty, never penalty / eps);
* ``norm="mean"``: no division (A_out_i = S_i - mu for both weightings).

Constant-group rule: when every value the statistics are taken over is equal, the
deviation is exactly 0 (decided by max == min, not by a rounded sigma).
n = 1 sample: mu = 0, sigma = 1 (verl-agent). No valid record: all zeros.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ..configs import pytree_config
from ..stats import STD_DDOF, masked_moments, scale_deviation
from ..types import PerRecord, StepBatch, pytree_dataclass
from .common import check_outcome_fields, estimator_entry, per_group, stop_gradient, with_sanitized_input


@pytree_dataclass
class GRPOOutput:
    """``advantage``: float32 [B, K, T], the group-relative outcome advantage;
    ``invalid``: int32 [B] bit flags of invalid input (``group_flags``; 0 = valid)."""

    advantage: PerRecord
    invalid: Int[Array, "B"]


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
    pen = jnp.where(mask, penalty, 0.0)
    if weighting == "step":
        score = ret[:, None] + pen  # S_i: the statistics are over the scores themselves
        adv = _standardise(score, mask, std=std, norm=norm, eps=eps)
    else:
        # Statistics over the returns R_k: normalise R_k, then add the penalty in reward units
        # (a penalty divided by the returns' sigma would blow up when the returns are equal).
        adv = _standardise(ret, jnp.any(mask, axis=-1), std=std, norm=norm, eps=eps)[:, None] + pen
    return jnp.where(mask, adv, 0.0)


def _standardise(x, valid, *, std: str, norm: str, eps):
    """(x - mu) / (sigma + eps) or x - mu over ``valid``; n = 1 sample: mu = 0, sigma = 1
    (verl-agent), so the single value is returned rather than 0."""
    m = masked_moments(x, valid, ddof=STD_DDOF[std])
    single = m.count == 1
    dev = jnp.where(single, x, m.dev)
    return scale_deviation(dev, jnp.where(single, 1.0, m.std), norm=norm, eps=eps)


def _group(obs_key, reward, mask, outcome, penalty, config: GRPOConfig):
    del obs_key, outcome
    return outcome_advantage(reward, penalty, mask, norm=config.norm, weighting=config.weighting,
                             std=config.std, eps=config.eps)


@with_sanitized_input
def grpo_kernel(batch: StepBatch, config: GRPOConfig) -> GRPOOutput:
    """The jittable GRPO kernel (no host checks; invalid groups are dropped and flagged)."""
    return stop_gradient(GRPOOutput(advantage=per_group(_group, batch, config),
                                    invalid=jnp.zeros(batch.mask.shape[:1], jnp.int32)))


@estimator_entry("grpo", kernel=grpo_kernel, config=GRPOConfig, output=GRPOOutput, graph=False,
                    definition="A_i = (S_i - mu) / (sigma + eps) over the group (or S_i - mu); S_i = R_k + penalty_i",
                    source="Shao et al. 2024; verl-agent")
def grpo(batch: StepBatch, config: GRPOConfig = GRPOConfig(), *, check: bool = True) -> GRPOOutput:
    """Group-relative outcome advantage (docs/estimators.md, outcome advantage); ``.advantage`` float32 [B, K, T].

    ``check=False`` skips the value checks (prefix masks, finiteness, outcome codes),
    which read the arrays back to the host; shapes and dtypes are always checked.

    >>> import bepo_jax as bj
    >>> batch = bj.batch_from_trajectories([[bj.Trajectory(["a"], [10.0], bj.SUCCESS),
    ...                                      bj.Trajectory(["a"], [0.0], bj.FAILURE)]])
    >>> [round(float(a), 4) for a in grpo(batch).advantage[0, :, 0]]
    [0.7071, -0.7071]
    """
