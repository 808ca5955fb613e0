"""Exact tabular learning curves (bepo_jax.lab.learning) against plain loops and the lab's own exact evaluation."""

import jax.numpy as jnp
import numpy as np
import pytest

from bepo_jax.lab.exact import evaluate, softmax_policy
from bepo_jax.lab.learning import (LearningConfig, _policy_gradient, _tables, boltzmann_start, iterations_to,
                                   learning_curves, success_probability)
from bepo_jax.lab.quality import spec
from bepo_jax.lab.report import lab_models


@pytest.fixture(scope="module")
def key_door():
    return lab_models("key_door", 1, None, 0)[0]


def test_success_probability_equals_the_exact_evaluation(key_door):
    rng = np.random.default_rng(0)
    for world in ("key_door", "slippery", "loop"):
        m = key_door if world == "key_door" else lab_models(world, 1, None, 0)[0]
        tables = _tables(m)
        for _ in range(3):
            logits = rng.normal(size=(m.num_states, m.num_actions))
            pi = np.zeros((tables.next_state.shape[0], m.num_actions), np.float32) + 1.0 / m.num_actions
            pi[: m.num_states] = softmax_policy(logits)
            got = float(success_probability(tables, jnp.asarray(pi), int(m.horizon)))
            assert got == pytest.approx(evaluate(m, softmax_policy(logits)).success, abs=1e-5), world


def test_the_policy_gradient_is_the_plain_loop_over_records():
    rng = np.random.default_rng(1)
    S, A, K, T = 5, 3, 4, 6
    theta = rng.normal(size=(S, A)).astype(np.float32)
    state = rng.integers(0, S, (2, K, T))
    action = rng.integers(0, A, (2, K, T))
    adv = rng.normal(size=(2, K, T)).astype(np.float32)
    valid = np.arange(T)[None, None, :] < rng.integers(1, T + 1, (2, K))[..., None]
    got = np.asarray(_policy_gradient(jnp.asarray(theta), jnp.asarray(state), jnp.asarray(action), jnp.asarray(adv),
                                      jnp.asarray(valid), 2 * K))
    pi = softmax_policy(theta)
    want = np.zeros((S, A))
    for idx in zip(*np.nonzero(valid)):
        s, a = state[idx], action[idx]
        grad_log = -pi[s].copy()
        grad_log[a] += 1.0
        want[s] += adv[idx] * grad_log
    np.testing.assert_allclose(got, want / (2 * K), atol=1e-5)


def test_learning_curves(key_door):
    cfg = LearningConfig(iterations=8, seeds=16)
    zero = np.zeros((key_door.num_states, key_door.num_actions))
    c = learning_curves(key_door, spec("grpo"), zero, cfg)
    assert c.shape == (16, 9)
    assert np.allclose(c[:, 0], evaluate(key_door, softmax_policy(zero)).success, atol=1e-6)  # before any update
    assert c[:, -1].mean() > c[:, 0].mean() + 0.05  # the policy learns
    assert len({tuple(np.round(x, 6)) for x in c}) > 1  # seeds differ
    np.testing.assert_array_equal(c, learning_curves(key_door, spec("grpo"), zero, cfg))  # deterministic
    flat = learning_curves(key_door, spec("gated_bepo"), zero, LearningConfig(iterations=3, seeds=2, learning_rate=0.0))
    assert np.allclose(flat, flat[:, :1])  # no step, no change
    with pytest.raises(ValueError, match="init_logits has shape"):
        learning_curves(key_door, spec("grpo"), np.zeros((2, 2)), cfg)
    with pytest.raises(ValueError, match="LearningConfig.group_size"):
        LearningConfig(group_size=1)
    assert list(iterations_to(np.array([[0.1, 0.95, 0.5], [0.1, 0.2, 0.3]]), 0.9)) == [1, -1]


def test_a_peaked_start_succeeds_half_the_time(key_door):
    logits, temp = boltzmann_start(key_door, 0.5)
    assert evaluate(key_door, softmax_policy(logits)).success == pytest.approx(0.5, abs=0.01) and temp > 0
    with pytest.raises(ValueError, match="outside what Boltzmann policies on bump reach"):
        boltzmann_start(lab_models("bump", 1, None, 0)[0], 0.5)


def test_the_learn_command_writes_the_curves_and_their_table(tmp_path):
    import json

    from bepo_jax.cli import main

    out = tmp_path / "learn"
    assert main(["learn", "--env", "loop", "--estimators", "grpo,gated_bepo", "--seeds", "4", "--iterations", "3",
                 "--out", str(out), "--quiet"]) == 0
    d = json.loads((out / "learn.json").read_text())
    # the table's numbers from the per-seed record the file keeps, and that record from the curves themselves
    ps = d["per_seed"]["loop / uniform"]
    auc, auc_grpo = np.asarray(ps["gated_bepo"]["auc"]), np.asarray(ps["grpo"]["auc"])
    assert len(auc) == 4 and (out / "learn.png").exists()
    s = d["summary"]["loop / uniform"]["gated_bepo"]
    assert s["auc"][0] == pytest.approx(auc.mean(), abs=1e-6)
    assert s["auc_minus_grpo"][0] == pytest.approx((auc - auc_grpo).mean(), abs=1e-6)
    model = lab_models("loop", 1, None, 0)[0]
    curves = learning_curves(model, spec("gated_bepo"), np.zeros((model.num_states, model.num_actions)),
                             LearningConfig(iterations=3, seeds=4))
    np.testing.assert_allclose(auc, curves[:, 1:].mean(1), atol=1e-6)
    assert d["mean_curves"]["loop / uniform"]["gated_bepo"]["mean"] == pytest.approx(list(curves.mean(0)), abs=1e-6)
    assert "## loop / peaked" in (out / "learn.md").read_text()


def test_unit_rms_divides_each_seeds_credit_by_its_root_mean_square():
    from bepo_jax.lab.learning import unit_rms

    rng = np.random.default_rng(2)
    adv = rng.normal(size=(3, 2, 4, 5)).astype(np.float32)
    adv[1] = 0.0  # a seed whose credit is all zero stays zero
    valid = rng.random((3, 2, 4, 5)) < 0.7
    got = np.asarray(unit_rms(jnp.asarray(adv), jnp.asarray(valid)))
    for s in range(3):
        vals = [adv[s][i] for i in zip(*np.nonzero(valid[s]))]
        rms = np.sqrt(np.mean(np.square(vals)))
        want = adv[s] / rms if rms > 0 else np.zeros_like(adv[s])
        np.testing.assert_allclose(got[s], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="credit_scale"):
        LearningConfig(credit_scale="rms")


def test_unit_rms_removes_the_rewards_scale_from_an_unscaled_estimators_step():
    """GiGPO's default credit is linear in the reward: Sokoban paying 10 steps ten times further than
    paying 1 at one learning rate; with unit-RMS credit the two learn identically."""
    from bepo_jax.agent.envs.sokoban import SokobanConfig, SokobanEnv
    from bepo_jax.lab.model import enumerate_states

    models = []
    for reward in (10.0, 1.0):
        env = SokobanEnv(SokobanConfig(num_boxes=(1, 1), success_reward=reward))
        level = jax_tree_first(env.sample_tasks(1, 4))
        models.append(enumerate_states(env, level))
    zero = np.zeros((models[0].num_states, models[0].num_actions))
    curves = lambda m, scale: learning_curves(m, spec("gigpo"), zero, LearningConfig(iterations=6, seeds=8,
                                                                                     credit_scale=scale))
    assert not np.allclose(curves(models[0], "none"), curves(models[1], "none"), atol=1e-3)
    np.testing.assert_allclose(curves(models[0], "unit_rms"), curves(models[1], "unit_rms"), atol=1e-4)


def jax_tree_first(tasks):
    import jax

    return jax.tree_util.tree_map(lambda x: x[0], tasks)


def test_several_levels_are_summarised_over_levels_not_pooled_units():
    from scipy import stats

    from bepo_jax.lab.learning_report import summarize

    rng = np.random.default_rng(3)
    levels, seeds = 4, 3
    grpo = rng.random((levels * seeds, 6))
    other = grpo + rng.normal(0.05, 0.02, (levels * seeds, 1))
    res = {"curves": {"w / uniform": {"grpo": grpo.tolist(), "x": other.tolist()}},
           "starts": {"w / uniform": {"levels": levels}}}
    row = summarize(res)["w / uniform"]["x"]
    per_level = (other[:, 1:].mean(1) - grpo[:, 1:].mean(1)).reshape(levels, seeds).mean(1)
    half = stats.t.ppf(0.975, levels - 1) * per_level.std(ddof=1) / np.sqrt(levels)
    assert row["auc_minus_grpo"] == pytest.approx((per_level.mean(), half))
    assert row["levels"] == levels and row["seeds"] == seeds


def test_the_credit_mass_is_the_share_of_records_with_credit(key_door):
    """The credit mass is a share per update and seed, asking for it leaves the curves as they were, and
    where GRPO gives no credit (a group whose trajectories all end alike) Gated-BEPO's step credit still
    acts: on the same samples (one key) its mass is never below GRPO's."""
    zero = np.zeros((key_door.num_states, key_door.num_actions))
    cfg = LearningConfig(iterations=3, seeds=4)
    curves, mass = learning_curves(key_door, spec("grpo"), zero, cfg, with_mass=True)
    assert curves.shape == (4, 4) and mass.shape == (4, 3)
    assert np.all((mass >= 0) & (mass <= 1))
    np.testing.assert_array_equal(curves, learning_curves(key_door, spec("grpo"), zero, cfg))
    # Gated-BEPO's credit is non-zero wherever GRPO's is, and more (step credit inside all-failed groups)
    _, mass_b = learning_curves(key_door, spec("gated_bepo"), zero, cfg, with_mass=True)
    assert np.all(mass_b[:, 0] >= mass[:, 0])
