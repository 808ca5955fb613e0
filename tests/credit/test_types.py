"""Bad input gets a ValueError that names the field and the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bepo_jax as bj
from bepo_jax import GatedBEPOConfig, GiGPOConfig, GRPOConfig, StepBatch


def good(B=1, K=2, T=3):
    return dict(
        obs_key=np.zeros((B, K, T, 2), np.uint32),
        reward=np.zeros((B, K, T), np.float32),
        mask=np.ones((B, K, T), bool),
        outcome=np.zeros((B, K), np.int32),
        penalty=None,
    )


def with_(**kw):
    d = good()
    d.update(kw)
    return StepBatch(**d)


BAD = [
    (dict(obs_key=np.zeros((1, 2, 3), np.uint32)), r"obs_key has shape .*\[B, K, T, 2\]"),
    (dict(obs_key=np.zeros((1, 2, 3, 2), np.int64)), r"obs_key has dtype int64.*hash_observations"),
    (dict(reward=np.zeros((1, 2, 4), np.float32)), r"reward has shape \(1, 2, 4\), expected \(1, 2, 3\)"),
    (dict(reward=np.zeros((1, 2, 3), bool)), r"reward has dtype bool.*astype\(np.float32\)"),
    (dict(reward=np.array([[[0, np.nan, 0], [0, 0, 0]]], np.float32)), r"reward is not finite at valid step \(group 0, trajectory 0, step 1\)"),
    (dict(penalty=np.array([[[0, 0, 0], [0, 0, -np.inf]]], np.float32)), r"penalty is not finite .*trajectory 1, step 2"),
    (dict(mask=np.array([[[1, 0, 1], [1, 1, 1]]], bool)), r"mask is not a prefix at group 0, trajectory 0: step 2"),
    (dict(mask=np.ones((1, 2, 3), np.int32)), r"mask has dtype int32; it must be bool"),
    (dict(mask=np.ones((2, 3), bool)), r"mask must have shape \[B, K, T\]"),
    (dict(mask=np.ones((1, 0, 3), bool)), r"empty axis"),
    (dict(outcome=np.array([[0, 3]], np.int32)), r"outcome\[0, 1\] = 3 is not an outcome code"),
    (dict(outcome=np.array([[0, -1]], np.int32)), r"outcome\[0, 1\] = -1"),
    (dict(outcome=np.zeros((1, 2), np.float32)), r"outcome has dtype float32; it must be an integer"),
    (dict(outcome=np.zeros((1, 3), np.int32)), r"outcome has shape \(1, 3\), expected \(1, 2\)"),
]


@pytest.mark.parametrize("fields,message", BAD)
@pytest.mark.parametrize("fn", [bj.grpo, bj.gigpo, bj.gated_bepo])
def test_bad_batches_raise_naming_the_field(fields, message, fn):
    with pytest.raises(ValueError, match=message):
        fn(with_(**fields))


def test_not_a_stepbatch():
    with pytest.raises(ValueError, match="expected a bepo_jax.StepBatch"):
        bj.grpo(good())


def test_nan_in_padding_is_fine_and_ignored():
    d = good()
    d["mask"] = np.array([[[1, 1, 0], [1, 0, 0]]], bool)
    d["reward"] = np.array([[[0, 1, np.nan], [1, np.inf, np.nan]]], np.float32)
    out = bj.gated_bepo(StepBatch(**d))
    assert np.all(np.isfinite(np.asarray(out.advantage)))


def test_value_checks_skipped_inside_jit_but_shapes_checked():
    b = with_(mask=np.array([[[1, 0, 1], [1, 1, 1]]], bool))
    jax.jit(lambda bb: bj.grpo(bb).advantage)(b)  # tracers: value checks are skipped, no error
    with pytest.raises(ValueError, match="reward has shape"):
        jax.jit(lambda bb: bj.grpo(bb).advantage)(with_(reward=np.zeros((1, 2, 4), np.float32)))


def test_check_false_skips_value_checks():
    b = with_(outcome=np.array([[0, 7]], np.int32))
    bj.grpo(b, check=False)
    with pytest.raises(ValueError):
        bj.grpo(b)


def test_numeric_dtypes_are_cast():
    b = with_(reward=np.ones((1, 2, 3), np.float64), outcome=np.zeros((1, 2), np.int64))
    c = bj.check_batch(b)
    assert c.reward.dtype == jnp.float32 and c.outcome.dtype == jnp.int32


CONFIG_ERRORS = [
    (lambda: GatedBEPOConfig(lam=1.5), r"GatedBEPOConfig.lam=1.5 is out of range; it must be <= 1.0"),
    (lambda: GatedBEPOConfig(gamma=-0.1), r"GatedBEPOConfig.gamma=-0.1 is out of range"),
    (lambda: GatedBEPOConfig(solver="cg"), r"GatedBEPOConfig.solver='cg' is not valid; use one of 'dense', 'sparse', 'solve'"),
    (lambda: GatedBEPOConfig(norm="std"), r"norm='std' is not valid"),
    (lambda: GatedBEPOConfig(gate_on="reward"), r"gate_on='reward' is not valid"),
    (lambda: GatedBEPOConfig(min_successors=0), r"min_successors=0 is out of range"),
    (lambda: GatedBEPOConfig(max_iters=2.5), r"max_iters must be an int"),
    (lambda: GatedBEPOConfig(w=float("nan")), r"GatedBEPOConfig.w must be finite"),
    (lambda: GatedBEPOConfig(tol=-1.0), r"tol=-1.0 is out of range"),
    (lambda: GiGPOConfig(weighting="traj"), r"GiGPOConfig.weighting='traj' is not valid"),
    (lambda: GRPOConfig(std="sample"), r"GRPOConfig.std='sample' is not valid"),
    (lambda: GRPOConfig(eps=-1e-6), r"GRPOConfig.eps=-1e-06 is out of range"),
    (lambda: GatedBEPOConfig(0.9), r"positional|takes 1 positional"),
]


@pytest.mark.parametrize("make,message", CONFIG_ERRORS)
def test_config_errors(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_configs_are_frozen_and_hashable():
    cfg = GatedBEPOConfig()
    with pytest.raises(Exception):
        cfg.lam = 0.1  # type: ignore[misc]
    assert hash(cfg) == hash(GatedBEPOConfig())


def test_wrong_config_type():
    with pytest.raises(ValueError, match="config must be a GatedBEPOConfig"):
        bj.gated_bepo(with_(), GiGPOConfig())


def test_split_key64():
    k = np.array([0x0123456789ABCDEF], np.uint64)
    np.testing.assert_array_equal(bj.split_key64(k), [[0x01234567, 0x89ABCDEF]])
    with pytest.raises(ValueError, match="uint64"):
        bj.split_key64(np.array([1], np.int64))
