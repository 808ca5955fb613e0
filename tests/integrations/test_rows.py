"""Row layout (verl-agent style) <-> StepBatch, and GiGPO on rows equal to verl-agent's loops."""

import math
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, GiGPOConfig, GRPOConfig
from bepo_jax.credit.reference import HGPO_RESIDUE


def verl_gigpo_rows(uid, traj_uid, obs, episode_reward, step_return, *, mean_std, eps=1e-6, omega=1.0):
    """verl-agent's ``episode_norm_reward`` (compute_mean_std_cross_steps=True) and
    ``step_norm_reward``, as loops over rows (torch.std is unbiased)."""

    def norm(ids, scores, singleton_mean_zero):
        by = defaultdict(list)
        for i, s in zip(ids, scores):
            by[i].append(s)
        out = []
        for i, s in zip(ids, scores):
            vals = by[i]
            if len(vals) == 1:
                mu, sd = (0.0 if singleton_mean_zero else vals[0]), 1.0
            else:
                mu = sum(vals) / len(vals)
                sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1))
            out.append((s - mu) / (sd + eps) if mean_std else s - mu)
        return np.array(out)

    a_ep = norm(list(uid), list(episode_reward), True)
    a_st = norm([(u, o) for u, o in zip(uid, obs)], list(step_return), False)
    return a_ep + omega * a_st


def row_returns(rows, gamma):
    """verl-agent's row fields, per row: the episode score R_k + penalty_i, the step return
    G_i + penalty_i, and the trajectory's observations up to the row."""
    by_traj = defaultdict(list)
    for i, r in enumerate(rows):
        by_traj[r["traj"]].append(i)
    ep, sr, hist = np.zeros(len(rows)), np.zeros(len(rows)), {}
    for ids in by_traj.values():
        ids = sorted(ids, key=lambda i: rows[i]["step"])
        R = sum(float(np.float32(rows[i]["reward"])) for i in ids)
        G = 0.0
        for i in reversed(ids):
            G = float(np.float32(rows[i]["reward"])) + gamma * G
            sr[i] = G + float(np.float32(rows[i]["penalty"]))
            ep[i] = R + float(np.float32(rows[i]["penalty"]))
        for pos, i in enumerate(ids):
            hist[i] = [rows[j]["obs"] for j in ids[: pos + 1]]
    return ep, sr, hist


@st.composite
def row_sets(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = []
    n_groups = int(rng.integers(1, 4))
    for g in range(n_groups):
        for k in range(int(rng.integers(2, 5))):  # ragged groups (>= 2 trajectories: one alone is refused)
            L = int(rng.integers(1, 6))
            outcome = int(rng.integers(0, 3))
            rewards = rng.choice([0.0, 0.0, 1.0, 10.0], L)
            pens = rng.choice([0.0, -0.1], L)
            for t in range(L):
                rows.append(dict(uid=f"task{g}", traj=f"g{g}t{k}", step=t, obs=f"o{rng.integers(0, 4)}",
                                 reward=rewards[t], outcome=outcome, penalty=pens[t]))
    order = rng.permutation(len(rows))  # shuffled row order
    return [rows[i] for i in order]


def _columns(rows):
    return {c: [r[c] for r in rows] for c in rows[0]}


@given(rows=row_sets())
def test_round_trip_rows_batch_rows_is_exact(rows):
    c = _columns(rows)
    batch, index = bj.from_rows(c["uid"], c["traj"], np.array(c["step"]), c["obs"], np.array(c["reward"], np.float32),
                                np.array(c["outcome"]), np.array(c["penalty"], np.float32))
    np.testing.assert_array_equal(bj.to_rows(batch.reward, index), np.array(c["reward"], np.float32))
    np.testing.assert_array_equal(bj.to_rows(batch.penalty, index), np.array(c["penalty"], np.float32))
    np.testing.assert_array_equal(bj.to_rows(batch.mask, index), True)
    assert int(np.asarray(batch.mask).sum()) == len(rows)
    keys = bj.to_rows(batch.obs_key, index)  # the vectorised string hash: equal strings <-> equal keys
    same_obs = np.array(c["obs"], dtype=object)[:, None] == np.array(c["obs"], dtype=object)[None]
    same_key = np.all(keys[:, None] == keys[None], axis=-1)
    np.testing.assert_array_equal(same_key, same_obs)
    for i, r in enumerate(rows):
        assert index.groups[index.b[i]] == r["uid"] and index.trajectories[index.b[i], index.k[i]] == r["traj"]
        assert int(np.asarray(batch.outcome)[index.b[i], index.k[i]]) == r["outcome"]


@pytest.mark.parametrize("mean_std", [False, True])
@given(rows=row_sets(), gamma=st.sampled_from([0.5, 0.95]))
def test_row_gigpo_equals_verl_agent_loops(rows, mean_std, gamma):
    c = _columns(rows)
    batch, index = bj.from_rows(c["uid"], c["traj"], np.array(c["step"]), c["obs"], np.array(c["reward"], np.float32),
                                np.array(c["outcome"]), np.array(c["penalty"], np.float32), shape=(3, 4, 5))
    assert batch.mask.shape == (3, 4, 5)
    norm = "mean_std" if mean_std else "mean"
    got = bj.to_rows(bj.gigpo(batch, GiGPOConfig(gamma=gamma, norm=norm)).advantage, index)
    ep, sr, _ = row_returns(rows, gamma)
    want = verl_gigpo_rows(c["uid"], c["traj"], c["obs"], ep, sr, mean_std=mean_std)
    scale = max(1.0, np.abs(want).max())
    assert np.abs(got - want).max() <= 1e-4 * scale


def test_row_layout_spec_vectors():
    # step returns [10, 0, 5], keys [a, a, b], mean norm, zero episode rewards -> [5, -5, 0]
    batch, index = bj.from_rows(["u"] * 3, ["t1", "t2", "t3"], np.zeros(3, int), ["a", "a", "b"],
                                np.array([10.0, 0.0, 5.0], np.float32), np.array([SUCCESS, FAILURE, FAILURE]))
    np.testing.assert_allclose(bj.to_rows(bj.gigpo(batch).a_step, index), [5, -5, 0], atol=1e-6)
    # failed 1-step and successful 3-step trajectories (reward 1), step weighting, mean_std -> [-1.5, .5, .5, .5]
    batch, index = bj.from_rows(["u"] * 4, ["f", "s", "s", "s"], np.array([0, 2, 0, 1]), ["x", "z", "x", "y"],
                                np.array([0, 1, 0, 0], np.float32), np.array([1, 0, 0, 0]))
    np.testing.assert_allclose(bj.to_rows(bj.grpo(batch, GRPOConfig()).advantage, index), [-1.5, 0.5, 0.5, 0.5],
                               atol=1e-5)


BAD_ROWS = [
    (dict(step=[0, 0]), "step 0 of trajectory 'a' appears twice"),
    (dict(step=[0, 2]), "has step 2 but its trajectory 'a' has 2 rows"),
    (dict(outcome=[0, 1]), "trajectory 'a' has two outcomes"),
    (dict(outcome=[5, 5]), "outcome 5"),
    (dict(reward=[0.0]), "reward has 1 rows, expected 2"),
    (dict(step=[0.0, 1.0]), "step has dtype float64"),
]


@pytest.mark.parametrize("change,message", BAD_ROWS)
def test_bad_rows(change, message):
    cols = dict(uid=["u", "u"], traj_uid=["a", "a"], step=[0, 1], obs_key=["x", "y"], reward=[0.0, 1.0], outcome=[0, 0])
    cols.update(change)
    cols = {k: np.asarray(v) if k in ("step", "reward", "outcome") else v for k, v in cols.items()}
    with pytest.raises(ValueError, match=message):
        bj.from_rows(**cols)


def test_traj_uid_in_two_groups_is_an_error():
    with pytest.raises(ValueError, match="appears in two groups"):
        bj.from_rows(["u", "v"], ["a", "a"], np.array([0, 1]), ["x", "y"], np.zeros(2), np.zeros(2, int))


def test_shape_too_small_is_an_error():
    with pytest.raises(ValueError, match=r"need shape at least \(1, 2, 1\)"):
        bj.from_rows(["u", "u"], ["a", "b"], np.array([0, 0]), ["x", "y"], np.zeros(2), np.zeros(2, int), shape=(1, 1, 1))


def test_to_rows_shape_error():
    batch, index = bj.from_rows(["u"], ["a"], np.array([0]), ["x"], np.zeros(1), np.zeros(1, int))
    with pytest.raises(ValueError, match="expected \\(1, 1, 1\\)"):
        bj.to_rows(np.zeros((2, 1, 1)), index)


def test_single_trajectory_group_is_refused_on_the_host_and_flagged_inside():
    uid, traj, step = ["u0", "u1", "u1"], ["a", "b", "c"], np.array([0, 0, 0])
    obs, reward, outcome = ["x", "x", "z"], np.array([1.0, 0.0, 1.0], np.float32), np.array([0, 1, 0])
    batch, index = bj.from_rows(uid, traj, step, obs, reward, outcome)
    with pytest.raises(ValueError, match="group 0 has a single non-empty trajectory"):
        bj.gigpo(batch)
    out = bj.gigpo(batch, check=False)  # verl-agent's singleton rule, flagged
    assert list(np.asarray(out.diagnostics.invalid)) == [bj.SINGLE_TRAJECTORY, 0]
    np.testing.assert_allclose(bj.to_rows(out.a_episode, index)[:1], [1.0], rtol=1e-5)  # n = 1: mu = 0, sigma = 1


@pytest.mark.parametrize("won", [np.array([True, False]), [True, False]])
def test_from_rows_refuses_boolean_outcomes(won):
    with pytest.raises(ValueError, match="booleans"):
        bj.from_rows(["u", "u"], ["a", "b"], np.array([0, 0]), ["x", "x"], np.array([1.0, 0.0]), won)


# A case hypothesis found: a level-1 group of task0 whose mean equals one member's return exactly
# (0 in exact arithmetic, float residue otherwise): HGPO must drop that item (uid, traj, step, obs,
# reward, outcome, penalty).
RESIDUE_CASE = [dict(zip(("uid", "traj", "step", "obs", "reward", "outcome", "penalty"), r)) for r in [
    ('task0', 'g0t1', 0, 'o3', 0.0, 2, 0.0),
    ('task1', 'g1t0', 2, 'o0', 1.0, 0, -0.1),
    ('task0', 'g0t0', 2, 'o3', 0.0, 0, -0.1),
    ('task1', 'g1t0', 3, 'o2', 0.0, 0, -0.1),
    ('task1', 'g1t1', 0, 'o1', 10.0, 1, 0.0),
    ('task1', 'g1t0', 0, 'o3', 1.0, 0, 0.0),
    ('task0', 'g0t0', 1, 'o2', 0.0, 0, -0.1),
    ('task0', 'g0t1', 1, 'o3', 1.0, 2, 0.0),
    ('task0', 'g0t0', 0, 'o2', 10.0, 0, 0.0),
    ('task0', 'g0t0', 4, 'o0', 0.0, 0, 0.0),
    ('task0', 'g0t0', 3, 'o3', 1.0, 0, 0.0),
    ('task1', 'g1t1', 1, 'o2', 10.0, 1, 0.0),
    ('task1', 'g1t0', 1, 'o0', 0.0, 0, -0.1),
    ('task0', 'g0t1', 2, 'o0', 0.0, 2, 0.0),
]]


def residue(v, mu):
    """HGPO's rule for an exact 0 (docs/estimators.md): |v - mu| within 16 float32 ulps of |v| + |mu|
    (the reference's constant, ``bepo_jax.credit.reference.HGPO_RESIDUE``)."""
    return np.abs(v - mu) <= HGPO_RESIDUE * (np.abs(v) + np.abs(mu))


@pytest.mark.parametrize("history_length,base_group", [(0, False), (2, False), (2, True)])
@given(rows=row_sets(), gamma=st.sampled_from([0.5, 0.95]))
@example(rows=RESIDUE_CASE, gamma=0.95)
def test_row_hgpo_equals_the_recipe_loops(rows, history_length, base_group, gamma):
    """HGPO through from_rows / to_rows equals a loop over rows in the recipe's style:
    groups keyed by (k, the trajectory's last k observations) inside each uid. The recipe drops
    items that are exactly 0; a deviation that is 0 in exact arithmetic leaves float rounding
    residue, so, as docs/estimators.md states the rule, a deviation within 16 float32 ulps of
    |y| + |mu| counts as 0 (found by this test: a level mean that equalled one member's return)."""
    c = _columns(rows)
    batch, index = bj.from_rows(c["uid"], c["traj"], np.array(c["step"]), c["obs"], np.array(c["reward"], np.float32),
                                np.array(c["outcome"]), np.array(c["penalty"], np.float32), shape=(3, 4, 5))
    cfg = bj.HGPOConfig(history_length=history_length, base_group=base_group, gamma=gamma)
    got = bj.to_rows(bj.compute_advantages("hgpo", batch, cfg).advantage, index)
    ep, y, hist = row_returns(rows, gamma)
    base = verl_gigpo_rows(c["uid"], c["traj"], c["obs"], ep, y, mean_std=True, omega=0.0)
    clusters = defaultdict(list)
    for i, r in enumerate(rows):
        for k in range(1, min(history_length + 1, len(hist[i])) + 1):
            clusters[(r["uid"], k, tuple(hist[i][-k:]))].append(i)
    items = defaultdict(list)
    for (_, k, _), members in clusters.items():
        if len(members) < 2:
            continue
        vals = np.array([y[i] for i in members])
        dev = np.where(residue(vals, vals.mean()), 0.0, vals - vals.mean())
        for i, a in zip(members, dev / (vals.std() + 1e-6)):
            items[i].append((k, a))
    for u in set(c["uid"]):  # the base item's residue: the episode score against its group's mean
        rows_u = [i for i in range(len(rows)) if c["uid"][i] == u]
        base[rows_u] = np.where(residue(ep[rows_u], ep[rows_u].mean()), 0.0, base[rows_u])
    want = np.zeros(len(rows))
    for i in range(len(rows)):
        its = [(k, a) for k, a in ([(0, base[i])] if base_group else []) + items[i] if a != 0]
        if its:
            w = np.array([(k + 1.0) for k, _ in its])
            want[i] = float((w * np.array([a for _, a in its])).sum() / (w.sum() + 1e-6))
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("obs", [
    ["a", "a\x00", "a", "ab", "abc", ""],                        # NUL: falls back to the per-row digest
    [b"a", b"ab", b"a", b"", b"abc", b"ab"],                      # bytes: the vectorised pass
    ["x", "xy", "x", "é√", "é√", "xy"],                          # non-ASCII code points
    ["1", b"1", np.array([1], np.int32), "1", b"1", np.array([1], np.int64)],  # mixed types: per row, typed
])
def test_observation_keys_are_equal_exactly_when_observations_are(obs):
    n = len(obs)
    batch, index = bj.from_rows(["g"] * n, [f"t{i % 2}" for i in range(n)], [i // 2 for i in range(n)], obs,
                                np.zeros(n, np.float32), np.full(n, bj.FAILURE))
    keys = bj.to_rows(batch.obs_key, index)
    def same(a, b):
        return type(a) is type(b) and (np.array_equal(a, b) and a.dtype == b.dtype if isinstance(a, np.ndarray) else a == b)
    for i in range(n):
        for j in range(n):
            assert bool(np.all(keys[i] == keys[j])) == same(obs[i], obs[j]), (obs[i], obs[j])


def test_from_rows_merges_similar_observations_for_any_estimator():
    from bepo_jax.agent.envs.text import encode
    from bepo_jax.credit.similarity import SimilarityConfig

    a = "you are in the kitchen. there is a red apple on the table and a knife."
    texts = {"a": a, "a2": a.replace("knife", "knive"), "b": "the cellar is dark and damp. a chest stands there."}
    rows = [("t0", 0, "a", 0.0), ("t0", 1, "b", 10.0), ("t1", 0, "a2", 0.0), ("t1", 1, "b", 0.0)]
    tok = np.zeros((4, 96), np.int32)
    for i, r in enumerate(rows):
        e = encode(texts[r[2]])
        tok[i, :len(e)] = e
    cols = dict(uid=["g"] * 4, traj_uid=[r[0] for r in rows], step=[r[1] for r in rows],
                obs_key=[texts[r[2]] for r in rows], reward=np.array([r[3] for r in rows], np.float32),
                outcome=np.array([bj.SUCCESS, bj.SUCCESS, bj.FAILURE, bj.FAILURE]))
    exact, _ = bj.from_rows(**cols)
    merged, index = bj.from_rows(**cols, obs_tokens=tok, similarity=SimilarityConfig(threshold=0.8))
    assert index.obs_tokens.shape == (1, 2, 2, 96)
    k_exact, k_merged = bj.to_rows(exact.obs_key, index), bj.to_rows(merged.obs_key, index)
    assert not np.array_equal(k_exact[0], k_exact[2]) and np.array_equal(k_merged[0], k_merged[2])
    for name in ("gigpo", "hgpo"):  # (Gated-BEPO's gate stays closed here: one successor, b)
        a_s = bj.to_rows(bj.compute_advantages(name, merged).advantage, index)
        a_e = bj.to_rows(bj.compute_advantages(name, exact).advantage, index)
        assert not np.allclose(a_s, a_e), name  # the merged start state changes the step credit
    with pytest.raises(ValueError, match="needs obs_tokens"):
        bj.from_rows(**cols, similarity=SimilarityConfig())
