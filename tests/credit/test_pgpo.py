"""PGPO as its summary states it (bepo_jax.credit.estimators.pgpo): against a record loop written
from the equations (reference.ref_pgpo: Phi as float64 dict means), a worked example by hand, the
edge cases (one-row anchors, all-equal returns), and GAGPO at lambda = 0 as its identity."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, GAGPOConfig, PGPOConfig
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories
from bepo_jax.credit.reference import ref_pgpo

from tests.helpers import assert_close
from tests.strategies import batches


@given(data=batches(), gamma=st.sampled_from([0.0, 0.9, 1.0]), omega=st.sampled_from([0.5, 1.0]),
       step_scale=st.sampled_from(["none", "std"]), norm=st.sampled_from(["mean", "mean_std"]))
def test_pgpo_matches_a_record_loop(data, gamma, omega, step_scale, norm):
    batch, np_batch = data
    if step_scale == "std" and norm == "mean":
        with pytest.raises(ValueError, match="step_scale"):
            PGPOConfig(step_scale=step_scale, norm=norm)
        return
    kw = dict(gamma=gamma, omega=omega, step_scale=step_scale, norm=norm)
    assert_close(bj.pgpo(batch, PGPOConfig(**kw)).advantage, ref_pgpo(np_batch, **kw), what=f"pgpo {kw}", rtol=3e-4)


def test_worked_example_by_hand():
    b = batch_from_trajectories([[Trajectory(["a", "b"], [0, 10], SUCCESS), Trajectory(["a", "c"], [0, 0], FAILURE),
                                  Trajectory(["a", "b"], [0, 0], FAILURE)]])
    out = np.asarray(bj.pgpo(b, PGPOConfig(norm="mean")).advantage)[0]
    phi = {"a": 9.5 / 3, "b": 5.0, "c": 0.0}
    a_out = np.asarray(bj.grpo(b, bj.GRPOConfig(norm="mean")).advantage)[0]
    want = [[0 + 0.95 * phi["b"] - phi["a"], 10 - phi["b"]],
            [0 + 0.95 * phi["c"] - phi["a"], 0 - phi["c"]],
            [0 + 0.95 * phi["b"] - phi["a"], 0 - phi["b"]]]
    np.testing.assert_allclose(out, a_out + np.asarray(want), rtol=1e-6, atol=1e-6)


def test_one_row_anchors_and_all_equal_returns_give_the_outcome_credit():
    # no state repeats: Phi(s_t) is the row's own G_t, so delta = r + gamma G_{t+1} - G_t = 0
    lone = batch_from_trajectories([[Trajectory(["a", "b", "e"], [0, 0, 1], SUCCESS),
                                     Trajectory(["c", "d"], [0.5, 0.0], FAILURE)]])
    np.testing.assert_allclose(np.asarray(bj.pgpo(lone).advantage), np.asarray(bj.grpo(lone).advantage), atol=1e-6)
    # every row through the same states with the same rewards: Phi is exact and every delta is 0
    same = batch_from_trajectories([[Trajectory(["a", "b"], [0.1, 0.2], SUCCESS)] * 3])
    assert not np.asarray(bj.pgpo(same).advantage).any()


def test_it_is_gagpo_at_lambda_zero():
    b = batch_from_trajectories([[Trajectory(["a", "b", "a", "c"], [0, 0, 0, 1], SUCCESS),
                                  Trajectory(["a", "c"], [0, -1], FAILURE),
                                  Trajectory(["a", "b", "d"], [0, 0, 0], FAILURE)]])
    for scale in ("none", "std"):
        np.testing.assert_array_equal(np.asarray(bj.pgpo(b, PGPOConfig(step_scale=scale)).advantage),
                                      np.asarray(bj.gagpo(b, GAGPOConfig(lam=0.0, fp_scale=scale)).advantage))


def test_refusals_name_the_field():
    for field, value in (("gamma", 1.5), ("omega", math.inf), ("step_scale", "max"), ("history", -1)):
        with pytest.raises(ValueError, match=field):
            PGPOConfig(**{field: value})
