"""GraphGPO: graph-distance step credit (Cheng et al. 2026; docs/estimators.md).

Per group, over the state graph with a SUCCESS sink:

    d(END[SUCCESS]) = 0,   d(s) = 1 + min_{s' in succ(s)} d(s')      (min-plus fixed point)

Nodes that cannot reach SUCCESS get (max finite d) + 1; in a group without a success
every node gets d = 1 (so the graph term is 0). Each record's step return is

    y_i = scale * omega_g ** d(s'_i)                    (scale = 10, omega_g = 0.10)
    y_i = scale * omega_g ** (d(s'_i) - d(s_i) + 1)     (normalize_distance: progress)

(the exponent of the second is >= 0, since d(s) <= 1 + d(s') for every observed edge),

normalised within equal-observation step groups exactly as GiGPO's A^S (singletons 0),
and A = beta_G A^G + beta_E A^E with A^E the outcome advantage of docs/estimators.md, outcome advantage.
The shortest paths come from Bellman-Ford sweeps d <- min(d, 1 + min_{edges} d(s'))
in a ``lax.while_loop`` that stops when nothing changes (at most S + 1 sweeps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ..configs import check_bool, check_int, check_range, pytree_config
from ..graph import GroupGraph, build_graph, graph_diagnostics, history_keys, in_shared_state
from ..types import SUCCESS, GraphDiagnostics, PerRecord, StepBatch, pytree_dataclass
from .common import check_outcome_fields, estimator_entry, per_group, stop_gradient, with_sanitized_input
from .gigpo import step_group_advantage
from .grpo import outcome_advantage


@pytree_dataclass
class GraphGPOOutput:
    """GraphGPO output: ``advantage`` = beta_G ``a_graph`` + beta_E ``a_episode``;
    ``distance`` = d(s'_i), the shortest-path length from the record's successor to SUCCESS."""

    advantage: PerRecord
    a_graph: PerRecord
    a_episode: PerRecord
    distance: PerRecord
    diagnostics: GraphDiagnostics


@pytree_config(static=("norm", "weighting", "std", "history", "normalize_distance"))
class GraphGPOConfig:
    """GraphGPO settings.

    omega_g: distance decay of the step return, in (0, 1] (0.10, the reference recipe's;
        earlier releases used 0.2).
    normalize_distance: step return scale * omega_g^(d(s') - d(s) + 1), rewarding progress
        towards SUCCESS rather than proximity to it (False).
    scale: step return at distance 0, i.e. of a step into SUCCESS (10.0, the success reward).
    beta_g: weight of the graph term (1.0).   beta_e: weight of the episode term (1.0).
    norm, weighting, std, eps: as GiGPO, for both terms (default norm "mean_std", the
        recipe's mean_std_norm; earlier releases used "mean").
    history: history-aware state keys (0 = the observation alone).
    """

    omega_g: float = 0.1
    normalize_distance: bool = False
    scale: float = 10.0
    beta_g: float = 1.0
    beta_e: float = 1.0
    norm: str = "mean_std"
    weighting: str = "step"
    std: str = "unbiased"
    eps: float = 1e-6
    history: int = 0

    def __post_init__(self):
        name = "GraphGPOConfig"
        check_range(name, "omega_g", self.omega_g, lo=0.0, hi=1.0, lo_open=True)
        check_range(name, "scale", self.scale)
        check_range(name, "beta_g", self.beta_g)
        check_range(name, "beta_e", self.beta_e)
        check_outcome_fields(name, self)
        check_int(name, "history", self.history, lo=0)
        check_bool(name, "normalize_distance", self.normalize_distance)


def distance_to_success(graph: GroupGraph) -> tuple[Float[Array, "N+3"], Int[Array, ""]]:
    """d over the N state slots and the 3 END nodes (module docstring); returns (d, sweeps)."""
    n = graph.num_slots
    src = graph.state.reshape(n)
    dst = graph.succ.reshape(n)
    valid = graph.valid.reshape(n)
    inf = jnp.float32(jnp.inf)
    d0 = jnp.full((n + 3,), inf).at[n + SUCCESS].set(0.0)

    def sweep(d):
        cand = jnp.where(valid, d[jnp.clip(dst, 0, n + 2)] + 1.0, inf)
        best = jax.ops.segment_min(cand, src, n)
        return d.at[:n].set(jnp.minimum(d[:n], best))

    def cond(c):
        k, _, changed = c
        return changed & (k <= n)

    def body(c):
        k, d, _ = c
        d_new = sweep(d)
        return k + 1, d_new, jnp.any(d_new != d)

    k, d, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), d0, jnp.bool_(True)))
    used = jnp.concatenate([jnp.arange(n) < graph.num_states, jnp.ones((3,), bool)])
    finite = jnp.isfinite(d) & used
    far = jnp.max(jnp.where(finite, d, 0.0)) + 1.0
    d = jnp.where(jnp.isfinite(d), d, far)
    has_success = jnp.any(valid & (dst == n + SUCCESS))
    return jnp.where(has_success, d, 1.0), k


def _group(obs_key, reward, mask, outcome, penalty, config: GraphGPOConfig):
    graph = build_graph(history_keys(obs_key, config.history), mask, outcome)
    d, sweeps = distance_to_success(graph)
    n = graph.num_slots
    dist = jnp.where(mask, d[jnp.clip(graph.succ, 0, n + 2)], 0.0)
    exponent = dist
    if config.normalize_distance:
        exponent = jnp.where(mask, dist - d[jnp.clip(graph.state, 0, n + 2)] + 1.0, 0.0)
    # omega_g ** d from a table of repeated products (not exp(d log omega), which XLA may
    # evaluate differently in different fusions): equal exponents give equal returns.
    powers = jnp.cumprod(jnp.full((n + 4,), config.omega_g, jnp.float32).at[0].set(1.0))
    y = config.scale * powers[exponent.astype(jnp.int32)]
    a_graph = step_group_advantage(y, graph.state, mask, norm=config.norm, std=config.std, eps=config.eps)
    a_ep = outcome_advantage(reward, penalty, mask, norm=config.norm, weighting=config.weighting,
                             std=config.std, eps=config.eps)
    adv = jnp.where(mask, config.beta_g * a_graph + config.beta_e * a_ep, 0.0)
    diag = GraphDiagnostics(*graph_diagnostics(graph, in_shared_state(graph), sweeps, True))
    return GraphGPOOutput(advantage=adv, a_graph=a_graph, a_episode=a_ep, distance=dist, diagnostics=diag)


@with_sanitized_input
def graphgpo_kernel(batch: StepBatch, config: GraphGPOConfig) -> GraphGPOOutput:
    """The jittable GraphGPO kernel (no host checks; invalid groups are dropped and flagged)."""
    return stop_gradient(per_group(_group, batch, config))


@estimator_entry("graphgpo", kernel=graphgpo_kernel, config=GraphGPOConfig, output=GraphGPOOutput, graph=True,
                    definition="beta_G A^G + beta_E A^E; step return 10 omega_g^d(s'), d = shortest path to SUCCESS "
                               "(min-plus fixed point)",
                    source="Cheng et al. 2026; verl-agent GraphGPO recipe")
def graphgpo(batch: StepBatch, config: GraphGPOConfig = GraphGPOConfig(), *, check: bool = True) -> GraphGPOOutput:
    """GraphGPO advantage (docs/estimators.md); ``.advantage`` float32 [B, K, T]."""
