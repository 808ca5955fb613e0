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


def reference_batch(batch) -> tuple:
    """A StepBatch as the reference loops take it (``bepo_jax.credit.reference``): NumPy (obs_key, reward,
    mask, outcome, penalty), the penalty zeros where the batch has none."""
    return tuple(np.asarray(x) for x in (batch.obs_key, batch.reward, batch.mask, batch.outcome,
                                         batch.penalty_or_zeros()))


def pairwise_params(combos: list[tuple]) -> list:
    """The full product ``combos`` as pytest params, the rows outside a pairwise covering set marked exhaustive.

    A static option (norm, solver, gate...) compiles its own program, so a full product of them is
    mostly compile time. ``make test`` runs a subset in which every pair of values of any two factors
    occurs at least once (chosen greedily: the row covering the most uncovered pairs first); CI
    (``CI=1 make test``) runs the exhaustive rows too, so the full product is still tested there
    (``make test-py312`` skips them: the pairs cover current JAX)."""
    import pytest

    width = len(combos[0])
    assert all(len(c) == width for c in combos), combos

    def pairs(row):
        return {(i, row[i], j, row[j]) for i in range(width) for j in range(i + 1, width)}

    uncovered = set().union(*(pairs(c) for c in combos))
    chosen: set[int] = set()
    while uncovered:
        best = max(range(len(combos)), key=lambda r: (len(pairs(combos[r]) & uncovered), -r))
        chosen.add(best)
        uncovered -= pairs(combos[best])
    return [pytest.param(*c, marks=() if r in chosen else pytest.mark.exhaustive) for r, c in enumerate(combos)]

