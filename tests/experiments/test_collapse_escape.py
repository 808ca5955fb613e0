"""experiments/collapse_escape.py: the credit split and the collapse pressure, by hand."""

import math

import numpy as np
import pytest

from bepo_jax.agent.train.setup import action_counts
from experiments.collapse_escape import credit_numbers


def test_pressure_and_credit_split_by_hand():
    # one group, K = 2, T = 4; the last step of trajectory 1 is padding, and trajectory 0's
    # third step an invalid parse (-1): neither counts
    actions = np.array([[[0, 0, 1, -1], [0, 0, 0, 2]]])
    valid = np.array([[[True, True, True, True], [True, True, True, False]]])
    success = np.array([[True, False]])
    adv = np.array([[[1.0, 1.0, 2.0, 9.0], [-1.0, -1.0, -1.0, 9.0]]])
    r = credit_numbers(adv, actions, valid, success, mode=0)
    # 6 counted steps, 5 on the mode: s* = 5/6; P = (sum over mode steps of A (1 - s*) + 2 (0 - s*)) / 6
    assert r["mode_share_batch"] == pytest.approx(5 / 6)
    assert r["pressure"] == pytest.approx(((1 + 1 - 1 - 1 - 1) / 6 - 2 * 5 / 6) / 6)
    assert r["pressure"] < 0  # the only off-mode step won, and the lost trajectory's mode steps are negative
    assert r["off_mode_steps"] == 1
    assert r["credit_mode_won"] == 1.0 and r["credit_mode_lost"] == -1.0 and r["credit_off_won"] == 2.0
    assert math.isnan(r["credit_off_lost"])
    # the same batch with the credit's sign flipped pushes into the mode
    assert credit_numbers(-adv, actions, valid, success, mode=0)["pressure"] == pytest.approx(-r["pressure"])
    np.testing.assert_array_equal(np.asarray(action_counts(actions, valid, 3)), [5, 1, 0])


def test_no_credit_no_pressure():
    actions = np.zeros((2, 3, 4), int)
    valid = np.ones((2, 3, 4), bool)
    r = credit_numbers(np.zeros((2, 3, 4)), actions, valid, np.zeros((2, 3), bool), mode=0)
    assert r["pressure"] == 0.0 and r["mode_share_batch"] == 1.0 and r["credit_std"] == 0.0
