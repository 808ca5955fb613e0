"""G2PO as its authors' code computes it (Nala-YN/G2PO, ``g2po/core_g2po.py`` at b8ffaf5; docs/estimators.md).

Per group of K trajectories (rows = the valid records; a trajectory counts once per step), with
R_k = sum_t reward_{k,t} the episode reward, L_k its length and p_{k,t} the per-step penalty
(``StepBatch.penalty``: the invalid-action penalty, -0.1 in verl-agent):

1. episode term: the row score S_{k,t} = R_k + p_{k,t}, minus the mean over the group's rows
   (``norm="mean"``, the code's default ``mean_norm``) or standardised by their unbiased std
   (``norm="mean_std"``, ``mean_std_norm``, its ALFWorld script): (S - mean) / (std + eps);
2. state values: V(s) = mean over the rows at s of gamma^(L_k - t) R_k (t from 0; gamma 0.95,
   hard-coded there); after a trajectory's last step its next state is a terminal whose value
   is the success value (R_k of a SUCCESS trajectory, the code's 10; ``success_value`` fixes it)
   or 0 for any other outcome; penalties never enter V;
3. c1: x = V(next) + p_{k,t}, centred (or standardised) within the rows that share the state;
   a state with one row gets 0;
4. c2: V(next) - V(s), centred (or standardised) over all rows of the group;
5. A_{k,t} = episode term + w (c1 + c2), w = 1.

Where the code is silent or degenerate: a group of one row (the code: episode mean 0 and std 1,
and ``torch.std`` of one value, NaN, under ``mean_std_norm``) cannot occur here, since the data
model refuses a group with a single non-empty trajectory (the kernel would give c2 = 0); a success is the data model's outcome
(SUCCESS), where the code tests R == 10, and its terminal value is the trajectory's own R (the
code's constant 10 whenever successes pay 10); sets of equal values centre to exactly 0 (the
code's float32 mean can leave a residue that ``/ (0 + eps)`` magnifies).
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from jaxtyping import Int

from ..configs import check_choice, check_int, check_range, pytree_config
from ..graph import build_graph, gather_node, graph_diagnostics, history_keys
from ..stats import segment_moments
from ..types import SUCCESS, GraphDiagnostics, PerRecord, StepBatch, pytree_dataclass
from .common import NORMS, estimator_entry, per_group, stop_gradient, with_sanitized_input
from .gigpo import step_group_advantage
from .grpo import outcome_advantage


@pytree_dataclass
class G2POOutput:
    """G2PO's output as its authors' code computes it (docs/estimators.md, G2PO): ``advantage`` =
    ``a_episode`` + w (``c1`` + ``c2``); ``a_step`` = ``c1`` + ``c2``; ``value`` = V(s_i), the state's
    mean of gamma^(L - t) R over its rows; ``value_next`` = V of the row's next state (the
    success value or 0 after the last step); all float32 [B, K, T]."""

    advantage: PerRecord
    a_episode: PerRecord
    a_step: PerRecord
    c1: PerRecord
    c2: PerRecord
    value: PerRecord
    value_next: PerRecord
    diagnostics: GraphDiagnostics


@pytree_config(static=("norm", "history", "success_value"))
class G2POConfig:
    """G2PO settings, defaulting to its code and run scripts.

    gamma: the discount of gamma^(L - t) R in V (0.95, hard-coded there), in [0, 1].
    w: weight of the step term c1 + c2 (``step_advantage_w``, 1.0).
    norm: "mean" (default; the code's ``mean_norm``) or "mean_std" (``mean_std_norm``), for the
      episode term, c1 and c2 alike.
    eps: added to the std (1e-6).
    success_value: the value after a successful trajectory's last step; None (default): that
      trajectory's own R (the code's 10, where success pays 10).
    history: merge states on the last ``history`` + 1 observations (0: the observation alone, the
      code's anchor observation).
    """

    gamma: float = 0.95
    w: float = 1.0
    norm: str = "mean"
    eps: float = 1e-6
    success_value: Optional[float] = None
    history: int = 0

    def __post_init__(self):
        name = "G2POConfig"
        check_range(name, "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range(name, "w", self.w)
        check_choice(name, "norm", self.norm, NORMS)
        check_range(name, "eps", self.eps, lo=0.0, lo_open=True)
        if self.success_value is not None and not isinstance(self.success_value, (int, float)):
            raise ValueError(f"G2POConfig: success_value={self.success_value!r}; give a number (the value after a "
                             "successful trajectory's last step) or None (that trajectory's own episode reward).")
        check_int(name, "history", self.history, lo=0)


def _group(obs_key, reward, mask, outcome: Int[Array, "K"], penalty, config: G2POConfig):
    K, T = mask.shape
    n = K * T
    pen = jnp.where(mask, penalty, 0.0)
    ret = jnp.sum(jnp.where(mask, reward, 0.0), axis=-1)  # R_k
    length = jnp.sum(mask, axis=-1)  # L_k
    t = jnp.arange(T)[None, :]
    graph = build_graph(history_keys(obs_key, config.history), mask, outcome)
    valid, state = mask.reshape(n), graph.state.reshape(n)
    # V(s): the mean over the rows at s of gamma^(L - t) R
    disc = jnp.where(mask, jnp.power(jnp.float32(config.gamma), (length[:, None] - t).astype(jnp.float32))
                     * ret[:, None], 0.0)
    v_state = segment_moments(disc.reshape(n), valid, state, n, ddof=0).mean
    value = jnp.where(mask, gather_node(v_state, graph.state), 0.0)
    success = ret if config.success_value is None else jnp.full_like(ret, config.success_value)
    terminal = jnp.where(outcome == SUCCESS, success, 0.0)  # [K]
    last = t == (length[:, None] - 1)
    nxt = jnp.concatenate([value[:, 1:], jnp.zeros_like(value[:, :1])], axis=1)
    value_next = jnp.where(mask, jnp.where(last, terminal[:, None], nxt), 0.0)
    # c1: V(next) + penalty within the rows of one state; c2: V(next) - V(s) over every row of the
    # group (one step group holding them all). Both GiGPO's step-group rule: a group of one row gets 0.
    centre = lambda y, groups: step_group_advantage(y, groups, mask, norm=config.norm, std="unbiased",
                                                    eps=config.eps)
    c1 = centre(value_next + pen, graph.state)
    c2 = centre(value_next - value, jnp.zeros_like(graph.state))
    a_ep = outcome_advantage(reward, penalty, mask, norm=config.norm, weighting="step", std="unbiased",
                             eps=config.eps)
    step = jnp.where(mask, c1 + c2, 0.0)
    adv = jnp.where(mask, a_ep + config.w * step, 0.0)
    diag = GraphDiagnostics(*graph_diagnostics(graph, mask, 0, True))
    return G2POOutput(advantage=adv, a_episode=a_ep, a_step=step, c1=c1, c2=c2, value=value, value_next=value_next,
                      diagnostics=diag)


@with_sanitized_input
def g2po_kernel(batch: StepBatch, config: G2POConfig) -> G2POOutput:
    """The jittable G2PO kernel (no host checks; invalid groups are dropped and flagged)."""
    return stop_gradient(per_group(_group, batch, config))


@estimator_entry("g2po", kernel=g2po_kernel, config=G2POConfig, output=G2POOutput, graph=True,
                    definition="episode term (R + p centred over the group's rows) + w (c1 + c2): c1 = V(s') + p centred "
                               "within the rows of a state, c2 = V(s') - V(s) centred over the group; V(s) = mean of "
                               "gamma^(L - t) R at s",
                    source="Wang et al. 2026 (arXiv 2606.22995); official code Nala-YN/G2PO g2po/core_g2po.py @ b8ffaf5")
def g2po(batch: StepBatch, config: G2POConfig = G2POConfig(), *, check: bool = True) -> G2POOutput:
    """G2PO advantage as its authors' code computes it (module docstring); ``.advantage`` float32 [B, K, T]."""
