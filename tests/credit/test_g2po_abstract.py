"""G2PO (docs/estimators.md, G2PO): against the plain-loop definition, a worked example by hand,
the property its definition implies (no repeated state: every TD error is 0), and its config."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, G2POAbstractConfig
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories
from bepo_jax.credit.reference import ref_g2po_abstract

from tests.helpers import assert_close
from tests.strategies import batches


@pytest.mark.parametrize("norm", ["mean", "mean_std"])
@pytest.mark.parametrize("unit", ["edge", "record"])
@given(data=batches(), gamma=st.sampled_from([0.5, 0.95, 1.0]), betas=st.sampled_from([(1.0, 1.0), (0.5, 2.0),
                                                                                       (1.0, 0.0)]),
       weighting=st.sampled_from(["step", "trajectory"]))
def test_g2po_matches_its_definition(norm, unit, data, gamma, betas, weighting):
    batch, np_batch = data
    cfg = G2POAbstractConfig(gamma=gamma, beta_g=betas[0], beta_e=betas[1], unit=unit, norm=norm, weighting=weighting)
    out = bj.g2po_abstract(batch, cfg)
    want, td, value = ref_g2po_abstract(np_batch, gamma=gamma, beta_g=betas[0], beta_e=betas[1], unit=unit, norm=norm,
                               weighting=weighting, std="unbiased", eps=1e-6)
    assert_close(out.value, value, what="V")
    assert_close(out.td, td, what="td")
    assert_close(out.advantage, want, what="g2po_abstract", rtol=3e-4)


def _worked():
    # tau1 s0 -> s1 -> SUCCESS (10 on the last step); tau2 s0 -> s2 -> FAILURE; tau3 s0 -> s1 -> FAILURE
    return batch_from_trajectories([[Trajectory(["s0", "s1"], [0, 10], SUCCESS),
                                     Trajectory(["s0", "s2"], [0, 0], FAILURE),
                                     Trajectory(["s0", "s1"], [0, 0], FAILURE)]])


def test_g2po_worked_example():
    """gamma 1: V(s1) = 5, V(s2) = 0, V(s0) = 10/3. Edges: (s0,s1) 5/3, (s0,s2) -10/3,
    (s1,S) 5, (s2,F) 0, (s1,F) -5. Over the five edges mu = -1/3; over the six records
    (s0,s1) counts twice and mu = 0."""
    b = _worked()
    td = np.asarray(bj.g2po_abstract(b, G2POAbstractConfig(gamma=1.0, beta_e=0.0, norm="mean")).td)[0]
    np.testing.assert_allclose(td, [[5 / 3, 5], [-10 / 3, 0], [5 / 3, -5]], rtol=1e-6, atol=1e-6)
    edge = np.asarray(bj.g2po_abstract(b, G2POAbstractConfig(gamma=1.0, beta_e=0.0, norm="mean")).advantage)[0]
    np.testing.assert_allclose(edge, td + 1 / 3, rtol=1e-6, atol=1e-6)
    record = np.asarray(bj.g2po_abstract(b, G2POAbstractConfig(gamma=1.0, beta_e=0.0, norm="mean", unit="record")).advantage)[0]
    np.testing.assert_allclose(record, td, rtol=1e-6, atol=1e-6)
    # mean_std over the edges: (delta - mu) / (sd + eps), sd the unbiased std of the five edge values
    deltas = np.array([5 / 3, -10 / 3, 5, 0, -5])
    std = np.asarray(bj.g2po_abstract(b, G2POAbstractConfig(gamma=1.0, beta_e=0.0)).advantage)[0]
    np.testing.assert_allclose(std, (td + 1 / 3) / (deltas.std(ddof=1) + 1e-6), rtol=1e-5)
    assert int(bj.g2po_abstract(b).num_edges[0]) == 5


@given(data=batches(), gamma=st.sampled_from([0.5, 0.95, 1.0]))
def test_no_repeated_state_gives_no_graph_credit(data, gamma):
    """With every observation distinct, V(s_t) = G_t of its one visit, so every TD error
    r_t + gamma G_{t+1} - G_t is 0 in exact arithmetic: the graph term must be float residue,
    not noise divided by its own spread."""
    batch, np_batch = data
    obs = np.asarray(np_batch[0]).copy()
    B, K, T = np_batch[2].shape
    ids = np.arange(B * K * T, dtype=np.uint64).reshape(B, K, T)
    obs[..., 0], obs[..., 1] = (ids * 2654435761 + 1) % 2**32, ids + 7
    distinct = bj.StepBatch(obs_key=obs, reward=batch.reward, mask=batch.mask, outcome=batch.outcome,
                            penalty=batch.penalty)
    for unit in ("edge", "record"):
        out = bj.g2po_abstract(distinct, G2POAbstractConfig(gamma=gamma, unit=unit))
        assert np.max(np.abs(np.asarray(out.a_graph))) == 0.0, unit


def test_g2po_differs_from_gigpo_where_gigpo_sees_nothing():
    """A branch seen once per successor: GiGPO's step groups compare returns at s0 only; G2PO's
    edges also credit (s1, SUCCESS) against (s1, FAILURE) through their TD errors."""
    b = _worked()
    g2 = np.asarray(bj.g2po_abstract(b, G2POAbstractConfig(beta_e=0.0)).a_graph)[0]
    assert g2[0, 1] > 0 > g2[2, 1]  # s1 -> SUCCESS credited above s1 -> FAILURE
    assert g2[0, 0] == g2[2, 0]  # one edge, one credit


def test_g2po_config_is_validated():
    assert G2POAbstractConfig().unit == "edge" and G2POAbstractConfig().norm == "mean_std"
    with pytest.raises(ValueError, match="unit"):
        G2POAbstractConfig(unit="node")
    with pytest.raises(ValueError, match="gamma"):
        G2POAbstractConfig(gamma=1.5)
    assert bj.compute_advantages("g2po_abstract", _worked(), unit="record").advantage.shape == (1, 3, 2)
