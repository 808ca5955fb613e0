"""Dense, sparse and direct solvers agree; non-convergence is reported, not hidden."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS, GatedBEPOConfig
from bepo_jax.credit.builders import Trajectory, batch_from_trajectories

from tests.helpers import assert_close
from tests.strategies import batches


@given(data=batches(), gamma=st.sampled_from([0.5, 0.9, 1.0]))
def test_dense_sparse_solve_agree(data, gamma):
    batch, _ = data
    outs = {s: bj.gated_bepo(batch, GatedBEPOConfig(gamma=gamma, solver=s)) for s in ("dense", "sparse", "solve")}
    for s in ("sparse", "solve"):
        for field in ("value", "td", "a_fp", "advantage"):
            assert_close(getattr(outs[s], field), getattr(outs["dense"], field), rtol=2e-4, what=f"{s}.{field}")
        assert np.all(np.asarray(outs[s].converged))
    np.testing.assert_array_equal(np.asarray(outs["dense"].gate), np.asarray(outs["sparse"].gate))


def _loop_group():
    # "a" loops on itself 10 times out of 12 (gamma 1): Jacobi converges at rate 5/6 from
    # the MC mean 100/12 to the fixed point V(a) = (10 V(a) + 10) / 12 = 5.
    return batch_from_trajectories([[Trajectory(["a"] * 10, [0.0] * 9 + [10.0], SUCCESS),
                                     Trajectory(["a", "a"], [0.0, 0.0], FAILURE)]])


@pytest.mark.parametrize("solver", ["dense", "sparse"])
def test_non_convergence_is_reported(solver):
    b = _loop_group()
    short = bj.gated_bepo(b, GatedBEPOConfig(gamma=1.0, max_iters=3, solver=solver))
    assert int(short.iterations[0]) == 3 and not bool(short.converged[0])
    full = bj.gated_bepo(b, GatedBEPOConfig(gamma=1.0, solver=solver))
    assert bool(full.converged[0]) and 3 < int(full.iterations[0]) < 1000
    np.testing.assert_allclose(np.asarray(short.value)[0, 0, 0], 5 + (100 / 12 - 5) * (5 / 6) ** 3, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(full.value)[0, 0, 0], 5.0, rtol=1e-4)


def test_per_group_iteration_counts_under_vmap():
    slow = _loop_group()
    fast = batch_from_trajectories([[Trajectory(["x", "y"], [0.0, 1.0], SUCCESS), Trajectory(["x", "z"], [0.0, 0.0], FAILURE)]],
                                   num_steps=10)
    both = bj.StepBatch(*(np.concatenate([np.asarray(getattr(slow, f)), np.asarray(getattr(fast, f))])
                          for f in ("obs_key", "reward", "mask", "outcome", "penalty")))
    out = bj.gated_bepo(both, GatedBEPOConfig(gamma=1.0))
    it = np.asarray(out.iterations)
    alone = [int(bj.gated_bepo(g, GatedBEPOConfig(gamma=1.0)).iterations[0]) for g in (slow, fast)]
    assert list(it) == alone and it[0] > it[1]


def test_tol_floor_keeps_tiny_tolerances_meaningful():
    b = _loop_group()
    out = bj.gated_bepo(b, GatedBEPOConfig(gamma=1.0, tol=0.0, max_iters=5000))
    assert bool(out.converged[0]) and int(out.iterations[0]) < 5000
