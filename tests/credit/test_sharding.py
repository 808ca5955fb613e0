"""8 simulated CPU devices (conftest): sharded == single device; shard_map's per-group
iteration counts are each group's own."""

import jax
import numpy as np
import pytest

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, GatedBEPOConfig
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories
from bepo_jax.credit.sharding import make_mesh, pad_groups, shard_batch, sharded

from tests.helpers import assert_close


def _walks(B=16, K=4, T=12, seed=0):
    """Random walks on a 3-cell line with self-loops: groups converge at different rates."""
    rng = np.random.default_rng(seed)
    groups = []
    for b in range(B):
        trajs = []
        for k in range(K):
            pos, obs, rew = 0, [], []
            L = int(rng.integers(1, T + 1))
            outcome = FAILURE
            for t in range(L):
                obs.append(f"c{pos}")
                pos = int(np.clip(pos + rng.choice([-1, 0, 1], p=[0.2, 0.5 - 0.04 * (b % 8), 0.3 + 0.04 * (b % 8)]), 0, 3))
                if pos == 3:
                    rew.append(10.0)
                    outcome = SUCCESS
                    break
                rew.append(0.0)
            trajs.append(Trajectory(obs, rew, outcome))
        groups.append(trajs)
    return batch_from_trajectories(groups, num_steps=T, group_size=K)


def test_eight_devices():
    assert jax.device_count() == 8


@pytest.mark.parametrize("name", list(bj.ESTIMATORS))
def test_jit_with_named_sharding_equals_single_device(name):
    mesh = make_mesh()
    batch = bj.check_batch(_walks())
    est = bj.ESTIMATORS[name]
    cfg = est.config_type(gamma=1.0) if "gamma" in est.config_type.__dataclass_fields__ else est.config_type()
    single = jax.jit(est.kernel)(batch, cfg)  # one device: the batch is not placed
    placed = shard_batch(batch, mesh)
    assert placed.mask.sharding.spec[0] == "data"
    multi = jax.jit(est.kernel)(placed, cfg)
    assert len(multi.advantage.sharding.device_set) == 8
    for a, b in zip(jax.tree_util.tree_leaves(multi), jax.tree_util.tree_leaves(single)):
        assert_close(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-6, what=name)


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
@pytest.mark.current_jax  # CI runs it on 3.12 (current JAX), not again on 3.11
@pytest.mark.parametrize("solver", ["dense", "sparse"])
def test_shard_map_iterations_are_per_group(solver):
    mesh = make_mesh()
    batch = bj.check_batch(_walks())
    cfg = GatedBEPOConfig(gamma=1.0, solver=solver)
    out = sharded(bj.gated_bepo_kernel, mesh)(batch, cfg)
    kernel = jax.jit(bj.gated_bepo_kernel)  # on one device (compiled once, not op by op)
    ref = kernel(batch, cfg)
    alone = [int(kernel(jax.tree_util.tree_map(lambda x: x[b:b + 1], batch), cfg).iterations[0])
             for b in range(16)]
    it = np.asarray(out.iterations)
    assert list(it) == alone == list(np.asarray(ref.iterations))
    assert len(set(alone)) > 1  # the groups really differ
    assert_close(out.advantage, ref.advantage, rtol=1e-6, what="shard_map")
    assert len(out.advantage.sharding.device_set) == 8


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
@pytest.mark.current_jax  # CI runs it on 3.12 (current JAX), not again on 3.11
def test_shard_map_every_estimator_runs():
    mesh = make_mesh()
    batch = bj.check_batch(_walks(B=8))
    for name, est in bj.ESTIMATORS.items():
        cfg = est.config_type()
        got = sharded(est.kernel, mesh)(batch, cfg)
        assert_close(got.advantage, jax.jit(est.kernel)(batch, cfg).advantage, rtol=1e-6, what=name)


def test_indivisible_batch_is_an_error_with_the_fix():
    mesh = make_mesh()
    batch = _walks(B=5)
    with pytest.raises(ValueError, match=r"B=5 groups, not a multiple of the 8 devices.*pad_groups\(batch, 8\)"):
        shard_batch(batch, mesh)
    padded, n = pad_groups(batch, 8)
    assert n == 5 and padded.mask.shape[0] == 8
    out = sharded(bj.gated_bepo_kernel, mesh)(bj.check_batch(padded), GatedBEPOConfig())
    ref = bj.gated_bepo(batch)
    assert_close(np.asarray(out.advantage)[:5], ref.advantage, rtol=1e-6, what="padded")
    assert np.all(np.asarray(out.advantage)[5:] == 0)


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
@pytest.mark.current_jax  # CI runs it on 3.12 (current JAX), not again on 3.11
def test_two_axis_mesh():
    mesh = make_mesh((4, 2), ("data", "model"))
    batch = bj.check_batch(_walks(B=8))
    out = jax.jit(bj.gated_bepo_kernel)(shard_batch(batch, mesh), GatedBEPOConfig())
    want = jax.jit(bj.gated_bepo_kernel)(batch, GatedBEPOConfig()).advantage
    assert_close(out.advantage, want, rtol=1e-6, what="2d mesh")
    with pytest.raises(ValueError, match="needs 6 devices, have 8"):
        make_mesh((3, 2), ("data", "model"))


@pytest.mark.parametrize("solver", ["dense", "solve", "auto"])
def test_state_bucket_overflow_falls_back_to_sparse(solver):
    batch = _walks(B=4)
    exact = bj.gated_bepo(batch, GatedBEPOConfig(solver="sparse"))
    most = int(np.asarray(exact.num_states).max())
    fits = bj.gated_bepo(batch, GatedBEPOConfig(solver=solver, max_states=most))
    assert not np.asarray(fits.diagnostics.overflow).any()
    assert_close(fits.advantage, exact.advantage, rtol=2e-4, what="bucket fits")
    with pytest.warns(RuntimeWarning, match=f"Set max_states >= {most}"):
        small = bj.gated_bepo(batch, GatedBEPOConfig(solver=solver, max_states=most - 1))
    assert np.asarray(small.diagnostics.overflow).any()
    assert_close(small.advantage, exact.advantage, rtol=1e-6, what="overflow")
