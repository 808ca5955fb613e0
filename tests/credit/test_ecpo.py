"""ECPO from the equations its summaries give (bepo_jax.credit.estimators.ecpo): against a record
loop written from those equations (reference.ref_ecpo, float64 dicts), a worked example by hand,
the edge cases (one-row anchors, one action at an anchor, all-equal returns), the paper's two
one-component ablations, and the canonical-action records it reads."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, ECPOConfig
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories
from bepo_jax.credit.reference import ref_ecpo

from tests.helpers import assert_close
from tests.strategies import batches


def _with_actions(batch, seed, n_actions):
    """The batch with random action keys drawn from ``n_actions`` symbols (few: actions repeat)."""
    rng = np.random.default_rng(seed)
    table = rng.choice(2**32, size=(n_actions * 2,), replace=False).astype(np.uint32).reshape(n_actions, 2)
    keys = table[rng.integers(0, n_actions, np.shape(batch.mask))]
    return dataclasses.replace(batch, action_key=keys), keys


@given(data=batches(), seed=st.integers(0, 2**31), n_actions=st.integers(1, 3), with_key=st.booleans(),
       gate=st.sampled_from(["variance", "none"]), standardize=st.sampled_from(["anchor", "group", "none"]),
       anchor=st.sampled_from(["rows", "actions"]), kappa=st.sampled_from([0.0, 2.0, 5.0]),
       tau=st.sampled_from([1.0, 4.0]))
def test_ecpo_matches_a_record_loop(data, seed, n_actions, with_key, gate, standardize, anchor, kappa, tau):
    batch, np_batch = data
    actions = None
    if with_key:
        batch, actions = _with_actions(batch, seed, n_actions)
    kw = dict(gate=gate, standardize=standardize, anchor=anchor, kappa=kappa, tau=tau)
    want = ref_ecpo(np_batch, actions, **kw)
    assert_close(bj.ecpo(batch, ECPOConfig(**kw)).advantage, want, what=f"ecpo {kw}", rtol=3e-4)


def _worked():
    # anchor "a": trajectories 0 and 2 go to "b", 1 to "c"; "b" then succeeds once (10) and fails once
    return batch_from_trajectories([[Trajectory(["a", "b"], [0, 10], SUCCESS), Trajectory(["a", "c"], [0, 0], FAILURE),
                                     Trajectory(["a", "b"], [0, 0], FAILURE)]])


def test_worked_example_by_hand():
    out = bj.ecpo(_worked())  # no action key: the successor is the action; kappa 2, tau 4
    # at "a": G = 9.5, 0, 0 (gamma 0.95); mu = 19/6; action b: n 2, mean 4.75; action c: n 1, mean 0
    mu = 9.5 / 3
    tilde_b, tilde_c = (2 * 4.75 + 2 * mu) / 4, (0 + 2 * mu) / 3
    vals = [tilde_b, tilde_c, tilde_b]
    m, sd = sum(vals) / 3, np.std(vals, ddof=1)
    between = (2 * (4.75 - mu) ** 2 + mu ** 2) / 3
    within = 2 * 4.75 ** 2 / 3
    rho = math.tanh(3 / 4) * between / (between + within + 1e-6)
    np.testing.assert_allclose(np.asarray(out.a_step)[0, :, 0], [(v - m) / (sd + 1e-6) for v in vals], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out.gate)[0, :, 0], [rho] * 3, rtol=1e-5)
    # at "b" (rows 0 and 2): two actions (END[SUCCESS], END[FAILURE]), one record each: W = 0
    np.testing.assert_allclose(np.asarray(out.gate)[0, [0, 2], 1], [math.tanh(2 / 4) * 1 / (1 + 4e-6 / 100)] * 2,
                               rtol=1e-5)
    grpo = np.asarray(bj.grpo(_worked(), bj.GRPOConfig(norm="mean")).advantage)  # ECPO's default, GiGPO's mean_norm
    np.testing.assert_allclose(np.asarray(out.advantage), grpo + np.asarray(out.gate) * np.asarray(out.a_step),
                               rtol=1e-6, atol=1e-6)


def test_one_row_anchors_and_one_action_give_no_step_credit():
    # no observation repeats: every anchor holds one record
    lone = batch_from_trajectories([[Trajectory(["a", "b"], [0, 1], SUCCESS), Trajectory(["c", "d"], [0, 0], FAILURE)]])
    out = bj.ecpo(lone)
    assert not np.asarray(out.gate).any() and not np.asarray(out.a_step).any()
    np.testing.assert_array_equal(np.asarray(out.advantage), np.asarray(bj.grpo(lone, bj.GRPOConfig(norm="mean")).advantage))
    # "a" visited by all three rows with one action key: no between-action evidence
    one = batch_from_trajectories([[Trajectory(["a", "b"], [0, 1], SUCCESS, actions=["go", "x"]),
                                    Trajectory(["a", "c"], [0, 0], FAILURE, actions=["go", "y"]),
                                    Trajectory(["a", "d"], [0, 0], FAILURE, actions=["go", "z"])]])
    out = bj.ecpo(one)
    assert not np.asarray(out.gate)[0, :, 0].any() and not np.asarray(out.a_step)[0, :, 0].any()


def test_all_equal_returns_give_exactly_the_outcome_credit():
    # two actions at "a" whose returns are all equal: B = W = 0, mu~ equal, A_act exactly 0
    same = batch_from_trajectories([[Trajectory(["a", "b"], [0.1, 0.2], SUCCESS),
                                     Trajectory(["a", "c"], [0.1, 0.2], SUCCESS),
                                     Trajectory(["a", "c"], [0.1, 0.2], SUCCESS)]])
    for standardize in ("anchor", "group", "none"):
        out = bj.ecpo(same, ECPOConfig(standardize=standardize))
        assert not np.asarray(out.a_step).any() and not np.asarray(out.gate).any()
        np.testing.assert_array_equal(np.asarray(out.advantage), np.asarray(bj.grpo(same, bj.GRPOConfig(norm="mean")).advantage))


def test_the_one_component_ablations():
    b = _worked()
    # kappa = 0: the action means unshrunk (the paper's "gate alone")
    no_shrink = bj.ecpo(b, ECPOConfig(kappa=0.0, standardize="none"))
    mu = 9.5 / 3
    np.testing.assert_allclose(np.asarray(no_shrink.a_step)[0, :, 0], [4.75 - mu, -mu, 4.75 - mu], rtol=1e-6)
    # gate "none": rho = 1 wherever two or more actions were taken (the paper's "shrinkage alone")
    no_gate = bj.ecpo(b, ECPOConfig(gate="none"))
    np.testing.assert_array_equal(np.asarray(no_gate.gate)[0], [[1, 1], [1, 0], [1, 1]])


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="action_key"):
        bj.ecpo(_worked(), ECPOConfig(action_from="action_key"))
    for field, value in (("kappa", -1.0), ("tau", 0.0), ("gate", "ratio"), ("standardize", "batch"),
                         ("anchor", "median"), ("action_from", "x"), ("omega", float("nan"))):
        with pytest.raises(ValueError, match=field):
            ECPOConfig(**{field: value})


def test_the_jitted_kernel_takes_batches_with_and_without_keys():
    b = _worked()
    keyed = dataclasses.replace(b, action_key=bj.action_keys([[["n", "n"], ["s", "x"], ["n", "y"]]]))
    # keys that mirror the successors give the successor proxy's numbers
    np.testing.assert_allclose(np.asarray(bj.ecpo_kernel(bj.check_batch(keyed), ECPOConfig()).advantage),
                               np.asarray(bj.ecpo(b).advantage), rtol=1e-6)
    other = dataclasses.replace(b, action_key=bj.action_keys([[["n", "n"], ["n", "x"], ["n", "y"]]]))
    np.testing.assert_allclose(np.asarray(bj.ecpo(other, ECPOConfig(action_from="successor")).advantage),
                               np.asarray(bj.ecpo(b).advantage), rtol=1e-6)
    assert not np.allclose(np.asarray(bj.ecpo(other).advantage), np.asarray(bj.ecpo(b).advantage))


def test_builders_and_rows_record_canonical_actions():
    trajs = [[Trajectory(["a", "b"], [0, 10], SUCCESS, actions=["Go North", "take key"]),
              Trajectory(["a"], [0], FAILURE, actions=["go  north"]), Trajectory([], [], FAILURE)]]
    b = batch_from_trajectories(trajs)
    ak = np.asarray(b.action_key)
    assert (ak[0, 0, 0] == ak[0, 1, 0]).all() and not (ak[0, 0, 0] == ak[0, 0, 1]).all()
    rows, index = bj.from_rows(uid=["g"] * 3, traj_uid=[0, 0, 1], step=[0, 1, 0], obs_key=["a", "b", "a"],
                               reward=[0.0, 10.0, 0.0], outcome=[SUCCESS, SUCCESS, FAILURE],
                               action=np.array(["go north", "Take  Key", "GO NORTH"]))
    np.testing.assert_array_equal(np.asarray(rows.action_key)[0, :2], ak[0, :2])
    with pytest.raises(ValueError, match="actions"):
        batch_from_trajectories([[Trajectory(["a"], [0], SUCCESS, actions=["x"]), Trajectory(["a"], [0], FAILURE)]])
    with pytest.raises(ValueError, match="actions"):
        Trajectory(["a", "b"], [0, 0], FAILURE, actions=["x"])


def test_action_ids_get_one_key_whatever_container_holds_them():
    want = np.asarray(bj.action_keys(np.array([[3, -1, 3]], np.int32)))
    np.testing.assert_array_equal(bj.action_keys([[3, -1, 3]]), want)
    b = batch_from_trajectories([[Trajectory(["a", "b"], [0, 1], SUCCESS, actions=[3, -1]),
                                  Trajectory(["a"], [0], FAILURE, actions=[3])]])
    np.testing.assert_array_equal(np.asarray(b.action_key)[0, 0, :2], want[0, :2])
    assert (want[0, 0] == want[0, 2]).all() and not (want[0, 0] == want[0, 1]).all()
