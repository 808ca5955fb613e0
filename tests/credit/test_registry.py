"""Every estimator in the registry: GraphGPO, GAGPO, the ablations, confidence returns,
history-aware keys, diagnostics, configs as dicts."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import (FAILURE, SUCCESS, ConfidenceConfig, GAGPOConfig, GatedBEPOConfig, GiGPOConfig, GraphGPOConfig,
                      StepBatch)
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories
from bepo_jax.credit.hashing import hash_observation

from tests.helpers import assert_close
from bepo_jax.credit.reference import ref_confidence_returns, ref_gagpo, ref_gated_bepo, ref_graphgpo
from tests.strategies import NORMS, batches

BEPO_DEFAULTS = dict(gamma=0.95, lam=0.5, w=1.0, eta_gated=0.5, norm="mean_std", weighting="step", std="unbiased",
                     eps=1e-6, min_successors=2, gate_on="successor", tol=1e-6, max_iters=1000)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("weighting", ["step", "trajectory"])
@given(data=batches(), omega_g=st.sampled_from([0.1, 0.2, 0.5, 1.0]),
       betas=st.sampled_from([(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)]), progress=st.booleans())
def test_graphgpo_matches_reference(norm, weighting, data, omega_g, betas, progress):
    batch, np_batch = data
    cfg = GraphGPOConfig(omega_g=omega_g, beta_g=betas[0], beta_e=betas[1], norm=norm, weighting=weighting,
                         normalize_distance=progress)
    out = bj.graphgpo(batch, cfg)
    want, dist = ref_graphgpo(np_batch, omega_g=omega_g, scale=10.0, beta_g=betas[0], beta_e=betas[1], norm=norm,
                              weighting=weighting, std="unbiased", eps=1e-6, normalize_distance=progress)
    np.testing.assert_array_equal(np.asarray(out.distance), dist)
    assert_close(out.advantage, want, what="graphgpo")


@given(data=batches())
def test_graphgpo_no_success_means_zero_graph_advantage(data):
    batch, _ = data
    failed = StepBatch(batch.obs_key, batch.reward, batch.mask, np.full_like(np.asarray(batch.outcome), FAILURE),
                       batch.penalty)
    out = bj.graphgpo(failed)
    assert np.all(np.asarray(out.a_graph) == 0)
    assert np.all(np.asarray(out.distance)[np.asarray(batch.mask)] == 1)


def test_graphgpo_distances_on_a_chain():
    b = batch_from_trajectories([[Trajectory(["a", "b", "c"], [0, 0, 10], SUCCESS),
                                  Trajectory(["a", "x"], [0, 0], FAILURE)]])
    d = np.asarray(bj.graphgpo(b).distance)[0]
    # d(c) = 1, d(b) = 2, d(a) = 3; x and END[FAILURE] cannot reach SUCCESS: max finite d + 1 = 4
    np.testing.assert_array_equal(d[0], [2, 1, 0])
    np.testing.assert_array_equal(d[1, :2], [4, 4])


def test_graphgpo_normalize_distance_rewards_progress_not_proximity():
    """At the shared start a: proximity returns 10 w^d(s') = 10 w^2 vs 10 w^4; progress
    returns 10 w^(d(s') - d(a) + 1) = 10 w^0 (a step closer) vs 10 w^2 (a step away)."""
    b = batch_from_trajectories([[Trajectory(["a", "b", "c"], [0, 0, 10], SUCCESS),
                                  Trajectory(["a", "x"], [0, 0], FAILURE)]])
    for progress, (y0, y1) in [(False, (0.1, 0.001)), (True, (10.0, 0.1))]:
        cfg = GraphGPOConfig(omega_g=0.1, norm="mean", normalize_distance=progress)
        a = np.asarray(bj.graphgpo(b, cfg).a_graph)[0]
        np.testing.assert_allclose([a[0, 0], a[1, 0]], [(y0 - y1) / 2, (y1 - y0) / 2], rtol=1e-5)
        assert np.all(a[:, 1:] == 0)  # b, c and x are visited once: singleton groups


def test_graphgpo_defaults_are_the_reference_recipe():
    cfg = GraphGPOConfig()
    assert (cfg.omega_g, cfg.norm, cfg.beta_g, cfg.beta_e, cfg.scale, cfg.normalize_distance) == \
        (0.1, "mean_std", 1.0, 1.0, 10.0, False)
    with pytest.raises(ValueError, match="normalize_distance"):
        GraphGPOConfig(normalize_distance=1)


@pytest.mark.parametrize("norm,weighting", [("mean_std", "step"), ("mean", "trajectory")])
@given(data=batches(), gamma=st.sampled_from([0.5, 0.95, 1.0]), lam=st.sampled_from([0.0, 0.5, 1.0]))
def test_gagpo_matches_its_definition(norm, weighting, data, gamma, lam):
    """Against ``ref_gagpo``: MC means, TD, GAE and A_out + w A_FP written as loops (no
    Gated-BEPO code, no rescale)."""
    batch, np_batch = data
    out = bj.gagpo(batch, GAGPOConfig(gamma=gamma, lam=lam, w=0.7, norm=norm, weighting=weighting))
    want = ref_gagpo(np_batch, gamma=gamma, lam=lam, w=0.7, norm=norm, weighting=weighting, std="unbiased", eps=1e-6)
    assert np.all(np.asarray(out.iterations) == 0) and np.all(np.asarray(out.gate) == np.asarray(batch.mask))
    assert_close(out.advantage, want, what="gagpo", rtol=3e-4)


@given(data=batches())
def test_gagpo_fp_scale_std_divides_by_the_std_of_a_fp(data):
    batch, _ = data
    raw = bj.gagpo(batch, GAGPOConfig())
    scaled = bj.gagpo(batch, GAGPOConfig(fp_scale="std"))
    np.testing.assert_array_equal(np.asarray(raw.fp_scale), 1.0)  # the definition: A_FP in reward units
    m = np.asarray(batch.mask)
    for b in range(m.shape[0]):
        a_fp = np.asarray(raw.a_fp)[b][m[b]]
        if a_fp.size > 1 and np.std(a_fp, ddof=1) > 1e-3:
            want = np.asarray(raw.a_out)[b][m[b]] + a_fp / (np.std(a_fp.astype(np.float64), ddof=1) + 1e-6)
            np.testing.assert_allclose(np.asarray(scaled.advantage)[b][m[b]], want, rtol=1e-4, atol=1e-4)


@given(data=batches(), lam=st.sampled_from([0.0, 0.5, 1.0]))
def test_bepo_nogate_gates_everything(data, lam):
    batch, np_batch = data
    out = bj.bepo_nogate(batch, GatedBEPOConfig(lam=lam))
    np.testing.assert_array_equal(np.asarray(out.gate), np.asarray(batch.mask))
    want = ref_gated_bepo(np_batch, **{**BEPO_DEFAULTS, "lam": lam}, gate_all=True, exact=True)
    assert_close(out.advantage, want["advantage"], what="bepo_nogate", rtol=3e-4)
    assert float(jnp.min(out.diagnostics.gated_share[jnp.any(batch.mask, axis=(1, 2))])) == 1.0


@given(data=batches(penalty=False), gamma=st.sampled_from([0.5, 0.95, 1.0]))
def test_bepo_mc_lam1_equals_gigpo_mean_step_term(data, gamma):
    batch, _ = data
    out = bj.bepo_mc(batch, GatedBEPOConfig(gamma=gamma, lam=1.0, max_iters=500))  # max_iters is forced to 0
    assert np.all(np.asarray(out.iterations) == 0)
    assert_close(out.a_fp, bj.gigpo(batch, GiGPOConfig(gamma=gamma, norm="mean")).a_step, rtol=1e-5, what="bepo_mc")


@given(data=batches(), eta=st.sampled_from([0.0, 0.2, 0.5]))
def test_bepo_additive_matches_reference_with_eta_one(data, eta):
    """bepo_additive ignores the config's eta_gated: the plain-loop reference with eta = 1."""
    batch, np_batch = data
    out = bj.bepo_additive(batch, GatedBEPOConfig(eta_gated=eta))
    want = ref_gated_bepo(np_batch, **{**BEPO_DEFAULTS, "eta_gated": 1.0}, exact=True)
    assert_close(out.advantage, want["advantage"], what="bepo_additive", rtol=3e-4)


@pytest.mark.parametrize("source", ["constant", "gate"])
@given(data=batches(), c=st.sampled_from([0.3, 0.7, 0.99]))
def test_confidence_returns_match_reference(source, data, c):
    """V and the gate come from the plain-loop reference (exact float64 solve), not from the package."""
    batch, np_batch = data
    out = bj.confidence_returns(batch, ConfidenceConfig(c=c, confidence=source))
    ref = ref_gated_bepo(np_batch, **BEPO_DEFAULTS, exact=True)
    assert_close(out.baseline, ref["value"], what="fixed-point baseline", rtol=3e-4)
    conf = np.where(ref["gate"] > 0, 1.0, c) if source == "gate" else np.full(batch.mask.shape, c)
    want = ref_confidence_returns(np_batch, ref["value"], conf, 0.95)
    assert_close(out.advantage, want, what="confidence returns", rtol=3e-4)


def test_confidence_near_one_approaches_mc_return_minus_value():
    b = batch_from_trajectories([[Trajectory(["a", "b"], [0, 10], SUCCESS), Trajectory(["a", "c"], [0, 0], FAILURE)]])
    out = bj.confidence_returns(b, ConfidenceConfig(c=1.0 - 1e-6, gamma=1.0))
    np.testing.assert_allclose(np.asarray(out.returns)[0, :, 0], [10, 0], atol=1e-4)
    np.testing.assert_allclose(np.asarray(out.advantage)[0, :, 0], [5, -5], atol=1e-4)


@pytest.mark.parametrize("c", [0.0, 1.0, 1.5, -0.2])
def test_confidence_constant_outside_open_interval_is_refused(c):
    with pytest.raises(ValueError, match="ConfidenceConfig.c"):
        ConfidenceConfig(c=c)


def test_confidence_head_starts_at_0_7_and_learns():
    rng = np.random.default_rng(0)
    b = batch_from_trajectories([[Trajectory(["s", f"x{rng.integers(3)}", "g"], [0, 0, 10 * (k % 2)],
                                             SUCCESS if k % 2 else FAILURE) for k in range(6)]])
    base = bj.gated_bepo(b)
    feats = bj.confidence_features(b, base)
    head = bj.ConfidenceHead(rngs=nnx.Rngs(0))
    c = head(feats)
    np.testing.assert_allclose(np.asarray(c), 0.7, atol=1e-6)
    out = bj.confidence_returns(b, ConfidenceConfig(confidence="given"), confidence=c)
    np.testing.assert_allclose(np.asarray(out.confidence)[np.asarray(b.mask)], 0.7, atol=1e-6)

    opt = nnx.Optimizer(head, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(head, opt):
        loss_fn = lambda h: bj.confidence_loss(h, feats, b.mask, b.outcome, entropy_coef=0.01)
        (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(head)
        opt.update(head, grads)
        return loss

    first = float(step(head, opt))
    for _ in range(60):
        last = float(step(head, opt))
    assert last < first - 0.1


def test_confidence_given_errors():
    b = batch_from_trajectories([[Trajectory(["a"], [1.0], SUCCESS), Trajectory(["b"], [0.0], FAILURE)]])
    with pytest.raises(ValueError, match="needs the confidence array"):
        bj.confidence_returns(b, ConfidenceConfig(confidence="given"))
    with pytest.raises(ValueError, match="set confidence=\"given\""):
        bj.confidence_returns(b, ConfidenceConfig(), confidence=np.full((1, 2, 1), 0.5))
    for bad in (0.0, 1.0, np.nan):
        with pytest.raises(ValueError, match=r"open interval \(0, 1\)"):
            bj.confidence_returns(b, ConfidenceConfig(confidence="given"), confidence=np.full((1, 2, 1), bad))


def test_confidence_head_output_stays_inside_the_open_interval():
    head = bj.ConfidenceHead(rngs=nnx.Rngs(0))
    c = head(jnp.full((4, 6), 1e4))  # saturated logits round to exactly 0 or 1 in float32 without the clip
    assert np.all((np.asarray(c) > 0) & (np.asarray(c) < 1))


# ------------------------------------------------------------------- history-aware keys


def _host_history_keys(obs, mask, h):
    """key'_t = digest of the tuple (o_t, ..., o_{t-h}) with a START marker before t = 0."""
    B, K, T, _ = obs.shape
    out = np.zeros_like(obs)
    for b in range(B):
        for k in range(K):
            for t in range(T):
                window = tuple(tuple(int(x) for x in obs[b, k, t - j]) if t - j >= 0 else "START" for j in range(h + 1))
                out[b, k, t] = hash_observation(repr(window))
    return out


@pytest.mark.parametrize("name", ["gigpo", "graphgpo", "gagpo", "gated_bepo", "confidence_returns"])
@given(data=batches(shape=(2, 4, 6)), h=st.sampled_from([1, 2]))
@settings(max_examples=8)
def test_history_keys_merge_on_the_last_h_observations(name, data, h):
    batch, (obs, *_r) = data
    host = StepBatch(_host_history_keys(obs, np.asarray(batch.mask), h), batch.reward, batch.mask, batch.outcome,
                     batch.penalty)
    got = bj.compute_advantages(name, batch, history=h)
    want = bj.compute_advantages(name, host, history=0)
    assert_close(got.advantage, want.advantage, rtol=1e-5, what=f"{name} history={h}")


def test_history_separates_aliased_states():
    # "corridor" reached from "start" leads to goal; from "side" to a trap: history 1 splits it.
    b = batch_from_trajectories([[Trajectory(["start", "corridor"], [0, 10], SUCCESS),
                                  Trajectory(["side", "corridor"], [0, 0], FAILURE)]])
    assert bool(bj.gated_bepo(b).gate[0, 0, 1])
    out = bj.gated_bepo(b, GatedBEPOConfig(history=1))
    assert not bool(out.gate[0, 0, 1]) and int(out.num_states[0]) == 4


# --------------------------------------------------------------------------- registry


def test_registry_lists_every_estimator_and_runs_them():
    assert set(bj.ESTIMATORS) == {"grpo", "gigpo", "graphgpo", "hgpo", "gagpo", "gated_bepo", "bepo_nogate", "bepo_mc",
                                  "bepo_additive", "confidence_returns", "g2po", "g2po_abstract", "proxmo", "ecpo", "ecpo_abstract",
                                  "pgpo"}
    b = batch_from_trajectories([[Trajectory(["a", "b"], [0, 10], SUCCESS), Trajectory(["a", "c", "c"], [0, 0, 0], FAILURE),
                                  Trajectory([], [], FAILURE)]])
    for name, est in bj.ESTIMATORS.items():
        out = bj.compute_advantages(name, b)
        adv = np.asarray(out.advantage)
        assert adv.shape == (1, 3, 3) and adv.dtype == np.float32
        assert np.all(adv[~np.asarray(b.mask)] == 0)
        assert np.all(np.isfinite(adv))
        if est.graph:
            d = out.diagnostics
            assert int(d.num_states[0]) == 3
            assert float(d.singleton_share[0]) == pytest.approx(1 / 5)  # only "b" is visited once


@pytest.mark.parametrize("name", list(bj.ESTIMATORS))
def test_every_registered_kernel_under_jit_equals_its_host_entry(name):
    """The registration's promise (docs/contributing.md): ``kernel`` is the jittable form of ``fn``
    and returns the registered output type."""
    est = bj.ESTIMATORS[name]
    b = batch_from_trajectories([[Trajectory(["a", "b"], [0, 10], SUCCESS), Trajectory(["a", "c", "c"], [0, 0, 0], FAILURE)],
                                 [Trajectory(["x"], [1.0], SUCCESS), Trajectory(["x", "y"], [0, 0], FAILURE)]])
    cfg = est.config_type()
    host, jitted = est.fn(b, cfg), jax.jit(est.kernel)(b, cfg)
    assert type(host) is est.output_type and type(jitted) is est.output_type
    np.testing.assert_array_equal(np.asarray(host.advantage), np.asarray(jitted.advantage))


def test_registration_refuses_a_taken_name_a_bad_name_and_a_bare_config():
    from bepo_jax.credit.estimators.registry import register_estimator

    grpo = bj.ESTIMATORS["grpo"]
    kw = dict(kernel=grpo.kernel, config=bj.GRPOConfig, output=bj.GRPOOutput, definition="d", source="s", graph=False)
    with pytest.raises(ValueError, match="'grpo' is registered already"):
        register_estimator("grpo", **kw)(grpo.fn)
    with pytest.raises(ValueError, match="lower-case letters"):
        register_estimator("My-GRPO", **kw)
    with pytest.raises(TypeError, match="lacks from_dict, to_dict, replace"):
        register_estimator("bare", **{**kw, "config": object})
    assert list(bj.ESTIMATORS)[0] == "grpo" and "bare" not in bj.ESTIMATORS


@pytest.mark.parametrize("name", sorted(bj.ESTIMATORS))
@settings(max_examples=6)
@given(data=batches(penalty=False, shape=(2, 4, 6)))  # one shape: the None path compiles its own programs
def test_no_penalty_is_a_zero_penalty(name, data):
    """``penalty=None`` (the default) gives what an all-zero penalty gives, for every estimator;
    the property tests draw penalties as arrays only (tests/strategies.py)."""
    batch, _ = data
    assert np.all(np.asarray(batch.penalty) == 0)
    none = StepBatch(batch.obs_key, batch.reward, batch.mask, batch.outcome, None)
    # 1e-5 of the scale: the None path compiles programs of its own, and float32 rounding differs between them;
    # in the fixed-point estimators a few ulps per Jacobi sweep add up (found: 2.9e-6 at scale 2.8 for gated_bepo)
    assert_close(bj.compute_advantages(name, none).advantage, bj.compute_advantages(name, batch).advantage,
                 rtol=1e-5, what=f"{name}: penalty=None against zeros")


def test_registry_errors_list_the_valid_values():
    b = batch_from_trajectories([[Trajectory(["a"], [1.0], SUCCESS)]])
    with pytest.raises(ValueError, match="unknown estimator 'ppo'; valid names: grpo, gigpo"):
        bj.compute_advantages("ppo", b)
    with pytest.raises(ValueError, match="GatedBEPOConfig has no field 'lamda'.*valid fields: gamma, lam"):
        bj.compute_advantages("gated_bepo", b, lamda=0.3)
    with pytest.raises(ValueError, match="GiGPOConfig has no field 'lam'"):
        bj.compute_advantages("gigpo", b, config={"lam": 0.3})
    with pytest.raises(ValueError, match="takes a GraphGPOConfig, got GiGPOConfig"):
        bj.compute_advantages("graphgpo", b, config=GiGPOConfig())
    with pytest.raises(ValueError, match="lam=2"):
        bj.compute_advantages("gated_bepo", b, lam=2.0)


@pytest.mark.parametrize("name", list(bj.ESTIMATORS))
def test_configs_round_trip_through_json(name):
    cfg_type = bj.ESTIMATORS[name].config_type
    cfg = cfg_type()
    d = json.loads(json.dumps(cfg.to_dict()))
    assert cfg_type.from_dict(d) == cfg
    b = batch_from_trajectories([[Trajectory(["a", "b"], [0, 10], SUCCESS), Trajectory(["a", "c"], [0, 0], FAILURE)]])
    np.testing.assert_array_equal(np.asarray(bj.compute_advantages(name, b, config=d).advantage),
                                  np.asarray(bj.compute_advantages(name, b).advantage))


@given(data=batches())
@settings(max_examples=10)
def test_diagnostics_match_loops(data):
    batch, (obs, reward, mask, outcome, pen) = data
    d = bj.gated_bepo(batch).diagnostics
    out = bj.gated_bepo(batch)
    for b in range(mask.shape[0]):
        visits, succs = {}, {}
        for k in range(mask.shape[1]):
            L = int(mask[b, k].sum())
            for t in range(L):
                s = tuple(obs[b, k, t])
                visits[s] = visits.get(s, 0) + 1
                succs.setdefault(s, set()).add(tuple(obs[b, k, t + 1]) if t + 1 < L else ("END", int(outcome[b, k])))
        n = int(mask[b].sum())
        assert int(d.num_states[b]) == len(visits)
        if n:
            single = sum(1 for k in range(mask.shape[1]) for t in range(int(mask[b, k].sum()))
                         if visits[tuple(obs[b, k, t])] == 1)
            assert float(d.singleton_share[b]) == pytest.approx(single / n)
            assert float(d.gated_share[b]) == pytest.approx(np.asarray(out.gate)[b].sum() / n)
            assert float(d.mean_out_degree[b]) == pytest.approx(np.mean([len(v) for v in succs.values()]), rel=1e-6)


def test_a_plugin_estimator_is_a_choice_of_the_command_line(tmp_path):
    """``bepo-jax --plugin MODULE`` imports the module before the command line is read: an estimator it
    registers with ``estimator_entry`` is listed by ``bepo-jax estimators`` and is public in the registry's
    names; a module that does not import is refused by name. (A fresh process: the registration is global.)"""
    import subprocess
    import sys

    (tmp_path / "my_rloo.py").write_text(
        "import jax.numpy as jnp\n"
        "from bepo_jax.credit.configs import pytree_config\n"
        "from bepo_jax.credit.estimators.common import estimator_entry\n"
        "from bepo_jax.credit.estimators.grpo import GRPOOutput\n\n"
        "@pytree_config(static=())\nclass HalfConfig:\n    \"\"\"none\"\"\"\n\n"
        "def half_kernel(batch, config):\n    \"\"\"half the reward\"\"\"\n"
        "    return GRPOOutput(advantage=0.5 * batch.reward, invalid=jnp.zeros(batch.mask.shape[:1], jnp.int32))\n\n"
        "@estimator_entry('half', kernel=half_kernel, config=HalfConfig, output=GRPOOutput, graph=False,\n"
        "                 definition='r / 2', source='a test')\n"
        "def half(batch, config=HalfConfig(), *, check=True):\n    \"\"\"r / 2\"\"\"\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "bepo_jax.cli", *a], capture_output=True, text=True, env=env)
    listed = run("--plugin", "my_rloo", "estimators")
    assert listed.returncode == 0, listed.stderr
    starts = lambda out: [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]
    assert starts(listed.stdout)[-1] == "half"  # registered after the built-ins
    assert "half" not in starts(run("estimators").stdout)
    bad = run("--plugin", "no_such_module_here", "estimators")
    assert bad.returncode == 2 and "--plugin no_such_module_here: the module does not import" in bad.stderr
    names = subprocess.run([sys.executable, "-c", "import my_rloo; from bepo_jax.credit.estimators import public_names;"
                            " print(sorted(n for n in public_names() if 'half' in n.lower()))"],
                           capture_output=True, text=True, env=env)
    assert names.stdout.strip() == "['HalfConfig', 'half', 'half_kernel']", names.stderr
