"""G2PO as its authors' code computes it (bepo_jax.credit.estimators.g2po): against a row-by-row
loop written from the official code (Nala-YN/G2PO, g2po/core_g2po.py; bepo_jax.credit.reference.ref_g2po),
a worked example by hand in verl-agent's units (success pays 10, an invalid action costs 0.1), and
the edge cases: one row per trajectory, all successes, no repeated state, a state repeated inside
one trajectory (a one-row group is refused by the data model)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, TRUNCATED, G2POConfig
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories
from bepo_jax.credit.reference import ref_g2po

from tests.helpers import assert_close
from tests.strategies import batches


@pytest.mark.parametrize("norm", ["mean", "mean_std"])
@given(data=batches(), gamma=st.sampled_from([0.5, 0.95, 1.0]), w=st.sampled_from([1.0, 0.5]),
       success_value=st.sampled_from([None, 10.0]))
def test_g2po_matches_a_row_loop_rewritten_from_the_official_code(norm, data, gamma, w, success_value):
    batch, np_batch = data
    cfg = G2POConfig(gamma=gamma, w=w, norm=norm, success_value=success_value)
    out = bj.g2po(batch, cfg)
    want = ref_g2po(np_batch, gamma=gamma, w=w, norm=norm, success_value=success_value)
    assert_close(out.advantage, want, what="g2po", rtol=3e-4)


def _verl(trajectories):
    """verl-agent's units: the success step pays 10, an invalid action (marked "!") costs 0.1."""
    return batch_from_trajectories([[Trajectory([o.rstrip("!") for o in obs], [10.0 if (i == len(obs) - 1 and out ==
                                                                                          SUCCESS) else 0.0
                                                                               for i in range(len(obs))], out,
                                                penalties=[-0.1 if o.endswith("!") else 0.0 for o in obs])
                                     for obs, out in trajectories]])


def test_worked_example_in_verl_agent_units():
    # tau1: a -> b -> success (R 10); tau2: a -> c -> c! -> failure (R 0, an invalid action at the last step)
    b = _verl([(["a", "b"], SUCCESS), (["a", "c", "c!"], FAILURE)])
    out = bj.g2po(b)  # mean_norm, gamma 0.95, w 1
    # V(a) = (0.95^2 10 + 0.95^3 0) / 2 = 4.5125, V(b) = 0.95 10 = 9.5, V(c) = 0; V(next) of tau1's last row = 10
    np.testing.assert_allclose(np.asarray(out.value)[0, 0, :2], [4.5125, 9.5], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.value_next)[0], [[9.5, 10, 0], [0, 0, 0]], rtol=1e-6)
    # episode: S = [10, 10, 0, 0, -0.1], mean 3.98
    np.testing.assert_allclose(np.asarray(out.a_episode)[0], [[6.02, 6.02, 0], [-3.98, -3.98, -4.08]], atol=1e-5)
    # c1: state a: (9.5, 0) -> +-4.75; state c: (0, -0.1) -> +0.05, -0.05; b alone -> 0
    np.testing.assert_allclose(np.asarray(out.c1)[0], [[4.75, 0, 0], [-4.75, 0.05, -0.05]], atol=1e-5)
    # c2: gains (4.9875, 0.5, -4.5125, 0, 0), mean 0.195
    np.testing.assert_allclose(np.asarray(out.c2)[0], [[4.7925, 0.305, 0], [-4.7075, -0.195, -0.195]], atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.advantage)[0], np.asarray(out.a_episode + out.c1 + out.c2)[0], atol=1e-6)


def test_edge_cases_follow_the_official_code():
    cases = {
        "one row per trajectory": [(["a"], SUCCESS), (["a"], FAILURE)],
        "all successes": [(["a", "b"], SUCCESS), (["a", "c"], SUCCESS), (["a", "b"], SUCCESS)],
        "no repeated state": [(["a", "b"], SUCCESS), (["c", "d!"], FAILURE), (["e"], TRUNCATED)],
        "a state repeated inside one trajectory": [(["a", "a", "b"], SUCCESS), (["a", "b", "b!"], FAILURE)],
    }
    for name, trajs in cases.items():
        b = _verl(trajs)
        np_batch = (np.asarray(b.obs_key), np.where(b.mask, b.reward, 0.0), np.asarray(b.mask), np.asarray(b.outcome),
                    np.asarray(b.penalty_or_zeros()))
        for norm in ("mean", "mean_std"):
            got = np.asarray(bj.g2po(b, G2POConfig(norm=norm)).advantage)
            assert np.all(np.isfinite(got)), name
            np.testing.assert_allclose(got, ref_g2po(np_batch, norm=norm), atol=1e-4, err_msg=f"{name}, {norm}")
    # a group of one row (the official code: mean 0, std 1, and a NaN c2 under mean_std_norm) cannot occur:
    # the data model refuses a group with a single non-empty trajectory
    with pytest.raises(ValueError, match="single non-empty trajectory"):
        bj.g2po(_verl([(["a"], SUCCESS), ([], FAILURE)]))
    # no repeated state: c1 is 0 everywhere (every state has one row)
    assert not np.asarray(bj.g2po(_verl(cases["no repeated state"])).c1).any()


def test_config_refuses_bad_values():
    assert G2POConfig().norm == "mean" and G2POConfig().gamma == 0.95 and G2POConfig().w == 1.0
    with pytest.raises(ValueError, match="norm"):
        G2POConfig(norm="mean_std_norm")
    with pytest.raises(ValueError, match="success_value"):
        G2POConfig(success_value="ten")
    with pytest.raises(ValueError, match="gamma"):
        G2POConfig(gamma=1.5)
    assert bj.compute_advantages("g2po", _verl([(["a"], SUCCESS), (["a"], FAILURE)]), norm="mean_std").advantage.shape \
        == (1, 2, 1)
