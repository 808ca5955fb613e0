"""Multi-turn conversations -> step credit -> per-token advantages (bepo_jax.integrations.turns)."""

import numpy as np
import pytest

from bepo_jax import reference as ref
from bepo_jax.integrations.turns import Turn, group_step_advantages, outcome_code, token_advantages
from bepo_jax.types import FAILURE, SUCCESS, TRUNCATED

B_DEF = dict(gamma=0.95, lam=0.5, w=1.0, eta_gated=0.5, norm="mean_std", weighting="step", std="unbiased", eps=1e-6,
             min_successors=2, gate_on="successor", tol=1e-6, max_iters=1000)

# Four trajectories of a corridor: rooms repeat across and within trajectories.
PATHS = [(["room 2", "room 3"], [0.0, 1.0], True), (["room 2", "room 1", "room 2"], [0.0, 0.0, 0.0], False),
         (["room 2", "room 2", "room 3"], [0.0, 0.0, 1.0], True), (["room 2"], [0.0], False)]


def corridor_turns():
    return [[Turn(s, r, 3 + i, 2) for i, (s, r) in enumerate(zip(states, rewards))] for states, rewards, _ in PATHS]


def padded(turns, outcomes, rewards=None):
    """The same group as a padded NumPy batch for the reference (state ids as keys)."""
    ids = {}
    K, T = len(turns), max(len(t) for t in turns)
    obs = np.zeros((1, K, T, 2), np.uint32)
    reward = np.zeros((1, K, T), np.float32)
    mask = np.zeros((1, K, T), bool)
    for k, tr in enumerate(turns):
        for t, turn in enumerate(tr):
            obs[0, k, t, 0] = ids.setdefault(turn.state, len(ids) + 1)
            reward[0, k, t] = turn.reward if rewards is None else rewards[k][t]
            mask[0, k, t] = True
    return obs, reward, mask, np.asarray([outcomes], np.int32), np.zeros((1, K, T), np.float32)


def test_outcome_codes():
    assert outcome_code(True, 1.0) == SUCCESS
    assert outcome_code(True, 0.0) == FAILURE
    assert outcome_code(False, 5.0) == TRUNCATED


def test_step_advantages_equal_the_reference_on_the_same_trajectories():
    turns = corridor_turns()
    outcomes = [SUCCESS, TRUNCATED, SUCCESS, TRUNCATED]
    got, diag = group_step_advantages(turns, outcomes, "gated_bepo")
    want = ref.ref_gated_bepo(padded(turns, outcomes), **B_DEF)
    for k, tr in enumerate(turns):
        np.testing.assert_allclose(got[k], want["advantage"][0, k, :len(tr)], atol=1e-4)
    assert diag["states"] == 3 and diag["converged"] == 1.0
    assert 0.0 < diag["gated_share"] <= 1.0
    # a different estimator gives different credit on the same turns
    other, _ = group_step_advantages(turns, outcomes, "grpo")
    assert not all(np.allclose(a, b) for a, b in zip(got, other))


def test_totals_land_on_the_last_turn():
    turns = corridor_turns()
    outcomes = [SUCCESS, TRUNCATED, SUCCESS, TRUNCATED]
    totals = [3.0, 0.0, 1.0, -1.0]
    got, _ = group_step_advantages(turns, outcomes, "gated_bepo", {"lam": 0.25}, totals=totals)
    rewards = [[t.reward for t in tr] for tr in turns]
    for k, tot in enumerate(totals):
        rewards[k][-1] += tot - sum(t.reward for t in turns[k])
    want = ref.ref_gated_bepo(padded(turns, outcomes, rewards), **{**B_DEF, "lam": 0.25})["advantage"]
    for k, tr in enumerate(turns):
        np.testing.assert_allclose(got[k], want[0, k, :len(tr)], atol=1e-4)


def test_token_layout_follows_the_turns_and_the_mask():
    turns = [[Turn("a", 0.0, 2, 3), Turn("b", 1.0, 3, 0)], [Turn("a", 0.0, 4, 1)]]
    adv = [np.array([0.5, -1.0], np.float32), np.array([2.0], np.float32)]
    L = 9
    mask = np.zeros((2, L), np.int32)
    mask[0, :2] = 1     # turn 0 assistant
    mask[0, 5:8] = 1    # turn 1 assistant (positions 2-4 are the environment's reply)
    mask[1, :4] = 1
    got = token_advantages(turns, adv, mask)
    want = np.zeros((2, L), np.float32)
    want[0, :2], want[0, 5:8], want[1, :4] = 0.5, -1.0, 2.0
    np.testing.assert_array_equal(got, want)
    # cut at L, and a trajectory the trainer filtered (mask zeroed) gets nothing
    short = token_advantages(turns, adv, mask[:, :6])
    np.testing.assert_array_equal(short, want[:, :6])
    mask[1] = 0
    assert not token_advantages(turns, adv, mask)[1].any()


def test_bad_input_is_refused_with_the_field_named():
    turns = corridor_turns()
    with pytest.raises(ValueError, match="outcomes"):
        group_step_advantages(turns, [SUCCESS], "gated_bepo")
    with pytest.raises(ValueError, match="totals"):
        group_step_advantages(turns, [SUCCESS] * 4, "gated_bepo", totals=[1.0])
    with pytest.raises(ValueError, match="Turn.state must be a string"):
        group_step_advantages([[Turn(3, 0.0, 1, 0)]], [SUCCESS], "gated_bepo")
    with pytest.raises(ValueError, match="unknown estimator"):
        group_step_advantages(turns, [SUCCESS] * 4, "gated-bepo")
    with pytest.raises(ValueError, match="mask has 1 rows"):
        token_advantages(turns, [np.zeros(len(t)) for t in turns], np.ones((1, 4)))


def test_trajectories_without_turns_take_no_part():
    turns = corridor_turns()
    outcomes = [SUCCESS, TRUNCATED, SUCCESS, TRUNCATED]
    with_empty, _ = group_step_advantages(turns + [[]], outcomes + [TRUNCATED], "gated_bepo")
    without, _ = group_step_advantages(turns, outcomes, "gated_bepo")
    assert len(with_empty[-1]) == 0
    for a, b in zip(with_empty, without):
        np.testing.assert_array_equal(a, b)
    alone, diag = group_step_advantages([turns[0], [], []], [SUCCESS, TRUNCATED, TRUNCATED], "gated_bepo")
    assert diag == {} and not alone[0].any() and len(alone[0]) == 2
