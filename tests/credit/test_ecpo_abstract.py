"""ECPO as this project reconstructed it from the abstract (``ecpo_abstract``, kept for stored results; no code or
equations of the authors were reachable then): against a record-by-record loop written from docs/estimators.md
(reference.ref_ecpo_abstract), a worked example by hand, GiGPO as its limit (no shrinkage, no gate, one record
per action), and the gate's closed cases (one action at an anchor; no action key)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, ECPOAbstractConfig
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories
from bepo_jax.credit.reference import ref_ecpo_abstract

from tests.helpers import assert_close
from tests.strategies import batches


def _with_actions(batch, np_batch, seed, n_actions):
    """The batch with random action keys drawn from ``n_actions`` symbols (few: actions repeat)."""
    rng = np.random.default_rng(seed)
    table = rng.choice(2**32, size=(n_actions * 2,), replace=False).astype(np.uint32).reshape(n_actions, 2)
    keys = table[rng.integers(0, n_actions, np.shape(batch.mask))]
    return dataclasses.replace(batch, action_key=keys), keys


@given(data=batches(), seed=st.integers(0, 2**31), n_actions=st.integers(1, 3), with_key=st.booleans(),
       gate=st.sampled_from(["ratio", "threshold", "none"]), anchor=st.sampled_from(["rows", "actions"]),
       kappa=st.sampled_from([0.0, 1.0, 2.5]), norm=st.sampled_from(["mean", "mean_std"]))
def test_ecpo_matches_a_record_loop(data, seed, n_actions, with_key, gate, anchor, kappa, norm):
    batch, np_batch = data
    actions = None
    if with_key:
        batch, actions = _with_actions(batch, np_batch, seed, n_actions)
    cfg = ECPOAbstractConfig(gate=gate, tau=0.37, anchor=anchor, kappa=kappa, norm=norm)
    want = ref_ecpo_abstract(np_batch, actions, gate=gate, tau=0.37, anchor=anchor, kappa=kappa, norm=norm)
    assert_close(bj.ecpo_abstract(batch, cfg).advantage, want, what=f"ecpo {gate} {anchor} {kappa} {norm}", rtol=3e-4)


def _worked():
    # anchor "a": trajectories 0 and 2 go to "b", 1 to "c"; "b" then succeeds once (10) and fails once
    return batch_from_trajectories([[Trajectory(["a", "b"], [0, 10], SUCCESS), Trajectory(["a", "c"], [0, 0], FAILURE),
                                     Trajectory(["a", "b"], [0, 0], FAILURE)]])


def test_worked_example_by_hand():
    out = bj.ecpo_abstract(_worked())  # no action key: the successor is the action
    # at "a": y = 9.5, 0, 0 (gamma 0.95); mean 19/6; action b: n 2, mean 4.75; action c: n 1, mean 0
    mean_a = 9.5 / 3
    shrunk_b, shrunk_c = 2 / 3 * (4.75 - mean_a), 1 / 2 * (0 - mean_a)
    between = (2 * (4.75 - mean_a) ** 2 + mean_a ** 2) / 3
    within = 2 * 4.75 ** 2 / 3
    rho = between / (between + within)
    assert rho == pytest.approx(0.25)
    np.testing.assert_allclose(np.asarray(out.a_step)[0, :, 0], [shrunk_b, shrunk_c, shrunk_b], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.gate)[0, :, 0], [rho] * 3, rtol=1e-6)
    # at "b": y = 10 and 0 by two different successors (END[SUCCESS], END[FAILURE]): W = 0, the gate opens fully
    np.testing.assert_allclose(np.asarray(out.gate)[0, [0, 2], 1], [1.0, 1.0])
    np.testing.assert_allclose(np.asarray(out.a_step)[0, [0, 2], 1], [0.5 * 5, -0.5 * 5], rtol=1e-6)
    grpo = np.asarray(bj.grpo(_worked(), bj.GRPOConfig(norm="mean")).advantage)  # the outcome term as GiGPO's
    np.testing.assert_allclose(np.asarray(out.advantage), grpo + np.asarray(out.gate) * np.asarray(out.a_step),
                               rtol=1e-6, atol=1e-6)


def test_one_action_at_an_anchor_gives_no_step_credit():
    # the same action at "a" in every trajectory (its returns differ later): B = 0, nothing to credit
    b = _worked()
    b = dataclasses.replace(b, action_key=bj.action_keys([[["go", "x"], ["go", "y"], ["go", "x"]]]))
    out = bj.ecpo_abstract(b)
    assert np.all(np.asarray(out.a_step)[0, :, 0] == 0) and np.all(np.asarray(out.gate)[0, :, 0] == 0)
    # action texts in other spellings are the same canonical action
    b2 = dataclasses.replace(b, action_key=bj.action_keys([[["Go", "x"], [" go ", "y"], ["GO", "x"]]]))
    np.testing.assert_array_equal(np.asarray(bj.ecpo_abstract(b2).advantage), np.asarray(out.advantage))


@given(data=batches())
def test_without_shrinkage_or_gate_one_record_per_action_is_gigpo(data):
    batch, np_batch = data
    B, K, T = np.shape(batch.mask)
    distinct = np.arange(B * K * T, dtype=np.uint32).reshape(B, K, T)
    keys = np.stack([distinct, distinct ^ np.uint32(0xABCDEF)], axis=-1)
    cfg = ECPOAbstractConfig(kappa=0.0, gate="none")
    got = bj.ecpo_abstract(dataclasses.replace(batch, action_key=keys), cfg).advantage
    # GiGPO's step term over anchors with >= 2 records equals the action-mean term when every action is its own
    assert_close(got, bj.gigpo(batch).advantage, what="ecpo limit vs gigpo", rtol=3e-4)


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="action_key"):
        bj.ecpo_abstract(_worked(), ECPOAbstractConfig(action_from="action_key"))
    for field, value in (("kappa", -1.0), ("gate", "soft"), ("tau", 1.5), ("anchor", "median"), ("action_from", "x")):
        with pytest.raises(ValueError, match=field):
            ECPOAbstractConfig(**{field: value})
    b = _worked()
    with pytest.raises(ValueError, match="action_key"):
        bj.ecpo_abstract(dataclasses.replace(b, action_key=np.zeros((1, 3, 2, 2), np.int64)))
    with pytest.raises(ValueError, match="action_key"):
        bj.ecpo_abstract(dataclasses.replace(b, action_key=np.zeros((1, 3, 3, 2), np.uint32)))


def test_the_jitted_kernel_takes_batches_with_and_without_keys():
    b = _worked()
    keyed = dataclasses.replace(b, action_key=bj.action_keys([[["n", "n"], ["s", "x"], ["n", "y"]]]))
    # keys that mirror the successors give the successor proxy's numbers
    np.testing.assert_allclose(np.asarray(bj.ecpo_abstract_kernel(bj.check_batch(keyed), ECPOAbstractConfig()).advantage),
                               np.asarray(bj.ecpo_abstract(b).advantage), rtol=1e-6)
    # the successor mode ignores a key that disagrees with it
    other = dataclasses.replace(b, action_key=bj.action_keys([[["n", "n"], ["n", "x"], ["n", "y"]]]))
    np.testing.assert_allclose(np.asarray(bj.ecpo_abstract(other, ECPOAbstractConfig(action_from="successor")).advantage),
                               np.asarray(bj.ecpo_abstract(b).advantage), rtol=1e-6)
    assert not np.allclose(np.asarray(bj.ecpo_abstract(other).advantage), np.asarray(bj.ecpo_abstract(b).advantage))
