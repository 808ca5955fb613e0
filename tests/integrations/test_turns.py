"""Multi-turn conversations -> step credit -> per-token advantages (bepo_jax.integrations.turns)."""

import numpy as np
import pytest

from bepo_jax.credit import reference as ref
from bepo_jax.integrations.turns import (Turn, add_trajectory_reward, bucket, credit_for_groups, group_step_advantages,
                                         outcome_of, token_advantages)
from bepo_jax.credit.types import FAILURE, SUCCESS, TRUNCATED

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
    assert outcome_of("env", True) == SUCCESS
    assert outcome_of("env", False) == FAILURE
    for limit in ("step_limit", "context_limit", "time_limit", "env_timeout"):
        assert outcome_of(limit, True) == TRUNCATED  # a limit, not the environment, ended it
    with pytest.raises(ValueError, match="ending='done'"):
        outcome_of("done", True)


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


def test_turns_with_actions_give_ecpo_the_action_keys():
    import dataclasses

    import bepo_jax as bj
    from bepo_jax.credit.builders import Trajectory, batch_from_trajectories

    acts = [["Go East", "take"], ["go east", "go west", "go east"], ["look", "go east", "take"], ["go  EAST"]]
    turns = [[t._replace(action=a) for t, a in zip(tr, ac)] for tr, ac in zip(corridor_turns(), acts)]
    outcomes = [SUCCESS, TRUNCATED, SUCCESS, TRUNCATED]
    got, _ = credit_for_groups([turns], [outcomes], "ecpo", buckets=False)
    # the same trajectories built independently, their actions canonicalised and hashed by the builder
    b = batch_from_trajectories([[Trajectory(st, rw, o, actions=ac) for (st, rw, _), o, ac in zip(PATHS, outcomes, acts)]])
    want = np.asarray(bj.ecpo(b).advantage)[0]
    for k, tr in enumerate(turns):
        np.testing.assert_allclose(got[0][k], want[k, :len(tr)], atol=1e-5)
    # without actions ECPO's action is the successor, which here differs from the texts' grouping
    plain, _ = credit_for_groups([corridor_turns()], [outcomes], "ecpo", buckets=False)
    nokey = np.asarray(bj.ecpo(dataclasses.replace(b, action_key=None)).advantage)[0]
    for k, tr in enumerate(turns):
        np.testing.assert_allclose(plain[0][k], nokey[k, :len(tr)], atol=1e-5)
    assert not all(np.allclose(a, p) for a, p in zip(got[0], plain[0]))


def test_proxmo_groups_the_turns_by_their_texts():
    """ProxMO's soft grouping reads the turns' state texts (their TF-IDF), as its authors' code does: in the
    corridor every room's text is "room" plus a lone digit, which the TF-IDF drops, so every turn is near
    every other; the row loop from the official code on the same texts gives the same credit (padded to
    buckets), and hashed states alone would give other credit."""
    pytest.importorskip("sklearn")
    turns = corridor_turns()
    outcomes = [SUCCESS, TRUNCATED, SUCCESS, TRUNCATED]
    got, _ = credit_for_groups([turns], [outcomes], "proxmo")
    texts = [[states for states, _, _ in PATHS]]
    want = ref.ref_proxmo(padded(turns, outcomes), texts)
    hashed = ref.ref_proxmo(padded(turns, outcomes))
    for k, tr in enumerate(turns):
        np.testing.assert_allclose(got[0][k], want[0, k, :len(tr)], atol=1e-5)
    assert not all(np.allclose(want[0, k, :len(tr)], hashed[0, k, :len(tr)], atol=1e-3) for k, tr in enumerate(turns))


def test_a_trajectory_reward_lands_on_the_turn_asked_for():
    turns = corridor_turns()
    outcomes = [SUCCESS, TRUNCATED, SUCCESS, TRUNCATED]
    extra = [2.0, 0.0, -1.0, 0.5]
    for where in ("first", "last"):
        moved = [add_trajectory_reward(tr, x, turn=where) for tr, x in zip(turns, extra)]
        got, _ = group_step_advantages(moved, outcomes, "gated_bepo", {"lam": 0.25})
        rewards = [[t.reward for t in tr] for tr in turns]
        for k, x in enumerate(extra):
            rewards[k][0 if where == "first" else -1] += x
        want = ref.ref_gated_bepo(padded(turns, outcomes, rewards), **{**B_DEF, "lam": 0.25})["advantage"]
        for k, tr in enumerate(turns):
            np.testing.assert_allclose(got[k], want[0, k, :len(tr)], atol=1e-4)
    assert add_trajectory_reward([], 1.0) == []
    with pytest.raises(ValueError, match="turn='middle'"):
        add_trajectory_reward(turns[0], 1.0, turn="middle")


def test_many_groups_in_one_call_equal_each_group_alone():
    """One bucketed estimator call over groups of different sizes gives each group the
    reference's credit on that group alone (padding changes nothing)."""
    g1 = corridor_turns()
    o1 = [SUCCESS, TRUNCATED, SUCCESS, TRUNCATED]
    g2 = [[Turn("room 2", 0.0, 1, 1), Turn("room 1", 0.5, 1, 0)], [Turn("room 2", 0.0, 2, 0)],
          [Turn("room 2", 1.0, 1, 0)]]
    o2 = [FAILURE, TRUNCATED, SUCCESS]
    g3 = [[Turn("x", 1.0, 1, 0)], []]  # one trajectory with turns: nothing to compare
    for buckets in (True, False):
        got, info = credit_for_groups([g1, g2, g3], [o1, o2, [SUCCESS, TRUNCATED]], "gated_bepo", buckets=buckets)
        for g, (turns, outs) in enumerate(((g1, o1), (g2, o2))):
            want = ref.ref_gated_bepo(padded(turns, outs), **B_DEF)["advantage"][0]
            for k, tr in enumerate(turns):
                np.testing.assert_allclose(got[g][k], want[k, :len(tr)], atol=1e-4)
        assert info[0]["states"] == 3 and info[1]["states"] == 2 and info[2] == {}
        assert not got[2][0].any() and len(got[2][1]) == 0
    assert [bucket(n) for n in (0, 1, 3, 4, 5)] == [1, 1, 4, 4, 8] and bucket(3, 8) == 8


def test_similarity_merges_nearly_equal_states():
    turns = [[Turn("you are in room 2 of 3", 0.0, 1, 0), Turn("room 3", 1.0, 1, 0)],
             [Turn("you are in room 2 of 3.", 0.0, 1, 0), Turn("room 1", 0.0, 1, 0)]]
    from bepo_jax.credit.similarity import SimilarityConfig

    _, exact = group_step_advantages(turns, [SUCCESS, FAILURE], "gated_bepo")
    _, merged = group_step_advantages(turns, [SUCCESS, FAILURE], "gated_bepo", similarity=SimilarityConfig(threshold=0.8))
    assert exact["states"] == 4 and merged["states"] == 3


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
    with pytest.raises(ValueError, match="2 groups but 1 outcome lists"):
        credit_for_groups([turns, turns], [[SUCCESS] * 4], "gated_bepo")
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


def test_a_bucket_watch_counts_overflows_and_the_compiles_they_cost():
    from bepo_jax.credit.similarity import SimilarityConfig
    from bepo_jax.integrations.turns import BucketWatch

    def group(state_len, seed):
        rng = np.random.default_rng(seed)
        word = lambda: "".join(rng.choice(list("abcdefgh"), state_len))
        a, b, c = word(), word(), word()
        return [[Turn(a, 0.0, 3, 2), Turn(b, 1.0, 3, 0)], [Turn(a, 0.0, 3, 2), Turn(c, 0.0, 3, 0)]]

    watch, sim = BucketWatch(), SimilarityConfig(threshold=0.9)
    call = lambda groups: credit_for_groups(groups, [[SUCCESS, FAILURE]] * len(groups), "gated_bepo", watch=watch,
                                            similarity=sim, min_shape=(1, 2, 4))
    call([group(10, 0)])  # warm-up: every program compiles once
    assert watch.calls == 1 and watch.compiles > 0 and not watch.last
    call([group(12, 1)])  # the same buckets: no overflow, no compile
    assert not watch.last and watch.compiles_after_warmup == 0
    # much longer states (a width no other test hashes, so JAX's process-wide cache cannot hold its
    # programs): the hashing and the similarity widths overflow, and compile
    call([group(12_000, 2)])
    assert set(watch.last) == {"state_words", "similarity_width"}
    assert watch.last["state_words"] == (1 + 12_000 // 4, 4096) and watch.last["similarity_width"] == (12_000, 16384)
    assert watch.compiles_after_warmup > 0
    call([group(12, s) for s in range(3)])  # 3 groups (bucket 4): the batch shape overflows
    assert set(watch.last) == {"groups"} and watch.last["groups"] == (3, 4)
    call([group(12, s) for s in range(4)])  # 4 groups fit that bucket: nothing new
    assert not watch.last and watch.overflows == {"state_words": 1, "similarity_width": 1, "groups": 1}
    assert "state_fn" in watch.hint("state_words")
