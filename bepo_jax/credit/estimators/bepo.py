"""Gated-BEPO: confidence-gated Bellman credit assignment (arXiv 2608.06861; docs/estimators.md, Gated-BEPO).

Per group, with edge reward r_i = reward_i + penalty_i:

1. empirical graph over the group's distinct observations (``graph.build_graph``);
2. V = mean-backup Bellman fixed point, V(s) = mean_{(r, s') in E(s)} [r + gamma V(s')]
   (``fixed_point.bellman_fixed_point``, initialised at the Monte-Carlo means);
3. delta_i = r_i + gamma V(s'_i) - V(s_i);   A_FP_t = delta_t + gamma lam A_FP_{t+1};
4. rho(s) = 1 iff E(s) has >= min_successors distinct successor nodes
   (or distinct (r, s') pairs with gate_on="reward_successor");
5. A_i = eta_i A_out_i + w rho(s_i) A_FP_i / scale,  eta_i = eta_gated if rho else 1;
6. scale = std of A_FP over the group's gated records + eps (norm="mean_std"), 1 (norm="mean");
   scale = 1 + eps when that std is residue (<= FP_SCALE_NOISE tol (1 + max|V|)) or one record.

Steps 3-6 are [reconstructed] (the paper text stops at step 2): every choice is a
config field. A group whose observations never repeat has A_FP = 0 and A = A_out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxtyping import Array, Bool, Float, Int

from ..configs import check_range, pytree_config
from ..fixed_point import TOL_FLOOR, FixedPoint, bellman_fixed_point_batched
from ..graph import build_graph, gather_node, graph_diagnostics, history_keys
from ..returns import discounted_returns, gae
from ..stats import STD_DDOF, masked_moments, segment_moments
from ..types import GraphDiagnostics, PerRecord, RecordMask, StepBatch, pytree_dataclass
from .common import (check_graph_fields, check_outcome_fields, estimator_entry, per_group, stop_gradient,
                     with_sanitized_input)
from .grpo import outcome_advantage


# A_FP spreads up to this many tolerances (relative to 1 + max |V|) count as residue.
@pytree_dataclass
class GatedBEPOOutput:
    """Gated-BEPO output (docs/estimators.md, Gated-BEPO).

    advantage: A_i = eta_i A_out_i + w rho(s_i) A_FP_i / scale  [B, K, T]
    value:     V(s_i), the fixed-point value of the record's source state  [B, K, T]
    gate:      rho(s_i) (bool)  [B, K, T]
    a_fp:      the GAE of the TD residuals, before the mean_std scale  [B, K, T]
    a_out:     the outcome advantage (docs/estimators.md, outcome advantage)  [B, K, T]
    td:        delta_i = r_i + gamma V(s'_i) - V(s_i)  [B, K, T]
    fp_scale:  the divisor applied to a_fp (std of gated a_fp + eps; 1 for norm="mean")  [B]
    iterations: Jacobi sweeps used per group  [B]
    converged:  whether the group met the tolerance within max_iters  [B]
    num_states: distinct source states per group  [B]
    """

    advantage: PerRecord
    value: PerRecord
    gate: RecordMask
    a_fp: PerRecord
    a_out: PerRecord
    td: PerRecord
    fp_scale: Float[Array, "B"]
    iterations: Int[Array, "B"]
    converged: Bool[Array, "B"]
    num_states: Int[Array, "B"]
    diagnostics: GraphDiagnostics


FP_SCALE_NOISE = 16.0


@pytree_config(static=("norm", "weighting", "std", "gate_on", "solver", "history", "max_states"))
class GatedBEPOConfig:
    """Gated-BEPO settings (defaults: docs/estimators.md).

    gamma: discount in [0, 1] (0.95).
    lam: GAE lambda in [0, 1] (0.5) [reconstructed; docs/open-choices.md].
    w: weight of the fixed-point credit at gated states (1.0).
    eta_gated: weight kept by the outcome credit at gated states (0.5) [reconstructed].
    norm: "mean_std" (default) or "mean"; the outcome term's norm and whether A_FP is
      rescaled by its gated std [reconstructed].
    weighting: outcome statistics over records ("step", default) or trajectories.
    std: "unbiased" (default) or "population", for every std taken.
    eps: added to every sigma (1e-6).
    min_successors: distinct successors a state needs to be gated (2).
    gate_on: "successor" (distinct successor nodes, default) or "reward_successor"
      (distinct (r, s') pairs) [reconstructed].
    tol: relative tolerance of the Jacobi stopping rule (1e-6). Values below
      ``fixed_point.TOL_FLOOR`` (8 float32 ulps, ~9.5e-7) are raised to it, with a
      warning: float32 sweeps cannot resolve less.
    max_iters: Jacobi sweep cap (1000); 0 keeps the Monte-Carlo initialisation on
      every solver.
    solver: "dense" (default), "sparse", "auto" (dense up to a 256-state bucket, else
      sparse) or "solve" (direct LU; no intermediate iterates: any max_iters >= 1 gives
      the fixed point). dense/sparse/auto agree for every config; solve agrees with
      them whenever they report converged.
    max_states: static state bucket S of the dense/direct solvers. 0 (default) is
      automatic and a pure function of the batch, inside or outside your jit: the
      smallest of 32/64 that holds the largest group (sparse above 64). An
      explicit S that a group outgrows sends the batch to the sparse solver
      (``diagnostics.overflow`` and a printed warning), never a truncated graph.
    history: merge states on the last ``history`` + 1 observations instead of the
      current one (0, default: the observation alone) — HGPO's remedy for aliasing.
    """

    gamma: float = 0.95
    lam: float = 0.5
    w: float = 1.0
    eta_gated: float = 0.5
    norm: str = "mean_std"
    weighting: str = "step"
    std: str = "unbiased"
    eps: float = 1e-6
    min_successors: int = 2
    gate_on: str = "successor"
    tol: float = 1e-6
    max_iters: int = 1000
    solver: str = "dense"
    history: int = 0
    max_states: int = 0

    def __post_init__(self):
        name = "GatedBEPOConfig"
        check_range(name, "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range(name, "lam", self.lam, lo=0.0, hi=1.0)
        check_range(name, "w", self.w)
        check_range(name, "eta_gated", self.eta_gated)
        check_outcome_fields(name, self)
        check_graph_fields(name, self)


def _prepare(obs_key, reward, mask, outcome, penalty, config: GatedBEPOConfig):
    """Per group: edge rewards, the graph, and the Monte-Carlo initialisation."""
    r = jnp.where(mask, reward + penalty, 0.0)
    keys = history_keys(obs_key, config.history)
    graph = build_graph(keys, mask, outcome, r if config.gate_on == "reward_successor" else None)
    n = graph.num_slots
    # V^0(s) = mean of the discounted returns of the records at s.
    g = discounted_returns(r, mask, config.gamma)
    v0 = segment_moments(g.reshape(n), mask.reshape(n), graph.state.reshape(n), n, ddof=0).mean
    return r, graph, v0


def _finish(reward, mask, penalty, r, graph, fp: FixedPoint, overflow, config: GatedBEPOConfig, gate_all: bool,
            rescale: bool):
    """Per group: TD residuals, GAE, the gate and the mixing."""
    value = jnp.where(mask, gather_node(fp.value, graph.state), 0.0)
    td = jnp.where(mask, r + config.gamma * gather_node(fp.value, graph.succ) - value, 0.0)
    a_fp = gae(td, mask, config.gamma, config.lam)
    if gate_all:
        gate = mask
    else:
        n_succ = gather_node(graph.num_successors.astype(jnp.float32), graph.state)
        gate = mask & (n_succ >= config.min_successors)
    a_out = outcome_advantage(reward, penalty, mask, norm=config.norm, weighting=config.weighting,
                              std=config.std, eps=config.eps)
    if config.norm == "mean_std" and rescale:
        count, _, sd, _ = masked_moments(a_fp, gate, ddof=STD_DDOF[config.std])
        # Constant-group rule for the scale: one gated record, or a spread no larger than the
        # fixed point's own tolerance (float residue of order tol |V|), keeps sigma = 1 so
        # residue is never inflated into order-1 credit.
        noise = FP_SCALE_NOISE * jnp.maximum(config.tol, TOL_FLOOR) * (1.0 + jnp.max(jnp.abs(value)))
        scale = jnp.where((count > 1) & (sd > noise), sd, 1.0) + config.eps
    else:
        scale = jnp.ones((), jnp.float32)
    eta = jnp.where(gate, config.eta_gated, 1.0)
    adv = jnp.where(mask, eta * a_out + config.w * jnp.where(gate, a_fp / scale, 0.0), 0.0)
    return GatedBEPOOutput(
        advantage=adv, value=value, gate=gate, a_fp=a_fp, a_out=a_out, td=td, fp_scale=scale,
        iterations=fp.iterations, converged=fp.converged, num_states=graph.num_states,
        diagnostics=GraphDiagnostics(*graph_diagnostics(graph, gate, fp.iterations, fp.converged, overflow)),
    )


def bepo_batch_sanitized(batch: StepBatch, config: GatedBEPOConfig, *, gate_all: bool = False,
                         rescale: bool = True) -> GatedBEPOOutput:
    """Gated-BEPO on every group of an already sanitized ``batch`` (``gate_all``: rho = 1
    everywhere, for bepo_nogate and GAGPO; ``rescale=False``: A_FP is never divided by
    its std, for GAGPO's definition). Not stop-gradient; the public kernels wrap it."""
    r, graph, v0 = per_group(_prepare, batch, config)
    fp, overflow = bellman_fixed_point_batched(graph, r, v0, config.gamma, tol=config.tol, max_iters=config.max_iters,
                                               solver=config.solver, max_states=config.max_states)
    finish = lambda rew, m, p, rr, g, f, o: _finish(rew, m, p, rr, g, f, o, config, gate_all, rescale)
    return jax.vmap(finish)(batch.reward, batch.mask, batch.penalty_or_zeros(), r, graph, fp, overflow)


# ``bepo_batch_sanitized`` on ``types.sanitize(batch)``, with the invalid-input flags attached.
bepo_batch = with_sanitized_input(bepo_batch_sanitized)


def gated_bepo_kernel(batch: StepBatch, config: GatedBEPOConfig) -> GatedBEPOOutput:
    """The jittable Gated-BEPO kernel on a validated batch (no host checks)."""
    return stop_gradient(bepo_batch(batch, config))


@estimator_entry("gated_bepo", kernel=gated_bepo_kernel, config=GatedBEPOConfig, output=GatedBEPOOutput, graph=True,
                    definition="eta_i A_out_i + w rho(s_i) A_FP_i; A_FP = GAE of the TD residuals of the mean-backup "
                               "Bellman fixed point; rho = >= 2 distinct successors",
                    source="arXiv 2608.06861 (steps 3-6 reconstructed: docs/open-choices.md)")
def gated_bepo(batch: StepBatch, config: GatedBEPOConfig = GatedBEPOConfig(), *, check: bool = True) -> GatedBEPOOutput:
    """Gated-BEPO advantage (docs/estimators.md, Gated-BEPO); see ``GatedBEPOOutput`` for the fields.

    The worked example of docs/estimators.md: s0 (successors s1, s2) and s1 (SUCCESS, FAILURE)
    have two distinct successors each, so their records are gated (rho = 1) and get step
    credit; s2 (one successor) keeps the outcome credit:

    >>> import bepo_jax as bj
    >>> batch = bj.batch_from_trajectories([[bj.Trajectory(["s0", "s1"], [0, 10], bj.SUCCESS),
    ...                                      bj.Trajectory(["s0", "s2"], [0, 0], bj.FAILURE),
    ...                                      bj.Trajectory(["s0", "s1"], [0, 0], bj.FAILURE)]])
    >>> out = gated_bepo(batch, bj.GatedBEPOConfig(gamma=1.0))
    >>> out.gate[0].astype(int).tolist()
    [[1, 1], [1, 0], [1, 1]]
    >>> [round(float(v), 3) for v in out.value[0].reshape(-1)]
    [3.333, 5.0, 3.333, 0.0, 3.333, 5.0]
    """
