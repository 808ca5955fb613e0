"""Similarity merging (bepo_jax.credit.similarity): signatures, the Jaccard estimate, leader
clustering against a plain loop of the reference rule, and merging under every graph estimator."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bepo_jax as bj
from bepo_jax.credit.reference import ref_leader_clusters
from bepo_jax.agent.envs.text import ALPHABET, encode
from bepo_jax.credit.similarity import (THRESHOLD_SCALE, SimilarityConfig, jaccard_estimate, leader_clusters,
                                 merge_similar, minhash_signatures, similarity_clusters)

BASE = ["you are in the kitchen. there is a red apple on the table and a knife.",
        "you are in the garden. a hose lies on the grass near the old shed here.",
        "the cellar is dark and damp. a wooden chest stands in the corner, closed.",
        "you are carrying: a brass key, a torn map and an empty bottle of water."]


def _tokens(strings, width=96):
    out = np.zeros((len(strings), width), np.int32)
    for i, s in enumerate(strings):
        e = encode(s)[:width]
        out[i, :len(e)] = e
    return out


def _edit(s, rng, n_edits):
    chars = list(s)
    for _ in range(n_edits):
        chars[rng.integers(len(chars))] = ALPHABET[rng.integers(26)]
    return "".join(chars)


def _grams(s, n=3):
    return {s[i:i + n] for i in range(len(s) - n + 1)} if len(s) >= n else ({s} if s else set())


def _ref_leaders(sigs, valid, threshold):
    """The reference rule as a loop over the documented similarity decision:
    both * 65536 >= round(threshold * 65536) * either."""
    sigs = np.asarray(sigs)
    empty = sigs == 0xFFFFFFFF
    q = int(np.round(np.float32(threshold) * THRESHOLD_SCALE))

    def similar(i, j):
        both = int(np.sum((sigs[i] == sigs[j]) & ~empty[j]))
        either = int(np.sum(~(empty[i] & empty[j])))
        return either == 0 or both * THRESHOLD_SCALE >= q * either

    return ref_leader_clusters(len(sigs), similar, valid)


def test_estimate_tracks_the_exact_jaccard_of_the_ngram_sets():
    rng = np.random.default_rng(0)
    a_strs, b_strs, exact = [], [], []
    for _ in range(200):
        a = BASE[rng.integers(len(BASE))]
        b = _edit(a, rng, int(rng.integers(0, 12))) if rng.random() < 0.8 else BASE[rng.integers(len(BASE))]
        a_strs.append(a)
        b_strs.append(b)
        ga, gb = _grams(a), _grams(b)
        exact.append(len(ga & gb) / len(ga | gb))
    cfg = SimilarityConfig(num_bins=64)
    ta, tb = _tokens(a_strs), _tokens(b_strs)
    est = np.asarray(jaccard_estimate(minhash_signatures(ta, ta != 0, cfg), minhash_signatures(tb, tb != 0, cfg)))
    exact = np.asarray(exact)
    assert np.all(est[exact == 1.0] == 1.0)
    se = np.sqrt(exact * (1 - exact) / cfg.num_bins) + 1e-9
    assert np.mean(np.abs(est - exact)) < 0.04
    assert np.mean(np.abs(est - exact) <= 3 * se + 0.02) > 0.95


def test_short_empty_and_masked_observations():
    cfg = SimilarityConfig()
    t = np.zeros((5, 8), np.int32)
    t[0, :2] = [5, 6]           # shorter than a gram: one gram of both tokens
    t[1, :2] = [5, 6]
    t[2, :2] = [6, 5]           # order matters
    # rows 3 and 4: no valid token at all
    sig = minhash_signatures(t, t != 0, cfg)
    sim = np.asarray(jaccard_estimate(sig[:, None], sig[None]))
    assert sim[0, 1] == 1.0 and sim[0, 2] == 0.0 and sim[3, 4] == 1.0 and sim[0, 3] == 0.0
    # the mask, not the token values, says what is an observation: PAD-valued tokens under the mask count
    left = np.array([[0, 0, 7, 8, 9, 10]]), np.array([[False, False, True, True, True, True]])
    right = np.array([[7, 8, 9, 10, 0, 0]]), np.array([[True, True, True, True, False, False]])
    s_l, s_r = minhash_signatures(*left, cfg), minhash_signatures(*right, cfg)
    assert float(jaccard_estimate(s_l, s_r)[0]) == 1.0


@pytest.mark.parametrize("threshold", [0.5, 0.8, 0.9, 1.0])
def test_leader_clusters_follow_the_reference_rule(threshold):
    rng = np.random.default_rng(int(threshold * 10))
    for trial in range(4):
        strs = [_edit(BASE[rng.integers(len(BASE))], rng, int(rng.integers(0, 8))) for _ in range(40)]
        tok = _tokens(strs)
        valid = rng.random(40) < 0.9
        sig = minhash_signatures(tok, tok != 0, SimilarityConfig())
        got = np.asarray(jax.jit(leader_clusters)(sig, jnp.asarray(valid), threshold))
        assert got.tolist() == _ref_leaders(sig, valid, threshold)
        lead = got[valid]
        assert np.all(lead <= np.nonzero(valid)[0]) and np.all(valid[lead])  # leaders are earlier valid records


def _two_groups():
    """Two groups; in each, trajectory 0 and 1 start from one observation except for one
    character, then diverge; one succeeds."""
    rng = np.random.default_rng(3)
    start = BASE[0]
    near = start[:10] + ("x" if start[10] != "x" else "y") + start[11:]
    trajs = [[start, BASE[1], BASE[2]], [near, BASE[3], BASE[2]], [BASE[1], BASE[2]]]
    B, K, T, W = 2, 3, 3, 96
    tok = np.zeros((B, K, T, W), np.int32)
    mask = np.zeros((B, K, T), bool)
    reward = np.zeros((B, K, T), np.float32)
    outcome = np.full((B, K), bj.FAILURE, np.int32)
    for b in range(B):
        for k, traj in enumerate(trajs):
            tok[b, k, :len(traj)] = _tokens(traj, W)
            mask[b, k, :len(traj)] = True
        win = int(rng.integers(2))
        reward[b, win, len(trajs[win]) - 1] = 10.0
        outcome[b, win] = bj.SUCCESS
    keys = bj.hash_tokens(jnp.asarray(tok), jnp.asarray(tok != 0))
    batch = bj.StepBatch(obs_key=keys, reward=jnp.asarray(reward), mask=jnp.asarray(mask), outcome=jnp.asarray(outcome))
    return batch, tok


def test_merge_similar_joins_near_duplicates_into_one_step_group():
    batch, tok = _two_groups()
    exact = bj.gigpo(batch, bj.GiGPOConfig(omega=1.0))
    merged_batch = merge_similar(batch, tok, SimilarityConfig(threshold=0.8))
    merged = bj.gigpo(merged_batch, bj.GiGPOConfig(omega=1.0))
    keys = np.asarray(merged_batch.obs_key)
    assert np.array_equal(keys[:, 1, 0], keys[:, 0, 0])  # the near-duplicate took its leader's key
    assert not np.array_equal(np.asarray(batch.obs_key)[:, 1, 0], np.asarray(batch.obs_key)[:, 0, 0])
    # t = 0 of trajectories 0 and 1: singletons under exact hashing, one step group when merged
    a_s_exact = np.asarray(exact.advantage - exact.a_episode)[:, :2, 0]
    a_s_merged = np.asarray(merged.advantage - merged.a_episode)[:, :2, 0]
    assert np.all(a_s_exact == 0) and np.all(np.abs(a_s_merged) > 0)
    # distinct observations keep their own keys
    assert np.array_equal(keys[:, 0, 1:], np.asarray(batch.obs_key)[:, 0, 1:])


@pytest.mark.parametrize("name", ["gigpo", "graphgpo", "hgpo", "gagpo", "gated_bepo"])
def test_merging_changes_nothing_when_observations_are_equal_or_far_apart(name):
    """Every graph estimator on merged keys equals exact hashing when no two different
    observations are similar (and merging is jittable)."""
    rng = np.random.default_rng(5)
    B, K, T, W = 3, 4, 6, 96
    pick = rng.integers(len(BASE), size=(B, K, T))
    tok = np.stack([_tokens([BASE[i] for i in row.ravel()], W).reshape(K, T, W) for row in pick])
    mask = np.arange(T)[None, None] < rng.integers(2, T + 1, size=(B, K))[..., None]
    reward = np.where(mask, rng.normal(size=(B, K, T)), 0).astype(np.float32)
    outcome = rng.integers(0, 3, size=(B, K)).astype(np.int32)
    batch = bj.StepBatch(obs_key=bj.hash_tokens(jnp.asarray(tok), jnp.asarray(tok != 0)), reward=jnp.asarray(reward),
                         mask=jnp.asarray(mask), outcome=jnp.asarray(outcome))
    merged = jax.jit(lambda b, t: merge_similar(b, t, SimilarityConfig()))(batch, jnp.asarray(tok))
    want = bj.compute_advantages(name, batch).advantage
    got = bj.compute_advantages(name, merged).advantage
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_similarity_clusters_index_records_in_trajectory_major_order():
    batch, tok = _two_groups()
    lead = np.asarray(similarity_clusters(jnp.asarray(tok), batch.mask, SimilarityConfig(threshold=0.8)))
    T = tok.shape[2]
    assert np.all(lead[:, 1, 0] == 0 * T + 0)            # trajectory 1's start joins trajectory 0's
    assert np.all(lead[:, 2, 0] == 0 * T + 1)            # BASE[1] first appeared at (k=0, t=1)
    assert np.all(lead[:, 0, 0] == 0)


def test_errors_name_the_field():
    with pytest.raises(ValueError, match="SimilarityConfig.threshold"):
        SimilarityConfig(threshold=0.0)
    with pytest.raises(ValueError, match="SimilarityConfig.ngram"):
        SimilarityConfig(ngram=0)
    with pytest.raises(ValueError, match="num_bins"):
        SimilarityConfig(num_bins=100_000)
    batch, tok = _two_groups()
    with pytest.raises(ValueError, match=r"obs_tokens must be \[B, K, T, W\]"):
        merge_similar(batch, tok[:, :2])
