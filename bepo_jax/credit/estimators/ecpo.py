"""ECPO, Evidence-Calibrated Policy Optimization (Li, Zhou, Duan, Chen; arXiv 2606.05885).

Provenance (docs/estimators.md, provenance table): no code of the authors is public. The equations
below are the method as third-party summaries of the paper's HTML version give it; the method
section itself could not be read here. What the summaries leave open (the count scale tau, the
weight omega, the canonicaliser, the set the action values are standardised over) is a field of
``ECPOConfig`` whose default is this project's choice, marked [ours]. The estimator reconstructed
from the abstract alone before these equations were known is ``ecpo_abstract``.

Per group, with anchor states s (records with equal ``obs_key``; ``history`` > 0: equal last
``history`` + 1 observations), the step return G_i = discounted return + penalty (as GiGPO), and
canonical actions u (``StepBatch.action_key``, the canonical action text hashed; without one, the
record's successor node):

    n(s), n(s,u)        records at s, at (s, u)
    Gbar(s,u)           mean of G over (s, u)
    mu(s)               mean of G over s (anchor="rows") or of Gbar(s,u) over the distinct u ("actions")

Evidence-calibrated action value (shrinkage toward the anchor mean, prior strength kappa = 2):

    mu~(s,u) = (n(s,u) Gbar(s,u) + kappa mu(s)) / (n(s,u) + kappa)
    A_act,i  = standardise(mu~(s_i, u_i))

standardised over the records of the anchor (standardize="anchor" [ours]: z-scores of mu~ among
the records at s; "group": of mu~ - mu(s) over every record of the group at an anchor with two or
more actions; "none": mu~ - mu(s) in reward units). Since mu~ - mu(s) = n/(n + kappa) (Gbar - mu(s)),
it is computed in that form (a segment of equal returns then gives exactly 0).

Variance gate (B between-action, W within-action variance of G at s):

    B(s) = (1/n(s)) sum_{i at s} (Gbar(s,u_i) - mu(s))^2,   W(s) = (1/n(s)) sum_{i at s} (G_i - Gbar(s,u_i))^2
    rho(s) = tanh(n(s) / tau) B(s) / (B(s) + W(s) + eps)            (gate="variance"; "none": 1)

    A_i = A_GRPO,i + omega rho(s_i) A_act,i

An anchor with one record or one distinct action gets A_act = 0 (its B is 0 as well). kappa = 0
switches the shrinkage off and gate="none" the gate: the paper's two one-component ablations.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, UInt32

from ..configs import check_choice, check_int, check_range, pytree_config
from ..graph import GroupGraph, build_graph, count_distinct, dense_ids, graph_diagnostics, history_keys
from ..returns import discounted_returns
from ..stats import STD_DDOF, masked_moments, segment_moments
from ..types import GraphDiagnostics, PerRecord, StepBatch, pytree_dataclass
from .common import check_outcome_fields, estimator_entry, stop_gradient, with_sanitized_input
from .grpo import outcome_advantage

@pytree_dataclass
class ECPOOutput:
    """ECPO's output as this project reconstructs it (docs/estimators.md, ECPO): ``advantage`` =
    ``a_episode`` + omega ``gate`` ``a_step``; ``a_step`` the shrunk action advantage n_sa / (n_sa + kappa)
    (ybar_sa - ybar_s) before the gate (0 at anchors with fewer than two distinct actions); ``gate`` g_s,
    the anchor's gate weight (0 where no step credit is given); all float32 [B, K, T]."""

    advantage: PerRecord
    a_episode: PerRecord
    a_step: PerRecord
    gate: PerRecord
    diagnostics: GraphDiagnostics


GATES = ("variance", "none")
STANDARDIZE = ("anchor", "group", "none")
ANCHOR_MEANS = ("rows", "actions")
ACTION_SOURCES = ("auto", "action_key", "successor")


@pytree_config(static=("norm", "weighting", "std", "history", "gate", "standardize", "anchor", "action_from"))
class ECPOConfig:
    """ECPO settings (module docstring; [ours] marks a default the paper's summaries do not give).

    gamma: discount of the step return G, in [0, 1] (0.95, GiGPO's configuration).
    kappa: shrinkage prior strength, >= 0 (2.0, the paper's; 0 switches the shrinkage off).
    tau: count scale of the gate's tanh(n(s) / tau), > 0 (4.0 [ours]: an anchor all 8 rows of a group
      visit is weighted tanh(2) = 0.96, one two rows visit tanh(0.5) = 0.46).
    omega: weight of the gated action term (1.0 [ours], GiGPO's step weight).
    gate: "variance" (default) or "none" (rho = 1 at anchors with two or more actions).
    standardize: the set A_act is standardised over: "anchor" (default [ours]), "group" or "none".
    anchor: mu(s) over the anchor's "rows" (default) or its distinct "actions".
    action_from: "auto" (default: ``StepBatch.action_key`` when the batch has one, else the
      successor [ours]), "action_key" (required; a batch without one is refused) or "successor".
    norm / weighting / std / eps: GRPO's outcome term (docs/estimators.md, outcome advantage;
      defaults mean, step, unbiased, 1e-6); ``std`` is also the standardisation's and eps the
      gate's and the standardisation's floor.
    history: anchors on the last ``history`` + 1 observations (0: the observation alone).
    """

    gamma: float = 0.95
    kappa: float = 2.0
    tau: float = 4.0
    omega: float = 1.0
    gate: str = "variance"
    standardize: str = "anchor"
    anchor: str = "rows"
    action_from: str = "auto"
    norm: str = "mean"
    weighting: str = "step"
    std: str = "unbiased"
    eps: float = 1e-6
    history: int = 0

    def __post_init__(self):
        name = "ECPOConfig"
        check_range(name, "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range(name, "kappa", self.kappa, lo=0.0)
        check_range(name, "tau", self.tau, lo=0.0, lo_open=True)
        check_range(name, "omega", self.omega)
        check_choice(name, "gate", self.gate, GATES)
        check_choice(name, "standardize", self.standardize, STANDARDIZE)
        check_choice(name, "anchor", self.anchor, ANCHOR_MEANS)
        check_choice(name, "action_from", self.action_from, ACTION_SOURCES)
        check_int(name, "history", self.history, lo=0)
        check_outcome_fields(name, self)


def anchor_actions(obs_key, mask, outcome, action_key: Optional[UInt32[Array, "K T 2"]],
                   history: int) -> tuple[GroupGraph, Int[Array, "K T"]]:
    """One group's state graph and its (anchor, canonical action) pair ids in [0, K T): the action
    is ``action_key`` or, when None, the record's successor node (the next state, or END[outcome])."""
    graph = build_graph(history_keys(obs_key, history), mask, outcome)
    n = mask.size
    valid = mask.reshape(n)
    src = graph.state.reshape(n).astype(jnp.uint32)
    if action_key is None:
        keys = (src, graph.succ.reshape(n).astype(jnp.uint32))
    else:
        ak = action_key.reshape(n, 2)
        keys = (src, ak[:, 0], ak[:, 1])
    pair, _ = dense_ids(keys, valid, pad_id=n + 3)
    return graph, pair.reshape(mask.shape)


def uses_action_key(batch: StepBatch, config) -> bool:
    """Whether ``config.action_from`` takes the batch's action keys (else the successor stands in)."""
    return config.action_from == "action_key" or (config.action_from == "auto" and batch.action_key is not None)


def refuse_missing_action_key(name: str, batch: StepBatch, config) -> None:
    if config.action_from == "action_key" and batch.action_key is None:
        raise ValueError(f"{name}: {type(config).__name__}.action_from='action_key' but the batch has no action_key; "
                         "record the actions (StepBatch(..., action_key=bepo_jax.action_keys(actions))) or use "
                         "action_from='auto' / 'successor'.")


def anchor_action_moments(y, state, action, valid, n: int, anchor: str):
    """Per record: Gbar(s,u), n(s,u), mu(s), n(s), the action means' deviations from mu(s) and the
    records' from their action mean (flat [n] arrays; ``action`` numbers the (s, u) pairs)."""
    s_safe, a_safe = jnp.clip(state, 0, n - 1), jnp.clip(action, 0, n - 1)
    ma = segment_moments(y, valid, action, n, ddof=0)
    ms = segment_moments(y, valid, state, n, ddof=0)
    ybar_a, n_a = ma.mean[a_safe], ma.count[a_safe]
    if anchor == "rows":
        mu = ms.mean[s_safe]
    else:
        inv = jnp.where(valid, 1.0 / jnp.maximum(n_a, 1.0), 0.0)
        num = jax.ops.segment_sum(ybar_a * inv, state, n)
        den = jax.ops.segment_sum(inv, state, n)
        mu = (num / jnp.maximum(den, 1e-30))[s_safe]
    return ybar_a, n_a, mu, ms.count[s_safe], ma.dev


def evidence_calibrated_credit(
    y: Float[Array, "K T"],
    state: Int[Array, "K T"],
    action: Int[Array, "K T"],
    mask: Bool[Array, "K T"],
    config: ECPOConfig,
) -> tuple[Float[Array, "K T"], Float[Array, "K T"], Bool[Array, "K T"]]:
    """(A_act, rho(s), acting) per record of one group: the standardised shrunk action value, its
    anchor's gate and whether the anchor had two or more distinct actions (module docstring)."""
    n = mask.size
    valid = mask.reshape(n)
    s_id, a_id, yv = state.reshape(n), action.reshape(n), y.reshape(n)
    ybar_a, n_a, mu, n_s, within_dev = anchor_action_moments(yv, s_id, a_id, valid, n, config.anchor)
    distinct = count_distinct(s_id, (a_id.astype(jnp.uint32),), valid, n)[jnp.clip(s_id, 0, n - 1)]
    acting = valid & (distinct >= 2)
    dev = jnp.where(acting, ybar_a - mu, 0.0)
    shrunk = n_a / (n_a + config.kappa) * dev  # mu~(s,u) - mu(s)
    ddof = STD_DDOF[config.std]
    if config.standardize == "anchor":
        m = segment_moments(shrunk, acting, s_id, n, ddof=ddof)
        a_act = m.dev / (m.std[jnp.clip(s_id, 0, n - 1)] + config.eps)
    elif config.standardize == "group":
        m = masked_moments(shrunk, acting, ddof=ddof)
        a_act = m.dev / (m.std + config.eps)
    else:
        a_act = shrunk
    s_safe = jnp.clip(s_id, 0, n - 1)
    safe_n = jnp.maximum(n_s, 1.0)
    between = jax.ops.segment_sum(jnp.where(acting, dev * dev, 0.0), s_id, n)[s_safe] / safe_n
    within = jax.ops.segment_sum(jnp.where(acting, within_dev * within_dev, 0.0), s_id, n)[s_safe] / safe_n
    if config.gate == "variance":
        rho = jnp.tanh(n_s / config.tau) * between / (between + within + config.eps)
    else:
        rho = jnp.ones_like(between)
    rho = jnp.where(acting, rho, 0.0)
    a_act = jnp.where(acting, a_act, 0.0)
    shape = mask.shape
    return a_act.reshape(shape), rho.reshape(shape), acting.reshape(shape)


def _group(obs_key, reward, mask, outcome, penalty, action_key: Optional[UInt32[Array, "K T 2"]], config, credit):
    """One group: the outcome term, the anchors and their actions, the step returns, ``credit``'s
    (A_act, gate, acting) and the advantage A^E + omega gate A_act."""
    a_ep = outcome_advantage(reward, penalty, mask, norm=config.norm, weighting=config.weighting,
                             std=config.std, eps=config.eps)
    graph, pair = anchor_actions(obs_key, mask, outcome, action_key, config.history)
    y = discounted_returns(reward, mask, config.gamma) + penalty
    a_act, gate, acting = credit(y, graph.state, pair, mask, config)
    adv = jnp.where(mask, a_ep + config.omega * gate * a_act, 0.0)
    diag = GraphDiagnostics(*graph_diagnostics(graph, acting & (gate > 0), 0, True))
    return adv, a_ep, a_act, gate, diag


def action_credit_kernel(credit, name: str):
    """The jittable kernel of an estimator that adds gated action credit at equal-observation anchors
    to the outcome term (``ecpo``, ``ecpo_abstract``): ``credit(y, state, action, mask, config)`` gives
    (A_act, gate, acting) per record of a group."""

    @with_sanitized_input
    def kernel(batch: StepBatch, config) -> ECPOOutput:
        action_key = batch.action_key if uses_action_key(batch, config) else None
        fn = lambda o, r, m, c, p, a: _group(o, r, m, c, p, a, config, credit)  # a None: an empty pytree per group
        adv, a_ep, a_act, gate, diag = jax.vmap(fn)(batch.obs_key, batch.reward, batch.mask, batch.outcome,
                                                    batch.penalty_or_zeros(), action_key)
        return stop_gradient(ECPOOutput(advantage=adv, a_episode=a_ep, a_step=a_act, gate=gate, diagnostics=diag))

    kernel.__name__ = kernel.__qualname__ = f"{name}_kernel"
    kernel.__doc__ = (f"The jittable {name} kernel (no host checks; invalid groups are dropped and flagged). With "
                      "action_from='action_key' and no ``batch.action_key`` it falls back to the successor (the host "
                      "entry point refuses that batch instead).")
    return kernel


ecpo_kernel = action_credit_kernel(evidence_calibrated_credit, "ecpo")
@estimator_entry("ecpo", kernel=ecpo_kernel, config=ECPOConfig, output=ECPOOutput, graph=True,
                    definition="A_GRPO + omega rho(s) z(mu~(s,u)): canonical-action means shrunk toward the anchor mean "
                               "(kappa 2) and standardised, gated by tanh(n(s)/tau) B/(B + W + eps)",
                    source="Li et al. 2026 (arXiv 2606.05885); equations as summaries of its HTML give them (no code; "
                           "tau, omega, standardisation set ours)",
                 host_check=functools.partial(refuse_missing_action_key, "ecpo"))
def ecpo(batch: StepBatch, config: ECPOConfig = ECPOConfig(), *, check: bool = True) -> ECPOOutput:
    """ECPO advantage (module docstring); ``.advantage`` float32 [B, K, T]."""
