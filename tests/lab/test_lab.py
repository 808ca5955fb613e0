"""The credit lab: exact evaluation, enumeration, sampling, the metrics, the CLI."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bepo_jax.agent.envs.base import env_reset, env_step
from bepo_jax.credit.hashing import hash_tokens
from bepo_jax.lab import (GraphWorld, TabularModel, boltzmann_policy, enumerate_states, evaluate, make_diagnostic,
                          occupancy, optimal_q, softmax_policy, uniform_policy)
from bepo_jax.lab.quality import (LabConfig, affine_error, credit_quality, paired_difference, parse_spec,
                                  record_metrics, sign_accuracy, spec)
from bepo_jax.lab.sample import sample_groups
from bepo_jax.credit.types import outcome_codes


def _tiny_world() -> GraphWorld:
    """State 0: "wait" stays (reward 0), "go" succeeds (reward 1)... with a slip:
    "go" reaches state 1 (no reward, continue) with probability 1/4. State 1: both
    actions end in failure."""
    nxt = np.array([[[0, 0], [0, 1]], [[1, 1], [1, 1]]])
    prob = np.array([[[1, 0], [0.75, 0.25]], [[1, 0], [1, 0]]])
    success = np.array([[[0, 0], [1, 0]], [[0, 0], [0, 0]]], bool)
    terminal = np.array([[[0, 0], [0, 0]], [[1, 1], [1, 1]]], bool)
    return GraphWorld("tiny", action_words=("wait", "go"), views=["a", "b"], next_state=nxt, prob=prob,
                      success=success, terminal=terminal, max_steps=2)


def test_hand_derived_values():
    m = enumerate_states(_tiny_world(), 0)
    assert (m.num_states, m.num_actions, m.horizon, m.start) == (2, 2, 2, 0)
    ev = evaluate(m, uniform_policy(m), gamma=0.5)
    # t = 1 (one step left): Q(0, wait) = 0, Q(0, go) = 0.75; V = 0.375.  State 1: 0.
    np.testing.assert_allclose(ev.Q[1, 0], [0.0, 0.75])
    np.testing.assert_allclose(ev.V[1], [0.375, 0.0])
    # t = 0: Q(0, wait) = 0.5 * 0.375 = 0.1875; Q(0, go) = 0.75 + 0.25 * 0.5 * V[1, 1] = 0.75.
    np.testing.assert_allclose(ev.Q[0, 0], [0.1875, 0.75])
    np.testing.assert_allclose(ev.V[0, 0], 0.46875)
    np.testing.assert_allclose(ev.A[0, 0], [0.1875 - 0.46875, 0.75 - 0.46875])
    np.testing.assert_allclose(ev.V[2], 0.0)
    # occupancy: d[1] = (0.5 wait + 0.5 * 0.25 slip) at the two states.
    np.testing.assert_allclose(ev.occupancy[1], [0.5, 0.125])
    # success probability = 0.5 * 0.75 + 0.5 * (0.5 * 0.75) = 0.5625 (state 1 never succeeds).
    assert ev.success == pytest.approx(0.5625)
    assert ev.value == pytest.approx(0.46875)


def _random_model(rng, S=5, A=3, M=2, H=4) -> TabularModel:
    p = rng.random((S, A, M))
    p /= p.sum(-1, keepdims=True)
    ended = rng.random((S, A, M)) < 0.2
    success = ended & (rng.random((S, A, M)) < 0.5)
    return TabularModel(next_state=rng.integers(0, S, (S, A, M)).astype(np.int32), prob=p,
                        reward=rng.normal(size=(S, A, M)).astype(np.float32), success=success, ended=ended,
                        obs_key=np.zeros((S, 2), np.uint32), depth=np.zeros(S, np.int32), start=0, horizon=H)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_evaluate_matches_a_linear_solve(seed):
    """V on the time-augmented chain (t, s) solves (I - gamma P_pi) v = r_pi."""
    rng = np.random.default_rng(seed)
    m = _random_model(rng)
    pi = softmax_policy(rng.normal(size=(m.num_states, m.num_actions)))
    gamma = 0.9
    H, S = m.horizon, m.num_states
    n = (H + 1) * S
    P, r = np.zeros((n, n)), np.zeros(n)
    for t in range(H):
        for s in range(S):
            for a in range(m.num_actions):
                for b in range(m.num_branches):
                    w = pi[s, a] * m.prob[s, a, b]
                    r[t * S + s] += w * m.reward[s, a, b]
                    if not m.ended[s, a, b]:
                        P[t * S + s, (t + 1) * S + m.next_state[s, a, b]] += w
    v = np.linalg.solve(np.eye(n) - gamma * P, r).reshape(H + 1, S)
    ev = evaluate(m, pi, gamma)
    np.testing.assert_allclose(ev.V, v, atol=1e-10)
    np.testing.assert_allclose((pi[None] * ev.A).sum(-1), 0.0, atol=1e-10)
    np.testing.assert_allclose(ev.occupancy, occupancy(m, pi))


def test_policy_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    m = _random_model(rng, S=4, A=2)
    theta = rng.normal(size=(4, 2))
    gamma = 0.8
    g = evaluate(m, softmax_policy(theta), gamma).gradient
    eps = 1e-6
    fd = np.zeros_like(theta)
    for i in np.ndindex(theta.shape):
        d = np.zeros_like(theta)
        d[i] = eps
        fd[i] = (evaluate(m, softmax_policy(theta + d), gamma).value
                 - evaluate(m, softmax_policy(theta - d), gamma).value) / (2 * eps)
    np.testing.assert_allclose(g, fd, atol=1e-7)


def test_optimal_q_and_boltzmann():
    m = enumerate_states(make_diagnostic("key_door"), 0)
    q = optimal_q(m)
    assert q[0, m.start].tolist() == [1.0, 0.0]  # the key leads to a sure win; no key never wins
    cold = boltzmann_policy(m, 0.01)
    assert evaluate(m, cold).success == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        boltzmann_policy(m, 0.0)


def _level(levels, i):
    return jax.tree_util.tree_map(lambda x: x[i], levels)


def _sokoban_env():
    from bepo_jax.agent.envs.sokoban import SokobanConfig, SokobanEnv

    return SokobanEnv(SokobanConfig(num_boxes=(2, 2), max_steps=8))


def test_sokoban_model_transitions_are_the_environment():
    env = _sokoban_env()
    task = _level(env.sample_tasks(1, 5), 0)
    m = enumerate_states(env, task)
    assert m.num_states > 10 and m.horizon == 8
    rng = np.random.default_rng(0)
    for s in rng.choice(m.num_states, 12, replace=False):
        inner = jax.tree_util.tree_map(lambda x: x[s], m.inner)
        raw = env.observation(inner).reshape(1, -1)
        key = hash_tokens(raw, jnp.ones(raw.shape, bool))
        np.testing.assert_array_equal(np.asarray(key)[0], m.obs_key[s])
        if m.depth[s] == m.horizon:
            continue
        for a in range(m.num_actions):
            nxt, r, succ, term = env.step(inner, jnp.int32(a))
            assert float(r) == m.reward[s, a, 0] and bool(succ) == m.success[s, a, 0]
            if not m.ended[s, a, 0]:
                want = env.canonical(nxt)
                got = jax.tree_util.tree_map(lambda x: x[m.next_state[s, a, 0]], m.inner)
                for x, y in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
                    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("which", ["sokoban", "maze", "key_door"])
def test_sampled_groups_replay_through_the_rollout_wrapper(which):
    """A group sampled on the model, replayed action by action through ``env_reset`` /
    ``env_step`` and the rollouts' observation hash, gives the same StepBatch records."""
    if which == "sokoban":
        env = _sokoban_env()
        task = _level(env.sample_tasks(1, 5), 0)
    elif which == "maze":
        from bepo_jax.agent.envs.jumanji_env import maze

        env = maze(5, 5, max_steps=6)
        task = env.sample_tasks(1, 1)[0]
    else:
        env = make_diagnostic(which)
        task = 0
    m = enumerate_states(env, task)
    smp = jax.device_get(sample_groups(m, uniform_policy(m), jax.random.key(0), num_groups=2, group_size=4))
    for k in range(4):
        st = env_reset(env, jax.tree_util.tree_map(jnp.asarray, task))
        for t in range(m.horizon):
            raw = env.observation(st.inner).reshape(1, -1)
            key = np.asarray(hash_tokens(raw, jnp.ones(raw.shape, bool)))[0]
            a = int(smp.action[0, k, t])
            st, r, valid = env_step(env, st, jnp.int32(max(a, 0)))
            assert bool(valid) == bool(smp.batch.mask[0, k, t])
            if valid:
                np.testing.assert_array_equal(key, smp.batch.obs_key[0, k, t])
                assert float(r) == float(smp.batch.reward[0, k, t])
        assert int(outcome_codes(st.success, st.terminal)) == int(smp.batch.outcome[0, k])


def test_aliasing_survives_enumeration_and_budget_refusals():
    m = enumerate_states(make_diagnostic("aliased"), 0)
    assert m.num_states == 5
    rooms = [s for s in range(5) if m.depth[s] == 2]
    assert len(rooms) == 2 and (m.obs_key[rooms[0]] == m.obs_key[rooms[1]]).all()
    with pytest.raises(ValueError, match="max_states=3"):
        enumerate_states(make_diagnostic("aliased"), 0, max_states=3)
    with pytest.raises(ValueError, match="horizon=9"):
        enumerate_states(make_diagnostic("aliased"), 0, 9)
    with pytest.raises(ValueError, match="probs has shape"):
        evaluate(m, np.ones((4, 2)) / 2)
    with pytest.raises(ValueError, match="sum to 1"):
        evaluate(m, np.ones((5, 2)))
    with pytest.raises(ValueError, match="stochastic"):
        make_diagnostic("slippery").step(jnp.int32(0), jnp.int32(1))


def test_sampling_matches_the_exact_occupancy():
    """Stochastic branches included: visit frequencies of 4,096 trajectories are within
    5 standard errors of the exact occupancies."""
    m = enumerate_states(make_diagnostic("slippery"), 0)
    pi = softmax_policy(np.random.default_rng(0).normal(size=(m.num_states, 2)))
    smp = jax.device_get(sample_groups(m, pi, jax.random.key(1), num_groups=512, group_size=8))
    d = occupancy(m, pi)
    N = 4096
    for t in range(m.horizon):
        s = np.asarray(smp.state[..., t])[np.asarray(smp.batch.mask[..., t])]
        freq = np.bincount(s, minlength=m.num_states) / N
        se = np.sqrt(d[t] * (1 - d[t]) / N) + 1e-9
        assert np.all(np.abs(freq - d[t]) <= 5 * se + 1e-12), (t, freq, d[t])
    assert abs(float(smp.success.mean()) - evaluate(m, pi).success) < 5 * 0.5 / np.sqrt(N)


def test_metric_definitions():
    y = np.array([1.0, -1.0, 2.0, 0.0, -3.0, 1.0])
    g = np.array([0, 0, 0, 1, 1, 1])
    # a per-group positive affine map of the truth is perfect up to scale and shift
    x = np.where(g == 0, 3 * y + 1, 0.5 * y - 2)
    assert affine_error(x, y, g) == pytest.approx(0.0, abs=1e-12)
    assert affine_error(np.zeros(6), y, g) == pytest.approx(1.0)
    assert sign_accuracy(x - np.where(g == 0, 1, -2), y) == 1.0
    assert sign_accuracy(-y, y) == 0.0
    assert sign_accuracy(np.zeros(6), y) == 0.5
    # weighted by |y|: wrong on the |y| = 3 record only
    assert sign_accuracy(np.array([1, -1, 2, 0, 3, 1.0]), y) == pytest.approx(5 / 8)
    m = record_metrics(x, y, g, {"first": g == 0})
    assert m["pearson_first"] == pytest.approx(1.0) and m["spearman"] <= 1.0


def test_parse_spec_and_errors():
    s = parse_spec("lam0=gated_bepo:lam=0:norm=mean")
    assert (s.label, s.name, dict(s.overrides)) == ("lam0", "gated_bepo", {"lam": 0, "norm": "mean"})
    assert s.config().lam == 0.0
    assert parse_spec("gigpo").name == "gigpo"
    with pytest.raises(ValueError, match="unknown estimator"):
        parse_spec("x=nope")
    with pytest.raises(ValueError, match="lam"):
        parse_spec("x=gated_bepo:lam=2")
    with pytest.raises(ValueError, match="LABEL=NAME"):
        parse_spec("x=gated_bepo:lam")
    with pytest.raises(ValueError, match="group_size"):
        LabConfig(group_size=1)


@pytest.mark.slow
def test_credit_quality_on_key_door():
    """The oracle row is the truth; on key_door (the key helps also in failed runs) the
    fixed-point credit correlates with A^pi better than outcome credit, batch by batch."""
    m = enumerate_states(make_diagnostic("key_door"), 0)
    specs = [spec("grpo"), spec("gated_bepo"), spec("lam0", "gated_bepo", lam=0.0)]
    r = credit_quality(m, uniform_policy(m), specs, LabConfig(group_size=8, num_groups=16, num_batches=3))
    o = r["estimators"]["oracle"]
    assert o["pearson"]["mean"] == pytest.approx(1.0) and o["affine_err"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert r["true_success"] == pytest.approx(0.25)
    e = r["estimators"]
    assert e["gated_bepo"]["pearson"]["mean"] - e["gated_bepo"]["pearson"]["ci95"] > \
        e["grpo"]["pearson"]["mean"] + e["grpo"]["pearson"]["ci95"]
    assert 0 < r["gated_share"]["mean"] < 1
    same = paired_difference(r, "gated_bepo", "gated_bepo")
    assert same["mean"] == 0.0 and same["ci95"] == 0.0
    d = paired_difference(r, "gated_bepo", "grpo")
    assert d["mean"] == pytest.approx(e["gated_bepo"]["pearson"]["mean"] - e["grpo"]["pearson"]["mean"])
    assert d["mean"] - d["ci95"] > 0 and d["n"] == 3
    assert set(r["values"]) == {"rmse_mc", "rmse_fp", "fp_minus_mc", "corr_mc", "corr_fp"}
    with pytest.raises(ValueError, match="labels must be unique"):
        credit_quality(m, uniform_policy(m), [spec("grpo"), spec("grpo")], LabConfig(num_batches=2))


@pytest.mark.slow
def test_credit_cli_writes_and_resumes(tmp_path):
    from bepo_jax.cli import main

    out = tmp_path / "credit"
    argv = ["credit", "--env", "bump", "--estimators", "grpo,lam0=gated_bepo:lam=0", "--group-sizes", "2,4",
            "--groups", "4", "--batches", "2", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    res = json.loads((out / "credit.json").read_text())
    assert [r["group_size"] for r in res["rows"]] == [2, 4]
    assert set(res["rows"][0]["estimators"]) == {"grpo", "lam0", "oracle"}
    md = (out / "credit.md").read_text()
    assert "| lam0 |" in md and (out / "credit.png").exists()
    assert main(argv) == 0  # everything done: resumes without recomputing
    assert json.loads((out / "credit.json").read_text())["rows"] == res["rows"]
    with pytest.raises(SystemExit):
        main(argv[:-3] + ["--batches", "3", "--quiet", "--out", str(out)])  # other settings: refused


@pytest.mark.slow
def test_token_policy_probs_match_constrained_sampling():
    """The word probabilities of a random token policy equal the frequencies of the
    rollouts' constrained sampler (words sharing a prefix: "go" / "get" / "wait")."""
    from flax import nnx

    from bepo_jax.agent.envs.base import parse_response, word_table
    from bepo_jax.lab.token_policy import token_policy_probs
    from bepo_jax.agent.models import DecoderLM, TransformerConfig
    from bepo_jax.agent.rollouts.jitted import forced_positions, sample_responses

    world = GraphWorld("words", action_words=("go", "get", "wait"), views=["one room", "two"],
                       next_state=[[1, 1, 0], [1, 1, 1]], success=[[0, 0, 0], [1, 0, 0]], max_steps=3)
    m = enumerate_states(world, 0)
    lm = DecoderLM(TransformerConfig(context=32, width=32, heads=2, layers=1), rngs=nnx.Rngs(3))
    probs = token_policy_probs(lm, world, m, temperature=2.0)
    assert probs.shape == (2, 3) and np.allclose(probs.sum(1), 1)
    words = word_table(world.action_words, 4)
    N = 3000
    obs = np.asarray(world.render(jnp.int32(0)))
    prompt = np.concatenate([[1], obs, [3]]).astype(np.int32)
    prompts = jnp.asarray(np.repeat(prompt[None], N, 0))
    pm = jnp.asarray(np.repeat(np.concatenate([[True], obs != 0, [True]])[None], N, 0))
    seq, *_ = sample_responses(lm, prompts, pm, jax.random.key(0), max_response=5, temperature=2.0,
                               table=jnp.broadcast_to(jnp.asarray(words), (N,) + words.shape),
                               table_valid=jnp.ones((N, 3), bool), forced=forced_positions(words))
    act = np.asarray(jax.vmap(parse_response, in_axes=(0, None, None))(
        seq[:, len(prompt):], jnp.asarray(words), jnp.ones((3,), bool)))
    freq = np.bincount(act, minlength=3) / N
    se = np.sqrt(probs[0] * (1 - probs[0]) / N)
    assert np.all(np.abs(freq - probs[0]) <= 5 * se), (freq, probs[0])
    with pytest.raises(ValueError, match="prompt_history=2"):
        token_policy_probs(lm, world, m, prompt_history=2)


def test_the_decisions_world_has_exact_zero_advantage_at_routine_steps():
    """``decisions``: A^pi at an on-track state of step t is 0 on a routine step and, on a decision step,
    q^m (1 - q) for the on-track action (m = decisions after t, q its probability), -q^(m+1) for the other;
    the success probability is q^n for n decisions; hidden and visible worlds have the same truth."""
    from bepo_jax.agent.envs.diagnostic import decision_steps, decisions
    from bepo_jax.lab.exact import evaluate
    from bepo_jax.lab.model import enumerate_states

    q = 0.75
    for density in (0.25, 0.5):
        D = decision_steps(8, density)
        results = []
        for visible in (True, False):
            m = enumerate_states(decisions(8, density, visible), 0)
            t = np.asarray(m.depth)
            probs = np.full((m.num_states, 2), 1 - q)
            probs[np.arange(m.num_states), t % 2] = q
            ev = evaluate(m, probs)
            assert ev.success == pytest.approx(q ** len(D))
            on = [s for s in range(m.num_states) if int(m.inner[s]) < 8]  # on-track hidden states 0..7
            for s in on:
                step = int(t[s])
                after = sum(d > step for d in D)
                good, bad = (q ** after * (1 - q), -(q ** (after + 1))) if step in D else (0.0, 0.0)
                np.testing.assert_allclose(ev.A[step, s, [step % 2, 1 - step % 2]], [good, bad], atol=1e-9)
            results.append(ev.success)
        assert results[0] == results[1]


def test_partial_correlation_and_the_shuffled_band():
    from bepo_jax.lab.quality import partial_correlation, shared_states, shuffled_spearman

    rng = np.random.default_rng(0)
    z = rng.normal(size=400)
    x = z + rng.normal(size=400)
    y = 2 * z + x + rng.normal(size=400)
    r = lambda a, b: np.corrcoef(a, b)[0, 1]
    want = (r(x, y) - r(x, z) * r(y, z)) / np.sqrt((1 - r(x, z) ** 2) * (1 - r(y, z) ** 2))  # the textbook formula
    assert partial_correlation(x, y, z) == pytest.approx(want, abs=1e-9)
    group = np.repeat(np.arange(8), 50)
    null = shuffled_spearman(x, y, group, shuffles=20)
    assert null.shape == (20,) and np.all(np.abs(null) < 0.25)  # shuffling destroys the association
    # a shuffle stays within its group: the per-group sorted credit is unchanged
    rng2 = np.random.default_rng(0)
    order = np.argsort(group, kind="stable")
    perm = np.lexsort((rng2.random(400), group))
    xs = np.empty_like(x)
    xs[order] = x[perm]
    for g in range(8):
        np.testing.assert_array_equal(np.sort(xs[group == g]), np.sort(x[group == g]))
    # shared states: an observation seen by another record of the same group (a plain loop)
    keys = rng.integers(0, 3, (2, 3, 4, 2)).astype(np.uint32)
    mask = np.arange(4)[None, None, :] < rng.integers(1, 5, (2, 3))[..., None]
    want = []
    for b in range(2):
        ks = [tuple(k) for k in keys[b][mask[b]]]
        want += [ks.count(k) > 1 for k in ks]
    np.testing.assert_array_equal(shared_states(keys, mask), want)


def test_coverage_reads_a_boolean_gate_and_a_gate_weight_alike():
    from types import SimpleNamespace

    from bepo_jax.lab.quality import acting

    mask = np.array([[[True, True, False]]])
    shared = np.array([True, False])
    gate_bool = SimpleNamespace(gate=np.array([[[True, False, True]]]))
    gate_weight = SimpleNamespace(gate=np.array([[[0.0, 0.3, 0.9]]]))  # ECPO: a weight, 0 where closed
    np.testing.assert_array_equal(acting("gated_bepo", gate_bool, shared, mask), [True, False])
    np.testing.assert_array_equal(acting("ecpo", gate_weight, shared, mask), [False, True])
    np.testing.assert_array_equal(acting("gigpo", SimpleNamespace(), shared, mask), shared)
    assert not acting("grpo", gate_bool, shared, mask).any()
