"""G2PO as reconstructed from its abstract alone (``g2po_abstract``; Wang et al. 2026, arXiv 2606.22995).

Kept under this name because stored results (the credit lab, the tabular curves) were computed with
it before the authors' code was public; ``g2po`` is now the estimator as that code computes it
(``estimators/g2po.py``). docs/estimators.md, G2PO.

Per group, with edge reward r_i = reward_i + penalty_i and the group's state graph
(identical observations merged across the K trajectories, END[outcome] sinks):

1. group-aggregation value: V(s) = mean over the records at s of their discounted
   returns G_i = sum_l gamma^l r_{t+l};  V(END) = 0;
2. actions are edges e = (s, s'); an edge's TD error is
       delta_e = rbar_e + gamma V(s') - V(s)        (rbar_e: mean reward of the edge's records)
   and every record on e carries delta_e;
3. graph-wide standardisation over the group's distinct edges:
       A^G_i = (delta_{e_i} - mu_E) / (sigma_E + eps)   (norm="mean_std"; "mean": delta - mu_E)
   with mu_E, sigma_E the mean and std of delta over the edges (each edge once);
4. A_i = beta_G A^G_i + beta_E A^E_i, A^E the outcome advantage (docs/estimators.md).

Only the abstract is public to us; everything it leaves open is [reconstructed] and a config
field: the value's discount and aggregation (the Monte-Carlo mean, as GAGPO's proxy), the
one-step TD (no GAE), the edge's reward (the mean of its records), the unit the statistics
are taken over (``unit="edge"``: each distinct edge once; ``"record"``: every record, i.e.
edges weighted by their visits, with the record's own reward), and the episode term beside
it (GiGPO's A^E + omega A^S form). One edge, or TD errors all equal, gives A^G = 0 (the
constant-group rule of ``stats.segment_moments``). A group whose states never repeat gets
A^G = 0 exactly: V(s_t) is then its one visit's G_t, and the TD error is computed in the
equivalent form (G_t = r_t + gamma G_{t+1})
    delta_i = (rbar_e - r_i) + gamma (V(s') - G_{t+1}) - (V(s) - G_t),
whose three differences are then exactly 0 whatever the compiler fuses (a multiply-add fused in
the returns' scan but not in r + gamma V(s') - V(s) would leave residue), so no float residue is
ever divided by its own spread (tests/credit/test_g2po.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ..configs import check_choice, check_int, check_range, pytree_config
from ..graph import build_graph, dense_ids, gather_node, graph_diagnostics, history_keys
from ..returns import discounted_returns
from ..stats import STD_DDOF, masked_moments, scale_deviation, segment_moments
from ..types import GraphDiagnostics, PerRecord, StepBatch, pytree_dataclass
from .common import check_outcome_fields, estimator_entry, per_group, stop_gradient, with_sanitized_input
from .grpo import outcome_advantage

@pytree_dataclass
class G2POAbstractOutput:
    """The abstract-based G2PO's output (``g2po_abstract``): ``advantage`` = beta_G ``a_graph`` + beta_E
    ``a_episode``; ``td`` = the TD error of the record's edge, r + gamma V(s') - V(s), before the
    graph-wide standardisation; ``value`` = V(s_i), the mean discounted return of the records at
    the record's state (all float32 [B, K, T]); ``num_edges`` = distinct (s, s') edges per group [B]."""

    advantage: PerRecord
    a_graph: PerRecord
    a_episode: PerRecord
    td: PerRecord
    value: PerRecord
    num_edges: Int[Array, "B"]
    diagnostics: GraphDiagnostics


UNITS = ("edge", "record")


@pytree_config(static=("norm", "weighting", "std", "history", "unit"))
class G2POAbstractConfig:
    """Abstract-based G2PO settings (every default [reconstructed] from the paper's abstract).

    gamma: discount of the returns behind V and of V(s') in the TD error, in [0, 1] (0.95, as GiGPO).
    beta_g: weight of the graph term (1.0).   beta_e: weight of the episode term (1.0).
    unit: "edge" (default: the TD statistics over the group's distinct edges, each once, the
      edge's TD from the mean reward of its records) or "record" (over every record with its
      own reward: edges weighted by their visits).
    norm: "mean_std" (default: the abstract's "standardizing") or "mean", for both terms.
    weighting, std, eps: as GRPO (the episode term's; std and eps also the graph term's).
    history: merge states on the last ``history`` + 1 observations (0: the observation alone).
    """

    gamma: float = 0.95
    beta_g: float = 1.0
    beta_e: float = 1.0
    unit: str = "edge"
    norm: str = "mean_std"
    weighting: str = "step"
    std: str = "unbiased"
    eps: float = 1e-6
    history: int = 0

    def __post_init__(self):
        name = "G2POAbstractConfig"
        check_range(name, "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range(name, "beta_g", self.beta_g)
        check_range(name, "beta_e", self.beta_e)
        check_choice(name, "unit", self.unit, UNITS)
        check_outcome_fields(name, self)
        check_int(name, "history", self.history, lo=0)


def edge_td(state: Int[Array, "N"], succ: Int[Array, "N"], r: Float[Array, "N"], valid: Bool[Array, "N"],
            value: Float[Array, "N"], ret: Float[Array, "N"], ret_next: Float[Array, "N"], gamma, unit: str):
    """Per record: the TD error of its edge, r + gamma V(s') - V(s) (``unit="edge"``: r is the
    edge's mean reward; ``"record"``: the record's own), and the record that stands for it in the
    statistics (``rep``: the edge's first record under ``"edge"``, the record itself under
    ``"record"``). ``ret`` and ``ret_next`` are the record's G_t and G_{t+1} (0 after its last
    step): the error is formed as (r - r_i) + gamma (V(s') - G_{t+1}) - (V(s) - G_t), equal to
    r + gamma V(s') - V(s) because G_t = r_i + gamma G_{t+1}, and exactly 0 for a record whose
    states were visited once. Returns (td, rep, num_edges)."""
    n = valid.shape[0]
    idx = jnp.arange(n)
    edge, num_edges = dense_ids((state, succ), valid, pad_id=n)
    safe = jnp.clip(edge, 0, n - 1)
    if unit == "edge":
        r_edge = segment_moments(r, valid, edge, n, ddof=0).mean[safe]
        rep = jax.ops.segment_min(jnp.where(valid, idx, n), edge, n)[safe]
    else:
        r_edge, rep = r, idx
    td = (r_edge - r) + gamma * (gather_node(value, succ) - ret_next) - (gather_node(value, state) - ret)
    return jnp.where(valid, td, 0.0), jnp.where(valid, rep, 0), num_edges


def _group(obs_key, reward, mask, outcome, penalty, config: G2POAbstractConfig):
    K, T = mask.shape
    n = K * T
    r = jnp.where(mask, reward + penalty, 0.0)
    graph = build_graph(history_keys(obs_key, config.history), mask, outcome)
    valid, src, dst = mask.reshape(n), graph.state.reshape(n), graph.succ.reshape(n)
    g = discounted_returns(r, mask, config.gamma)
    g_next = jnp.concatenate([g[:, 1:], jnp.zeros_like(g[:, :1])], axis=1)  # G_{t+1}; 0 after the last step
    v = segment_moments(g.reshape(n), valid, src, n, ddof=0).mean  # V(s): mean return of the records at s
    td, rep, num_edges = edge_td(src, dst, r.reshape(n), valid, v, g.reshape(n), g_next.reshape(n), config.gamma,
                                 config.unit)
    # Statistics over the representatives; every record takes its representative's deviation, so
    # the records of one edge get the same bits and equal TD errors give exactly 0.
    m = masked_moments(td, valid & (rep == jnp.arange(n)), ddof=STD_DDOF[config.std])
    dev = jnp.where(valid, m.dev[rep], 0.0)
    a_graph = jnp.where(mask, scale_deviation(dev, m.std, norm=config.norm, eps=config.eps).reshape(K, T), 0.0)
    a_ep = outcome_advantage(reward, penalty, mask, norm=config.norm, weighting=config.weighting,
                             std=config.std, eps=config.eps)
    adv = jnp.where(mask, config.beta_g * a_graph + config.beta_e * a_ep, 0.0)
    diag = GraphDiagnostics(*graph_diagnostics(graph, mask, 0, True))
    return G2POAbstractOutput(advantage=adv, a_graph=a_graph, a_episode=a_ep, td=td.reshape(K, T),
                      value=jnp.where(mask, gather_node(v, graph.state), 0.0), num_edges=num_edges,
                      diagnostics=diag)


@with_sanitized_input
def g2po_abstract_kernel(batch: StepBatch, config: G2POAbstractConfig) -> G2POAbstractOutput:
    """The jittable G2PO kernel (no host checks; invalid groups are dropped and flagged)."""
    return stop_gradient(per_group(_group, batch, config))


@estimator_entry("g2po_abstract", kernel=g2po_abstract_kernel, config=G2POAbstractConfig, output=G2POAbstractOutput, graph=True,
                    definition="beta_G A^G + beta_E A^E; A^G = TD errors of edges (s, s') with V = per-state Monte-Carlo "
                               "means, standardised over the group's edges",
                    source="Wang et al. 2026 (arXiv 2606.22995; reconstructed from its abstract before its code was public)")
def g2po_abstract(batch: StepBatch, config: G2POAbstractConfig = G2POAbstractConfig(), *, check: bool = True) -> G2POAbstractOutput:
    """The abstract-based G2PO (docs/estimators.md, G2PO); ``.advantage`` float32 [B, K, T]."""
