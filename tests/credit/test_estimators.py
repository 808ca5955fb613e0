"""GRPO, GiGPO and Gated-BEPO against the plain-loop references, for every config
combination docs/estimators.md lists, plus its test vectors and properties."""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, TRUNCATED, GatedBEPOConfig, GiGPOConfig, GRPOConfig, HGPOConfig, StepBatch
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories

from tests.helpers import assert_close, pairwise_params
from bepo_jax.credit.reference import ref_gated_bepo, ref_gigpo, ref_grpo, ref_hgpo
from tests.strategies import NORMS, STDS, WEIGHTINGS, batches

COMBOS = list(itertools.product(NORMS, WEIGHTINGS, STDS))
gammas = st.sampled_from([0.0, 0.5, 0.9, 0.95, 1.0])
unit = st.sampled_from([0.0, 0.3, 0.5, 0.95, 1.0])


# ------------------------------------------------------------------ test vectors (docs/estimators.md)


def test_gigpo_vector_returns():
    # rewards (0, 10 | 0, 20), gamma 0.5 -> returns [5, 10, 10, 20]
    from bepo_jax.credit.returns import discounted_returns

    g = discounted_returns(jnp.array([[0.0, 10.0], [0.0, 20.0]]), jnp.ones((2, 2), bool), 0.5)
    np.testing.assert_allclose(np.asarray(g), [[5, 10], [10, 20]])


def test_gigpo_vector_step_groups():
    # step returns [10, 0, 5] with keys [a, a, b], mean norm, zero episode rewards -> [5, -5, 0]
    b = batch_from_trajectories([[Trajectory(["a"], [10.0], SUCCESS), Trajectory(["a"], [0.0], FAILURE),
                                  Trajectory(["b"], [5.0], FAILURE)]])
    out = bj.gigpo(b, GiGPOConfig(norm="mean"))
    np.testing.assert_allclose(np.asarray(out.a_step)[0, :, 0], [5, -5, 0], atol=1e-6)


def test_grpo_vector_step_weighting():
    # failed 1-step and successful 3-step trajectory, reward 1 on success, mean_std -> [-1.5, .5, .5, .5]
    b = batch_from_trajectories([[Trajectory(["x"], [0.0], FAILURE),
                                  Trajectory(["y", "z", "w"], [0.0, 0.0, 1.0], SUCCESS)]])
    a = np.asarray(bj.grpo(b, GRPOConfig(norm="mean_std", weighting="step")).advantage)[0]
    np.testing.assert_allclose(a[0, :1], [-1.5], atol=1e-5)
    np.testing.assert_allclose(a[1], [0.5, 0.5, 0.5], atol=1e-5)
    assert np.all(a[0, 1:] == 0)


@pytest.mark.parametrize("solver", ["dense", "sparse", "solve"])
def test_bepo_worked_example(solver):
    # gamma 1: tau1 s0->s1->S (r=10), tau2 s0->s2->F, tau3 s0->s1->F
    b = batch_from_trajectories([[Trajectory(["s0", "s1"], [0, 10], SUCCESS), Trajectory(["s0", "s2"], [0, 0], FAILURE),
                                  Trajectory(["s0", "s1"], [0, 0], FAILURE)]])
    for lam in (0.0, 0.5, 1.0):
        out = bj.gated_bepo(b, GatedBEPOConfig(gamma=1.0, lam=lam, solver=solver))
        v = np.asarray(out.value)[0]
        np.testing.assert_allclose(v[:, 0], [10 / 3] * 3, rtol=1e-6)
        np.testing.assert_allclose([v[0, 1], v[1, 1], v[2, 1]], [5, 0, 5], atol=1e-6)
        td = np.asarray(out.td)[0]
        np.testing.assert_allclose(td[2], [5 / 3, -5], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(out.a_fp)[0, 2, 0], 5 / 3 - 5 * lam, atol=1e-5)
        assert bool(out.converged[0])


def test_grpo_singleton_and_empty_groups():
    b = batch_from_trajectories([[Trajectory(["a"], [3.0], SUCCESS)], [Trajectory([], [], FAILURE)]])
    with pytest.raises(ValueError, match="single non-empty trajectory"):
        bj.grpo(b)
    out = bj.grpo(b, GRPOConfig(norm="mean_std"), check=False)  # the in-jit rule, flagged
    assert list(np.asarray(out.invalid)) == [bj.SINGLE_TRAJECTORY, 0]
    a = np.asarray(out.advantage)
    assert a[0, 0, 0] == pytest.approx(3.0 / (1 + 1e-6))  # n = 1: mu = 0, sigma = 1
    assert np.all(a[1] == 0)  # no valid record: zeros


# ------------------------------------------------------------- against the references


@pytest.mark.parametrize("norm,weighting,std", pairwise_params(COMBOS))
@given(data=batches(), eps=st.sampled_from([1e-6, 1e-3]))
def test_grpo_matches_reference(norm, weighting, std, data, eps):
    batch, np_batch = data
    cfg = GRPOConfig(norm=norm, weighting=weighting, std=std, eps=eps)
    got = bj.grpo(batch, cfg).advantage
    assert_close(got, ref_grpo(np_batch, norm=norm, weighting=weighting, std=std, eps=eps), what="grpo")


@pytest.mark.parametrize("norm,weighting,std", pairwise_params(COMBOS))
@given(data=batches(), gamma=gammas, omega=st.sampled_from([0.0, 0.5, 1.0, 2.0]))
def test_gigpo_matches_reference(norm, weighting, std, data, gamma, omega):
    batch, np_batch = data
    cfg = GiGPOConfig(gamma=gamma, omega=omega, norm=norm, weighting=weighting, std=std)
    got = bj.gigpo(batch, cfg).advantage
    want = ref_gigpo(np_batch, gamma=gamma, omega=omega, norm=norm, weighting=weighting, std=std, eps=1e-6)
    assert_close(got, want, what="gigpo")


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
@settings(max_examples=12)  # every program (shape x history length x base group) compiles anew: few examples
@given(data=batches(), gamma=gammas, history_length=st.sampled_from([0, 1, 2, 3]),
       alpha=st.sampled_from([0.0, 1.0, 2.0]), base_group=st.booleans())
def test_hgpo_matches_reference(norm, data, gamma, history_length, alpha, base_group):
    batch, np_batch = data
    cfg = HGPOConfig(history_length=history_length, length_weight_alpha=alpha, base_group=base_group, norm=norm,
                     gamma=gamma)
    got = bj.hgpo(batch, cfg).advantage
    want = ref_hgpo(np_batch, history_length=history_length, length_weight_alpha=alpha, base_group=base_group,
                    norm=norm, gamma=gamma, eps=1e-6)
    assert_close(got, want, what="hgpo")


def test_hgpo_levels_by_hand():
    """Three trajectories a-b-c (success), a-b-d (failure), a-e-c (success), gamma 0.95,
    mean_std: at t = 1 the level-1 group {b, b} and the level-2 group {(a, b), (a, b)} hold
    the same two records, so A = (2 * 1 + 3 * 1) / (2 + 3 + eps) = 1 (and -1); at t = 2 the
    two c's have equal returns (advantage 0, excluded) and nothing else is shared."""
    b = bj.batch_from_trajectories([[Trajectory(["a", "b", "c"], [0, 0, 10], SUCCESS),
                                     Trajectory(["a", "b", "d"], [0, 0, 0], FAILURE),
                                     Trajectory(["a", "e", "c"], [0, 0, 10], SUCCESS)]])
    out = bj.hgpo(b)
    a = np.asarray(out.advantage)[0]
    np.testing.assert_allclose(a[:, 1], [1.0, -1.0, 0.0], atol=2e-6)
    np.testing.assert_allclose(a[:, 2], 0.0)
    # t = 0: one level-1 group {a, a, a} of returns (9.025, 0, 9.025): +-1/sqrt(2) scaled
    y = np.array([9.025, 0.0, 9.025])
    z = (y - y.mean()) / (y.std() + 1e-6)
    np.testing.assert_allclose(a[:, 0], z * 2 / (2 + 1e-6), rtol=1e-5)
    assert np.asarray(out.a_levels).shape == (1, 3, 3, 3)
    base = bj.hgpo(b, HGPOConfig(base_group=True)).advantage
    assert not np.allclose(np.asarray(base), a)  # the outcome level changes the mean
    with pytest.raises(ValueError, match="history_length"):
        HGPOConfig(history_length=-1)
    with pytest.raises(ValueError, match="norm"):
        HGPOConfig(norm="mean_std_norm")
    with pytest.raises(ValueError, match="base_group"):
        HGPOConfig(base_group=1)


BEPO_COMBOS = [(n, wt, s, solver, gate_on) for (n, wt, s) in COMBOS for solver in ("dense", "sparse", "solve")
               for gate_on in ("successor", "reward_successor")]


@pytest.mark.parametrize("norm,weighting,std,solver,gate_on", pairwise_params(BEPO_COMBOS))
@settings(max_examples=10)
@given(data=batches(shape=(2, 4, 6)), gamma=gammas, lam=unit, w=st.sampled_from([0.0, 1.0, 2.0]),
       eta=st.sampled_from([0.0, 0.5, 1.0]), min_successors=st.sampled_from([1, 2, 3]))
def test_gated_bepo_matches_reference(norm, weighting, std, solver, gate_on, data, gamma, lam, w, eta, min_successors):
    batch, np_batch = data
    cfg = GatedBEPOConfig(gamma=gamma, lam=lam, w=w, eta_gated=eta, norm=norm, weighting=weighting, std=std,
                          min_successors=min_successors, gate_on=gate_on, solver=solver, max_iters=5000)
    out = bj.gated_bepo(batch, cfg)
    want = ref_gated_bepo(np_batch, gamma=gamma, lam=lam, w=w, eta_gated=eta, norm=norm, weighting=weighting,
                          std=std, eps=1e-6, min_successors=min_successors, gate_on=gate_on, tol=1e-6,
                          max_iters=5000, exact=True)
    assert np.all(np.asarray(out.converged))
    np.testing.assert_array_equal(np.asarray(out.gate), want["gate"].astype(bool))
    np.testing.assert_array_equal(np.asarray(out.num_states), want["num_states"])
    for field in ("value", "td", "a_fp", "a_out"):
        assert_close(getattr(out, field), want[field], what=field)
    # The advantage divides A_FP by its gated std: compare relative to the unscaled parts.
    assert_close(out.advantage, want["advantage"], what="advantage", rtol=3e-4)


@pytest.mark.parametrize("solver", ["dense", "sparse"])
@given(data=batches(), gamma=gammas, max_iters=st.sampled_from([0, 1, 3, 1000]))
def test_jacobi_iterations_match_reference(solver, data, gamma, max_iters):
    """Same sweeps, same stopping rule: values and (up to float rounding) iteration counts agree."""
    batch, np_batch = data
    tol = 1e-4
    out = bj.gated_bepo(batch, GatedBEPOConfig(gamma=gamma, solver=solver, tol=tol, max_iters=max_iters))
    want = ref_gated_bepo(np_batch, gamma=gamma, lam=0.5, w=1.0, eta_gated=0.5, norm="mean_std", weighting="step",
                          std="unbiased", eps=1e-6, min_successors=2, gate_on="successor", tol=tol,
                          max_iters=max_iters, exact=False)
    iters = np.asarray(out.iterations)
    assert np.all(iters <= max_iters)
    assert np.all(np.abs(iters - np.array(want["iterations"])) <= 1), (iters, want["iterations"])
    assert_close(out.value, want["value"], what="value", rtol=1e-4)


# ------------------------------------------------------------------------ properties


def _no_repeat_batch(rng, B=2, K=4, T=5):
    obs = rng.choice(2**32, size=(B, K, T, 2), replace=False).astype(np.uint32)
    L = rng.integers(0, T + 1, (B, K))
    mask = np.arange(T) < L[..., None]
    reward = rng.choice([0.0, 1.0, 10.0], (B, K, T)).astype(np.float32)
    return StepBatch(obs, reward, mask, rng.integers(0, 3, (B, K)).astype(np.int32),
                     rng.choice([0.0, -0.5], (B, K, T)).astype(np.float32))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("solver", ["dense", "sparse", "solve"])
def test_no_repeated_state_reduces_to_grpo(norm, solver):
    rng = np.random.default_rng(0)
    for _ in range(3):
        b = _no_repeat_batch(rng)
        out = bj.gated_bepo(b, GatedBEPOConfig(norm=norm, solver=solver, lam=0.7))
        assert np.abs(np.asarray(out.a_fp)).max() <= 1e-5
        assert not np.asarray(out.gate).any()
        np.testing.assert_allclose(np.asarray(out.advantage), np.asarray(out.a_out), atol=1e-6)
        np.testing.assert_allclose(np.asarray(out.advantage), np.asarray(bj.grpo(b, GRPOConfig(norm=norm)).advantage),
                                   atol=1e-6)


@given(data=batches(), gamma=gammas)
def test_td_residuals_sum_to_zero_at_every_state(data, gamma):
    """At the fixed point, sum_{i at s} delta_i = 0, and delta_i = 0 where E(s) has one (r, s') pair."""
    batch, (obs, reward, mask, outcome, pen) = data
    out = bj.gated_bepo(batch, GatedBEPOConfig(gamma=gamma, solver="solve"))
    td = np.asarray(out.td)
    value_scale = 1.0 + np.abs(np.asarray(out.value)).max()
    for b in range(mask.shape[0]):
        sums, pairs = {}, {}
        K, T = mask[b].shape
        for k in range(K):
            L = int(mask[b, k].sum())
            for t in range(L):
                s = tuple(obs[b, k, t])
                nxt = tuple(obs[b, k, t + 1]) if t + 1 < L else ("END", int(outcome[b, k]))
                sums[s] = sums.get(s, 0.0) + td[b, k, t]
                pairs.setdefault(s, set()).add((float(reward[b, k, t] + pen[b, k, t]), nxt))
        for s, total in sums.items():
            assert abs(total) <= 1e-4 * value_scale * len(obs[b].reshape(-1, 2))
        for k in range(K):
            for t in range(int(mask[b, k].sum())):
                if len(pairs[tuple(obs[b, k, t])]) == 1:
                    assert abs(td[b, k, t]) <= 1e-5 * value_scale


@given(data=batches(penalty=False), gamma=gammas)
def test_lam1_mc_init_equals_gigpo_mean_step_term(data, gamma):
    batch, _ = data
    out = bj.gated_bepo(batch, GatedBEPOConfig(gamma=gamma, lam=1.0, max_iters=0))
    gi = bj.gigpo(batch, GiGPOConfig(gamma=gamma, norm="mean"))
    assert np.all(np.asarray(out.iterations) == 0)
    # GiGPO's singleton step groups are 0 by rule; A_FP there is G - G = 0 as well.
    assert_close(out.a_fp, gi.a_step, rtol=1e-5, what="a_fp vs GiGPO A^S")


@given(data=batches(), gamma=gammas)
def test_fixed_point_satisfies_bellman(data, gamma):
    batch, (obs, reward, mask, outcome, pen) = data
    out = bj.gated_bepo(batch, GatedBEPOConfig(gamma=gamma, solver="dense", tol=1e-7, max_iters=5000))
    v = np.asarray(out.value)
    r = reward + pen
    for b in range(mask.shape[0]):
        targets, value = {}, {}
        for k in range(mask.shape[1]):
            L = int(mask[b, k].sum())
            for t in range(L):
                s = tuple(obs[b, k, t])
                v_next = v[b, k, t + 1] if t + 1 < L else 0.0
                targets.setdefault(s, []).append(r[b, k, t] + gamma * v_next)
                value[s] = v[b, k, t]
        scale = 1.0 + max([abs(x) for x in value.values()], default=0.0)
        for s, ts in targets.items():
            assert abs(np.mean(ts) - value[s]) <= 1e-4 * scale


ESTIMATORS = [
    (bj.grpo, GRPOConfig()),
    (bj.gigpo, GiGPOConfig(norm="mean_std")),
    (bj.hgpo, HGPOConfig(base_group=True)),
    (bj.g2po, bj.G2POConfig(norm="mean_std")),
    (bj.g2po_abstract, bj.G2POAbstractConfig()),
    (bj.gated_bepo, GatedBEPOConfig(gamma=0.9, tol=1e-7, max_iters=5000)),
    (bj.gated_bepo, GatedBEPOConfig(solver="sparse", gate_on="reward_successor", weighting="trajectory")),
]


@pytest.mark.parametrize("fn,cfg", ESTIMATORS)
@given(data=batches(shape=(2, 4, 6)), perm_seed=st.integers(0, 1000))
def test_permuting_trajectories_permutes_outputs(fn, cfg, data, perm_seed):
    batch, _ = data
    perm = np.random.default_rng(perm_seed).permutation(batch.mask.shape[1])
    permuted = jax.tree_util.tree_map(lambda x: np.asarray(x)[:, perm], batch)
    a = np.asarray(fn(batch, cfg).advantage)
    p = np.asarray(fn(permuted, cfg).advantage)
    assert_close(p, a[:, perm], rtol=1e-5, what="permutation")


@pytest.mark.parametrize("fn,cfg", ESTIMATORS)
@given(data=batches(), salt=st.integers(1, 2**31))
def test_relabelling_hashes_changes_nothing(fn, cfg, data, salt):
    batch, (obs, *_rest) = data
    # An injective relabelling of the 64-bit keys: xor with a constant, then swap the words.
    relabel = (np.asarray(batch.obs_key) ^ np.uint32(salt))[..., ::-1].copy()
    other = StepBatch(relabel, batch.reward, batch.mask, batch.outcome, batch.penalty)
    assert_close(fn(other, cfg).advantage, fn(batch, cfg).advantage, rtol=1e-5, what="relabel")


@pytest.mark.parametrize("fn,cfg", ESTIMATORS)
@given(data=batches(shape=(2, 4, 6)), extra=st.sampled_from([(1, 0), (0, 3), (2, 1)]))
def test_padding_changes_nothing(fn, cfg, data, extra):
    """Padding more steps and more groups leaves the real records' advantages alone."""
    batch, _ = data
    db, dt = extra
    B, K, T = batch.mask.shape

    def pad(x, fill):
        x = np.asarray(x)
        widths = [(0, db), (0, 0), (0, dt)][: x.ndim] + [(0, 0)] * max(0, x.ndim - 3)
        if x.ndim == 2:
            widths = [(0, db), (0, 0)]
        return np.pad(x, widths, constant_values=fill)

    padded = StepBatch(pad(batch.obs_key, 7), pad(batch.reward, 0.0), pad(batch.mask, False),
                       pad(batch.outcome, FAILURE), None if batch.penalty is None else pad(batch.penalty, 0.0))
    a = np.asarray(fn(batch, cfg).advantage)
    p = np.asarray(fn(padded, cfg).advantage)
    assert_close(p[:B, :K, :T], a, rtol=1e-5, what="padding")
    assert np.all(p[B:] == 0) and np.all(p[:, :, T:] == 0)


@pytest.mark.parametrize("fn,cfg", ESTIMATORS)
def test_outputs_are_zero_at_padding_even_with_garbage(fn, cfg):
    rng = np.random.default_rng(3)
    b = _no_repeat_batch(rng)
    garbage = StepBatch(b.obs_key, np.where(b.mask, b.reward, np.nan).astype(np.float32), b.mask, b.outcome,
                        np.where(b.mask, b.penalty, np.inf).astype(np.float32))
    out = fn(garbage, cfg)
    for leaf in jax.tree_util.tree_leaves(out):
        assert np.all(np.isfinite(np.asarray(leaf, np.float64)))
    assert np.all(np.asarray(out.advantage)[~b.mask] == 0)


def test_empty_trajectories_and_truncation():
    b = batch_from_trajectories([[Trajectory([], [], FAILURE), Trajectory(["a", "a", "a"], [0, 0, 0], TRUNCATED),
                                  Trajectory(["a", "b"], [0, 10], SUCCESS)]])
    out = bj.gated_bepo(b, GatedBEPOConfig(gamma=1.0))
    assert bool(out.converged[0])
    gate = np.asarray(out.gate)[0]
    assert gate[1, 0] and gate[2, 0]  # "a" -> {a, END[TRUNCATED], b}
    assert not gate[0].any()
    # V(a) = mean(V(a), V(a), 0 [END T], V(b)) with V(b) = 10: V(a) = (2 V(a) + 10) / 4 -> V(a) = 5
    np.testing.assert_allclose(np.asarray(out.value)[0, 1, 0], 5.0, rtol=1e-5)


# ------------------------------------------------------------ compilation behaviour


def test_kernels_compile_once_per_shape_and_structure():
    rng = np.random.default_rng(1)
    for kernel, configs in [
        (bj.gated_bepo_kernel, [GatedBEPOConfig(lam=l, w=w, gamma=g) for l, w, g in [(0.1, 1.0, 0.9), (0.9, 0.5, 1.0)]]),
        (bj.gigpo_kernel, [GiGPOConfig(gamma=0.5, omega=2.0), GiGPOConfig(gamma=0.9)]),
        (bj.grpo_kernel, [GRPOConfig(eps=1e-3), GRPOConfig()]),
    ]:
        counted = jax.jit(chex.assert_max_traces(kernel, n=1))
        for cfg in configs:
            for _ in range(2):
                counted(bj.check_batch(_no_repeat_batch(rng)), cfg)
        chex.clear_trace_counter()


def test_public_entry_caches_compilation():
    _gated_bepo_jit = bj.gated_bepo.jitted

    rng = np.random.default_rng(2)
    shape = (3, 5, 7)
    bj.gated_bepo(_no_repeat_batch(rng, *shape), GatedBEPOConfig(lam=0.2))
    before = _gated_bepo_jit._cache_size()
    for lam in (0.3, 0.4, 0.9):
        bj.gated_bepo(_no_repeat_batch(rng, *shape), GatedBEPOConfig(lam=lam, w=lam))
    assert _gated_bepo_jit._cache_size() == before


def test_kernels_vmap_and_jit_inside_user_code():
    rng = np.random.default_rng(4)
    batches_ = [bj.check_batch(_no_repeat_batch(rng)) for _ in range(3)]
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *batches_)
    cfg = GatedBEPOConfig(gamma=0.9)
    vm = jax.jit(jax.vmap(lambda b: bj.gated_bepo_kernel(b, cfg)))(stacked)  # jitted: compiled once, not op by op
    for i, b in enumerate(batches_):
        np.testing.assert_allclose(np.asarray(vm.advantage[i]), np.asarray(bj.gated_bepo(b, cfg).advantage), atol=1e-6)

    @jax.jit
    def user_step(batch, lam):
        return bj.gated_bepo(batch, GatedBEPOConfig(lam=lam)).advantage.sum()

    assert np.isfinite(float(user_step(batches_[0], 0.3)))


def test_outputs_are_stop_gradient():
    rng = np.random.default_rng(5)
    b = bj.check_batch(_no_repeat_batch(rng))

    def f(scale):
        scaled = StepBatch(b.obs_key, b.reward * scale, b.mask, b.outcome, b.penalty)
        return bj.gated_bepo_kernel(scaled, GatedBEPOConfig()).advantage.sum()

    assert float(jax.jit(jax.grad(f))(1.0)) == 0.0
