"""ProxMO as its authors' code computes it (bepo_jax.credit.estimators.proxmo): against a row-by-row loop
written from the official code (GithubX-F/ProxMO-RL, proxmo/core_proxmo.py; reference.ref_proxmo, with its
own TF-IDF by hand), a worked PSC example by hand, and the edge cases: no repeated state (the soft
kernel's implicit gate), all successes, texts with no word."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, ProxMOConfig
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories
from bepo_jax.credit.reference import ref_proxmo

from tests.helpers import assert_close, reference_batch
from tests.strategies import batches

pytest.importorskip("sklearn")


@pytest.mark.parametrize("mode", ["soft", "mean", "mean_std"])
@given(data=batches(), gamma=st.sampled_from([0.5, 0.95]), psc=st.booleans(), w=st.sampled_from([1.0, 0.5]))
def test_proxmo_matches_a_row_loop_rewritten_from_the_official_code(mode, data, gamma, psc, w):
    batch, np_batch = data
    cfg = ProxMOConfig(mode=mode, gamma=gamma, psc=psc, w=w)
    want = ref_proxmo(np_batch, mode=mode, gamma=gamma, psc=psc, w=w)
    assert_close(bj.proxmo(batch, cfg).advantage, want, what=f"proxmo {mode}", rtol=3e-4)


WORDS = ("kitchen", "hall", "key", "door", "red", "box", "table", "you", "see")


def _texts_batch(rng, groups=3, k=4, t_max=5, vocab=6, reward=10.0, num_steps=None):
    """Random groups whose observations are short sentences from a few words (so their TF-IDF vectors
    overlap partly), with success paying ``reward`` and a quarter of the actions invalid at 0.1."""
    batch_groups, texts = [], []
    for _ in range(groups):
        trajs, gtexts = [], []
        for _ in range(k):
            L = int(rng.integers(1, t_max + 1))
            obs = [" ".join(rng.choice(WORDS[:vocab], size=int(rng.integers(1, 4)))) for _ in range(L)]
            ok = bool(rng.random() < 0.4)
            inv = rng.random(L) < 0.25
            trajs.append(Trajectory(obs, [reward if (ok and i == L - 1) else 0.0 for i in range(L)],
                                    SUCCESS if ok else FAILURE, penalties=[-0.1 if v else 0.0 for v in inv]))
            gtexts.append(obs)
        batch_groups.append(trajs)
        texts.append(gtexts)
    return batch_from_trajectories(batch_groups, num_steps=num_steps), texts


@settings(deadline=None, max_examples=12)
@given(seed=st.integers(0, 10_000), reward=st.sampled_from([1.0, 10.0]), psc=st.booleans())
def test_the_tfidf_soft_grouping_matches_the_loop_with_tfidf_by_hand(seed, reward, psc):
    batch, texts = _texts_batch(np.random.default_rng(seed), reward=reward)
    got = bj.proxmo(batch, ProxMOConfig(psc=psc), texts=texts)
    want = ref_proxmo(reference_batch(batch), texts, psc=psc)
    assert_close(got.advantage, want, what="proxmo tf-idf", rtol=3e-4)
    # the features are scikit-learn's, fitted on every row of the batch (across groups)
    from sklearn.feature_extraction.text import TfidfVectorizer

    shape = tuple(batch.mask.shape)
    feats = bj.tfidf_features(texts, shape)
    flat = [o for g in texts for tr in g for o in tr]
    np.testing.assert_allclose(feats[np.asarray(batch.mask)], TfidfVectorizer(max_features=1024).fit_transform(flat)
                               .toarray(), atol=1e-6)


def test_psc_weights_by_hand():
    """Rewards 0/1 (what PSC was written for): one success and one failure of one step each. S = [1, 0],
    mean 0.5 = p; beta = 0.05 / (sigmoid(1) - 0.5); the success's weight 1 + beta (sigmoid(0.5^4) - 0.5),
    the failure's 1 + beta (sigmoid(-0.5^4) - 0.5)."""
    batch = batch_from_trajectories([[Trajectory(["a"], [1.0], SUCCESS), Trajectory(["b"], [0.0], FAILURE)]])
    out = bj.proxmo(batch)
    sig = lambda x: 1 / (1 + math.exp(-x))
    beta = 0.05 / (sig(1.0) - 0.5)
    w_pos, w_neg = 1 + beta * (sig(0.0625) - 0.5), 1 + beta * (sig(-0.0625) - 0.5)
    np.testing.assert_allclose(np.asarray(out.psc_weight)[0, :, 0], [w_pos, w_neg], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.a_episode)[0, :, 0], [0.5 * w_pos, -0.5 * w_neg], rtol=1e-6)
    # distinct observations: each row's soft baseline is almost its own return (weight e^10 on itself, e^0 on
    # the other), so almost no step credit: (G_i - G_j) / (1 + e^10) (the implicit gate)
    eps = 1 / (1 + math.exp(10.0))
    np.testing.assert_allclose(np.asarray(out.a_step)[0, :, 0], [eps, -eps], atol=1e-7)  # float32 G - baseline
    # with rewards of 10 any group with a success has p = 1: successes weigh 1, failures 1 + beta (sigmoid(-1) - 0.5)
    ten = batch_from_trajectories([[Trajectory(["a"], [10.0], SUCCESS), Trajectory(["b"], [0.0], FAILURE)]])
    np.testing.assert_allclose(np.asarray(bj.proxmo(ten).psc_weight)[0, :, 0], [1.0, 1 + beta * (sig(-1.0) - 0.5)],
                               rtol=1e-6)


def test_a_shared_state_gets_step_credit_and_all_successes_no_episode_credit():
    """Two trajectories through the same state "hall": the soft baseline there is the mean of their returns
    (both rows weigh e^{1/0.1}, the others e^0); all successes: the episode term is 0 for every row."""
    batch = batch_from_trajectories([[Trajectory(["hall", "key"], [0.0, 10.0], SUCCESS),
                                      Trajectory(["hall", "door", "key"], [0.0, 0.0, 10.0], SUCCESS)]])
    out = bj.proxmo(batch, ProxMOConfig(psc=False))
    np.testing.assert_allclose(np.asarray(out.a_episode)[np.asarray(batch.mask)], 0.0, atol=1e-6)
    g = {(0, 0): 9.5, (0, 1): 10.0, (1, 0): 9.025, (1, 1): 9.5, (1, 2): 10.0}
    rows = list(g)
    keys = {(0, 0): "hall", (0, 1): "key", (1, 0): "hall", (1, 1): "door", (1, 2): "key"}
    for r in rows:
        e = [math.exp((1.0 if keys[r] == keys[j] else 0.0) / 0.1) for j in rows]
        want = g[r] - sum(x * g[j] for x, j in zip(e, rows)) / sum(e)
        assert float(out.a_step[0, r[0], r[1]]) == pytest.approx(want, abs=1e-4)


def test_texts_without_a_word_give_no_step_credit():
    batch = batch_from_trajectories([[Trajectory(["a", "b"], [0.0, 1.0], SUCCESS), Trajectory(["a"], [0.0], FAILURE)]])
    texts = [[["a", "b"], ["a"]]]  # one-letter words: scikit-learn's empty vocabulary
    assert bj.tfidf_features(texts, tuple(batch.mask.shape)) is None
    out = bj.proxmo(batch, texts=texts)
    np.testing.assert_array_equal(np.asarray(out.a_step), 0.0)
    np.testing.assert_allclose(out.advantage, out.a_episode)


def _as_array(texts, mask):
    """texts[b][k][t] (valid steps) as the [B, K, T] array a rollout records ("" past a trajectory's end)."""
    out = np.full(mask.shape, "", object)
    for b, g in enumerate(texts):
        for k, tr in enumerate(g):
            out[b, k, : len(tr)] = tr
    return out


def test_text_inputs_from_a_rollouts_state_texts_match_the_loop_and_compile_once():
    """``text_inputs`` (what the training loops pass the kernel): the loop with its own TF-IDF on every
    batch, and one compiled program for batches whose vocabularies differ in size (padded to 1,024
    words), including a batch with no word at all (no step credit)."""
    import jax

    from bepo_jax.credit.estimators.proxmo import proxmo_kernel, text_inputs

    traces = []

    @jax.jit
    def kernel(batch, features, vocabulary):
        traces.append(1)
        return proxmo_kernel(batch, ProxMOConfig(), features, vocabulary)

    rng = np.random.default_rng(5)
    for vocab in (3, 9):
        batch, texts = _texts_batch(rng, groups=2, k=3, t_max=4, vocab=vocab, num_steps=4)
        mask = np.asarray(batch.mask)
        features, vocabulary = text_inputs(_as_array(texts, mask), mask, ProxMOConfig())
        assert features.shape == mask.shape + (1024,) and bool(vocabulary)
        assert_close(kernel(batch, features, vocabulary).advantage, ref_proxmo(reference_batch(batch), texts),
                     what=f"text_inputs, {vocab} words", rtol=3e-4)
    wordless = batch_from_trajectories([[Trajectory(["a"] * 4, [0.0, 0.0, 0.0, 10.0], SUCCESS),
                                         Trajectory(["b"] * 2, [0.0, 0.0], FAILURE),
                                         Trajectory(["a"] * 3, [0.0, 0.0, 10.0], SUCCESS)]] * 2)  # same B, K, T
    mask = np.asarray(wordless.mask)
    features, vocabulary = text_inputs(np.where(mask, "a", ""), mask, ProxMOConfig())
    assert not bool(vocabulary)
    np.testing.assert_array_equal(np.asarray(kernel(wordless, features, vocabulary).a_step), 0.0)
    assert len(traces) == 1
    gap = mask.copy()
    gap[0, 0, 0] = False  # a record after an invalid one
    with pytest.raises(ValueError, match="prefix"):
        text_inputs(np.full(mask.shape, "hall", object), gap, ProxMOConfig())


def test_the_registry_names_proxmo_as_the_one_estimator_that_reads_texts():
    """The training loops and the turns path ask the registry (``Estimator.text_inputs``), not a name: ProxMO
    alone reads texts, and only its soft grouping does (the other modes group identical observations)."""
    from bepo_jax.credit.estimators.proxmo import text_inputs

    assert [n for n, e in bj.ESTIMATORS.items() if e.text_inputs is not None] == ["proxmo"]
    assert bj.ESTIMATORS["proxmo"].text_inputs is text_inputs
    mask = np.ones((1, 2, 1), bool)
    texts = np.array([[["kitchen key"], ["hall door"]]], object)
    assert text_inputs(texts, mask, ProxMOConfig(mode="mean")) == ()
    assert len(text_inputs(texts, mask, ProxMOConfig())) == 2


def test_config_and_texts_are_checked():
    with pytest.raises(ValueError, match="ProxMOConfig.mode"):
        ProxMOConfig(mode="soft_grouping")
    with pytest.raises(ValueError, match="ProxMOConfig.temperature"):
        ProxMOConfig(temperature=0.0)
    batch = batch_from_trajectories([[Trajectory(["a"], [1.0], SUCCESS), Trajectory(["b"], [0.0], FAILURE)]])
    with pytest.raises(ValueError, match="texts must be"):
        bj.proxmo(batch, texts=[[["hall"]]])
