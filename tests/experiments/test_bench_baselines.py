"""The benchmark's efficient dict-based Python implementations compute the same numbers
as the literal reference (so their timings compare like with like)."""

import numpy as np
from hypothesis import given

from bepo_jax.credit import reference as ref
from experiments.dict_baselines import dict_gated_bepo, dict_gigpo

from tests.strategies import batches

B_DEF = dict(gamma=0.95, lam=0.5, w=1.0, eta_gated=0.5, norm="mean_std", weighting="step", std="unbiased", eps=1e-6,
             min_successors=2, gate_on="successor", tol=1e-6, max_iters=1000)


@given(data=batches())
def test_dict_gigpo_equals_the_reference(data):
    _, nb = data
    want = ref.ref_gigpo(nb, gamma=0.95, omega=1.0, norm="mean", weighting="step", std="unbiased", eps=1e-6)
    np.testing.assert_allclose(dict_gigpo(nb), want, rtol=1e-9, atol=1e-9)


@given(data=batches())
def test_dict_gated_bepo_equals_the_reference(data):
    _, nb = data
    want = ref.ref_gated_bepo(nb, **B_DEF)["advantage"]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(dict_gated_bepo(nb), want, rtol=0, atol=1e-4 * scale)
