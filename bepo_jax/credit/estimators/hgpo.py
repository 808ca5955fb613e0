"""HGPO: history-based group advantages (He et al. 2026; the verl-agent HGPO recipe;
docs/estimators.md, HGPO).

Within one group, with step return y_i = G_i + penalty_i (GiGPO's step return), every
record at step t belongs to one group per history level k = 1 .. min(history_length + 1,
t + 1): the records whose last k observations equal its own (k = 1: the current
observation alone; a record with fewer than k observations so far has no level-k group).
In each group of two or more records

    a_{i,k} = (y_i - mu) / (sigma + eps)    (norm="mean_std", sigma the population std)
    a_{i,k} = y_i - mu                       (norm="mean")

and the record's advantage is the weighted mean of its *nonzero* a_{i,k},

    A_i = sum_k w_k a_{i,k} / (sum_k w_k + eps),    w_k = (k + 1)^alpha  over k with a_{i,k} != 0,

(0 when none is nonzero; a deviation within 16 float32 ulps of |y_i| + |mu| is rounding
residue of an exact 0 and counts as 0, on every level and on the base item — the
recipe's exact ``!= 0`` test would let float32 residue change the weights' sum). ``base_group`` adds the outcome advantage (GiGPO's episode
term: statistics over the group's records, unbiased std; ``norm="mean"`` keeps only the
mean) as a k = 0 item, weight 1. These are the recipe's rules, including eps in the
weights' denominator and the exclusion of exact zeros.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxtyping import Array, Float

from ..configs import check_bool, check_choice, check_int, check_range, pytree_config
from ..graph import build_graph, graph_diagnostics, history_keys, state_ids
from ..returns import discounted_returns
from ..stats import masked_moments
from ..types import GraphDiagnostics, PerRecord, StepBatch, pytree_dataclass
from .common import NORMS, estimator_entry, per_group, stop_gradient, with_sanitized_input
from .gigpo import step_group_advantage
from .grpo import outcome_advantage


# A level's deviation within this many float32 ulps of |y_i| + |mu| is rounding residue
# of a deviation that is 0 in exact arithmetic: it counts as 0 (the recipe tests != 0).
@pytree_dataclass
class HGPOOutput:
    """HGPO output (docs/estimators.md, HGPO): ``advantage`` float32 [B, K, T], the
    weighted mean of the record's nonzero group advantages; ``a_levels`` float32
    [B, K, T, history_length + 1] (level j = the groups of the last j + 1 observations;
    0 where the record's group is a singleton or its history is too short); ``a_base``
    [B, K, T] the outcome advantage (used only with ``base_group``)."""

    advantage: PerRecord
    a_levels: Float[Array, "B K T L"]
    a_base: PerRecord
    diagnostics: GraphDiagnostics


RESIDUE_ULPS = 16.0


@pytree_config(static=("history_length", "base_group", "norm"))
class HGPOConfig:
    """HGPO settings (defaults: the verl-agent recipe's run scripts).

    history_length: extra observations of the longest history key (2: levels k = 1, 2, 3).
    length_weight_alpha: w_k = (k + 1)^alpha (1.0; 0 weighs every level alike).
    base_group: add the outcome advantage as a k = 0 level (False).
    norm: "mean_std" (default; the recipe's mean_std_norm) or "mean" (mean_norm).
    gamma: discount of the step return, in [0, 1] (0.95).
    eps: added to sigma and to the weights' sum (1e-6).
    """

    history_length: int = 2
    length_weight_alpha: float = 1.0
    base_group: bool = False
    norm: str = "mean_std"
    gamma: float = 0.95
    eps: float = 1e-6

    def __post_init__(self):
        n = "HGPOConfig"
        check_int(n, "history_length", self.history_length, lo=0)
        check_range(n, "length_weight_alpha", self.length_weight_alpha)
        check_bool(n, "base_group", self.base_group)
        check_choice(n, "norm", self.norm, NORMS)
        check_range(n, "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range(n, "eps", self.eps, lo=0.0, lo_open=True)


def _without_residue(a_base, reward, penalty, mask):
    """The base item with the levels' residue rule: 0 where its score's deviation from the
    group mean is within RESIDUE_ULPS float32 ulps of |score| + |mean| (an exact 0)."""
    score = jnp.sum(jnp.where(mask, reward, 0.0), axis=-1)[:, None] + jnp.where(mask, penalty, 0.0)
    m = masked_moments(score, mask, ddof=1)
    ulp = jnp.finfo(jnp.float32).eps
    residue = (m.count > 1) & (jnp.abs(m.dev) <= RESIDUE_ULPS * ulp * (jnp.abs(score) + jnp.abs(m.mean)))
    return jnp.where(residue, 0.0, a_base)


def _group(obs_key, reward, mask, outcome, penalty, config: HGPOConfig):
    K, T = mask.shape
    y = discounted_returns(reward, mask, config.gamma) + penalty
    t = jnp.arange(T)[None, :]
    levels = []
    for j in range(config.history_length + 1):  # level k = j + 1: the last j + 1 observations
        member = mask & (t >= j)
        ids, _ = state_ids(history_keys(obs_key, j), member)
        levels.append(step_group_advantage(y, ids, member, norm=config.norm, std="population", eps=config.eps,
                                           residue_ulps=RESIDUE_ULPS))
    a_levels = jnp.stack(levels, axis=-1)  # [K, T, L]
    weights = (jnp.arange(1, config.history_length + 2, dtype=jnp.float32) + 1.0) ** config.length_weight_alpha
    a_base = outcome_advantage(reward, penalty, mask, norm=config.norm, weighting="step", std="unbiased",
                               eps=config.eps)
    items = a_levels
    w = jnp.broadcast_to(weights, a_levels.shape)
    if config.base_group:
        items = jnp.concatenate([_without_residue(a_base, reward, penalty, mask)[..., None], items], axis=-1)
        w = jnp.concatenate([jnp.ones(a_levels.shape[:-1] + (1,)), w], axis=-1)
    w = jnp.where(items != 0, w, 0.0)
    adv = jnp.where(mask, jnp.sum(w * items, axis=-1) / (jnp.sum(w, axis=-1) + config.eps), 0.0)
    graph = build_graph(obs_key, mask, outcome)
    credited = jnp.any(a_levels != 0, axis=-1) & mask
    diag = GraphDiagnostics(*graph_diagnostics(graph, credited, 0, True))
    return adv, a_levels, jnp.where(mask, a_base, 0.0), diag


@with_sanitized_input
def hgpo_kernel(batch: StepBatch, config: HGPOConfig) -> HGPOOutput:
    """The jittable HGPO kernel (no host checks; invalid groups are dropped and flagged)."""
    adv, a_levels, a_base, diag = per_group(_group, batch, config)
    return stop_gradient(HGPOOutput(advantage=adv, a_levels=a_levels, a_base=a_base, diagnostics=diag))


@estimator_entry("hgpo", kernel=hgpo_kernel, config=HGPOConfig, output=HGPOOutput, graph=True,
                    definition="weighted mean over history levels k = 1..h+1 of the step return normalised in groups of "
                               "equal last-k observations",
                    source="He et al. 2026; verl-agent HGPO recipe")
def hgpo(batch: StepBatch, config: HGPOConfig = HGPOConfig(), *, check: bool = True) -> HGPOOutput:
    """HGPO advantage (docs/estimators.md, HGPO); ``.advantage`` float32 [B, K, T]."""
