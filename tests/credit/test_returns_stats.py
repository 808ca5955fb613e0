import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from bepo_jax.credit.returns import discounted_cumsum, gae
from bepo_jax.credit.stats import masked_moments, segment_moments

from bepo_jax.credit.reference import ref_returns


@given(st.integers(0, 1000), st.sampled_from([0.0, 0.5, 0.95, 1.0]))
def test_discounted_cumsum_matches_loop(seed, d):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(3, 4, 7)).astype(np.float32)
    L = rng.integers(0, 8, (3, 4))
    mask = np.arange(7) < L[..., None]
    x_garbage = np.where(mask, x, np.nan)
    y = np.asarray(discounted_cumsum(jnp.asarray(x_garbage), jnp.asarray(mask), d))
    for i in range(3):
        for j in range(4):
            want = ref_returns(list(map(float, x[i, j, : L[i, j]])), d)
            np.testing.assert_allclose(y[i, j, : L[i, j]], want, rtol=1e-5, atol=1e-5)
            assert np.all(y[i, j, L[i, j]:] == 0)


def test_gae_equals_cumsum_with_gamma_lambda():
    delta = jnp.array([[1.0, 2.0, 3.0]])
    mask = jnp.ones((1, 3), bool)
    np.testing.assert_allclose(np.asarray(gae(delta, mask, 0.5, 0.5)), [[1 + 0.25 * (2 + 0.75), 2 + 0.75, 3]])


@given(st.integers(0, 1000), st.sampled_from([0, 1]))
def test_segment_moments_match_numpy(seed, ddof):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=20).astype(np.float32) * 10
    valid = rng.random(20) < 0.8
    seg = rng.integers(0, 5, 20)
    n, mu, sd, _ = (np.asarray(a) for a in segment_moments(jnp.asarray(x), jnp.asarray(valid), jnp.asarray(seg), 5, ddof=ddof))
    for s in range(5):
        vals = x[(seg == s) & valid].astype(np.float64)
        assert n[s] == len(vals)
        if len(vals):
            np.testing.assert_allclose(mu[s], vals.mean(), rtol=1e-5, atol=1e-6 * np.abs(x).max())
        if len(vals) > ddof:
            np.testing.assert_allclose(sd[s], vals.std(ddof=ddof), rtol=1e-4, atol=1e-5)
        else:
            assert sd[s] == 0
    c, m, s_, _ = masked_moments(jnp.asarray(x), jnp.asarray(valid), ddof=ddof)
    # float32 accumulation: error ~ eps * max|x|
    np.testing.assert_allclose(float(m), x[valid].astype(np.float64).mean(), rtol=1e-5, atol=1e-6 * np.abs(x).max())
