"""Hypothesis strategies: random groups with repeats, cycles, self-loops, empty and
truncated trajectories and penalties, at a few fixed padded shapes (so the kernels
compile once per shape and config structure, not once per example)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from bepo_jax import StepBatch

SHAPES = [(2, 4, 6), (1, 3, 9)]
REWARDS = np.array([0.0, 0.0, 0.0, 1.0, 10.0, -1.0, 0.5], np.float32)
PENALTIES = np.array([0.0, 0.0, -0.1, -1.0], np.float32)


@st.composite
def batches(draw, shape=None, penalty=None, alphabet=None):
    """A random StepBatch plus its NumPy view (obs, reward, mask, outcome, penalty)."""
    B, K, T = draw(st.sampled_from(SHAPES)) if shape is None else shape
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n_sym = draw(st.integers(1, 8)) if alphabet is None else alphabet
    # Arbitrary 64-bit keys for the symbols (random words, distinct per symbol).
    table = rng.choice(2**32, size=(n_sym * 2,), replace=False).astype(np.uint32).reshape(n_sym, 2)
    sym = rng.integers(0, n_sym, (B, K, T))
    obs = table[sym]
    L = rng.integers(0, T + 1, (B, K))
    L[rng.random((B, K)) < 0.5] = T  # many full-length (truncated-looking) trajectories
    for b in range(B):  # a group holds 0 or >= 2 non-empty trajectories (one alone has no baseline)
        if (L[b] > 0).sum() == 1:
            L[b, int(np.argmin(L[b] > 0))] = rng.integers(1, T + 1)
    mask = np.arange(T)[None, None, :] < L[..., None]
    reward = rng.choice(REWARDS, (B, K, T)).astype(np.float32)
    outcome = rng.integers(0, 3, (B, K)).astype(np.int32)
    with_penalty = draw(st.booleans()) if penalty is None else penalty
    pen = rng.choice(PENALTIES, (B, K, T)).astype(np.float32) if with_penalty else np.zeros((B, K, T), np.float32)
    # Garbage at padding must never matter.
    reward = np.where(mask, reward, np.float32(np.nan))
    obs = np.where(mask[..., None], obs, np.uint32(12345))
    # Always an array (zeros when no penalties are drawn): one pytree structure per shape, so a
    # kernel compiles once per shape and config, not twice. That penalty=None is the zero
    # penalty is its own test (test_registry.test_no_penalty_is_a_zero_penalty).
    batch = StepBatch(obs_key=obs, reward=reward, mask=mask, outcome=outcome, penalty=pen)
    return batch, (obs, np.where(mask, reward, 0.0).astype(np.float32), mask, outcome, pen)


NORMS = ["mean", "mean_std"]
WEIGHTINGS = ["step", "trajectory"]
STDS = ["unbiased", "population"]
