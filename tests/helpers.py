import os

import numpy as np


def xla_flags(devices: int) -> str:
    """This run's XLA_FLAGS (the compiler settings of the repository's conftest.py) with
    ``devices`` simulated CPU devices, for a subprocess that needs its own device count."""
    others = [f for f in os.environ.get("XLA_FLAGS", "").split()
              if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join([f"--xla_force_host_platform_device_count={devices}", *others])


def assert_close(actual, expected, *, rtol=1e-4, what=""):
    """|a - e| <= rtol * max(1, max|e|) everywhere: the issue's "1e-4 relative to the largest magnitude"."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    scale = max(1.0, float(np.max(np.abs(expected))) if expected.size else 1.0)
    err = np.max(np.abs(actual - expected)) if expected.size else 0.0
    assert err <= rtol * scale, f"{what}: max abs error {err:.3g} > {rtol} * {scale:.3g}\n{actual}\n{expected}"
