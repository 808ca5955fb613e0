import numpy as np


def assert_close(actual, expected, *, rtol=1e-4, what=""):
    """|a - e| <= rtol * max(1, max|e|) everywhere: the issue's "1e-4 relative to the largest magnitude"."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    scale = max(1.0, float(np.max(np.abs(expected))) if expected.size else 1.0)
    err = np.max(np.abs(actual - expected)) if expected.size else 0.0
    assert err <= rtol * scale, f"{what}: max abs error {err:.3g} > {rtol} * {scale:.3g}\n{actual}\n{expected}"
