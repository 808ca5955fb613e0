"""GiGPO: group-in-group advantage (Feng et al., arXiv 2505.10978; docs/estimators.md, GiGPO).

    A_i = A^E_i + omega * A^S_i

A^E is the outcome advantage of docs/estimators.md, outcome advantage (``grpo.outcome_advantage``). The step
term compares records that share an anchor state (equal ``obs_key`` within a group):
with step return  y_i = G_i + penalty_i  (G_i = sum_l gamma^l reward_{t+l}; the penalty
is not propagated back),

    A^S_i = y_i - mu_{s_i}                            (norm="mean")
    A^S_i = (y_i - mu_{s_i}) / (sigma_{s_i} + eps)    (norm="mean_std")

over the records of the step group s_i; a singleton step group gets A^S = 0
(verl-agent ``step_norm_reward``).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ..configs import check_int, check_range, pytree_config
from ..graph import build_graph, graph_diagnostics, history_keys, in_shared_state
from ..returns import discounted_returns
from ..stats import STD_DDOF, scale_deviation, segment_moments
from ..types import GraphDiagnostics, PerRecord, StepBatch, pytree_dataclass
from .common import check_outcome_fields, estimator_entry, per_group, stop_gradient, with_sanitized_input
from .grpo import outcome_advantage


@pytree_dataclass
class GiGPOOutput:
    """``advantage`` = ``a_episode`` + omega * ``a_step`` (all float32 [B, K, T])."""

    advantage: PerRecord
    a_episode: PerRecord
    a_step: PerRecord
    diagnostics: GraphDiagnostics


@pytree_config(static=("norm", "weighting", "std", "history"))
class GiGPOConfig:
    """GiGPO settings (defaults: verl-agent's ``mean_norm`` run scripts).

    gamma: discount of the step return, in [0, 1] (default 0.95).
    omega: weight of the step term (default 1.0; verl-agent ``step_advantage_w``).
    norm: "mean" (default) or "mean_std", used by both terms.
    weighting: episode-term statistics over records ("step", default) or trajectories.
    std: "unbiased" (default) or "population".
    eps: added to sigma (default 1e-6).
    history: step groups on the last ``history`` + 1 observations (0, default: the
      anchor observation alone, as GiGPO; > 0 is HGPO-style history-aware grouping).
    """

    gamma: float = 0.95
    omega: float = 1.0
    norm: str = "mean"
    weighting: str = "step"
    std: str = "unbiased"
    eps: float = 1e-6
    history: int = 0

    def __post_init__(self):
        check_int("GiGPOConfig", "history", self.history, lo=0)
        check_range("GiGPOConfig", "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range("GiGPOConfig", "omega", self.omega)
        check_outcome_fields("GiGPOConfig", self)


def step_group_advantage(
    y: Float[Array, "K T"],
    state: Int[Array, "K T"],
    mask: Bool[Array, "K T"],
    *,
    norm: str,
    std: str,
    eps,
    residue_ulps: float = 0.0,
) -> Float[Array, "K T"]:
    """A^S: normalise ``y`` within the step groups given by ``state``; singletons get 0.
    With ``residue_ulps`` > 0, a deviation within that many float32 ulps of
    |y_i| + |mu| is float residue and gives exactly 0 (HGPO counts only nonzero levels)."""
    n = mask.size
    ids = state.reshape(n)
    m = segment_moments(y.reshape(n), mask.reshape(n), ids, n, ddof=STD_DDOF[std])
    safe = jnp.clip(ids, 0, n - 1)
    dev = m.dev
    if residue_ulps:
        ulp = jnp.finfo(jnp.float32).eps
        dev = jnp.where(jnp.abs(dev) <= residue_ulps * ulp * (jnp.abs(y.reshape(n)) + jnp.abs(m.mean[safe])), 0.0, dev)
    a = scale_deviation(dev, m.std[safe], norm=norm, eps=eps)
    a = jnp.where(mask.reshape(n) & (m.count[safe] > 1), a, 0.0)
    return a.reshape(mask.shape)


def _group(obs_key, reward, mask, outcome, penalty, config: GiGPOConfig):
    a_ep = outcome_advantage(reward, penalty, mask, norm=config.norm, weighting=config.weighting,
                             std=config.std, eps=config.eps)
    graph = build_graph(history_keys(obs_key, config.history), mask, outcome)
    y = discounted_returns(reward, mask, config.gamma) + penalty
    a_step = step_group_advantage(y, graph.state, mask, norm=config.norm, std=config.std, eps=config.eps)
    diag = GraphDiagnostics(*graph_diagnostics(graph, in_shared_state(graph), 0, True))
    return a_ep + config.omega * a_step, a_ep, a_step, diag


@with_sanitized_input
def gigpo_kernel(batch: StepBatch, config: GiGPOConfig) -> GiGPOOutput:
    """The jittable GiGPO kernel (no host checks; invalid groups are dropped and flagged)."""
    adv, a_ep, a_step, diag = per_group(_group, batch, config)
    return stop_gradient(GiGPOOutput(advantage=adv, a_episode=a_ep, a_step=a_step, diagnostics=diag))


@estimator_entry("gigpo", kernel=gigpo_kernel, config=GiGPOConfig, output=GiGPOOutput, graph=True,
                    definition="A^E + omega A^S; A^S normalises G_i + penalty_i within equal-observation step groups "
                               "(singletons 0)",
                    source="Feng et al. 2025 (arXiv 2505.10978); verl-agent `core_gigpo.py`")
def gigpo(batch: StepBatch, config: GiGPOConfig = GiGPOConfig(), *, check: bool = True) -> GiGPOOutput:
    """GiGPO advantage (docs/estimators.md, GiGPO); ``.advantage`` float32 [B, K, T]."""
