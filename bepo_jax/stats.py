"""Masked segment statistics, written once for every estimator.

For segment s with valid members x_i:  n_s = |{i : seg_i = s}|,
mu_s = (1/n_s) sum_i x_i,  sigma_s = sqrt( sum_i (x_i - mu_s)^2 / (n_s - ddof) ),
computed in two passes (mean first, then squared deviations) on data shifted by a
member of the segment; a segment of equal values gets sigma = 0 exactly.
``ddof = 1`` is the unbiased (torch default, verl-agent) convention, ``ddof = 0``
the population one. Segments with ``n_s <= ddof`` get sigma_s = 0; callers apply the
singleton rules of SPEC sections 2-3 on top.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

STD_DDOF = {"unbiased": 1, "population": 0}


def segment_moments(
    x: Float[Array, "N"],
    valid: Bool[Array, "N"],
    segment_ids: Int[Array, "N"],
    num_segments: int,
    *,
    ddof: int,
) -> tuple[Float[Array, "S"], Float[Array, "S"], Float[Array, "S"]]:
    """Return (count, mean, std) per segment over the valid entries.

    Invalid entries (and ids outside [0, num_segments)) contribute nothing.
    """
    w = valid.astype(x.dtype)
    count = jax.ops.segment_sum(w, segment_ids, num_segments)
    safe = jnp.maximum(count, 1.0)
    safe_ids = jnp.clip(segment_ids, 0, num_segments - 1)
    # Shifted data: subtract a member of each segment (its max) before summing, so a
    # segment of equal values has mean exactly that value and deviations exactly 0.
    shift = jax.ops.segment_max(jnp.where(valid, x, -jnp.inf), segment_ids, num_segments)
    shift = jnp.where(count > 0, shift, 0.0)
    d = jnp.where(valid, x - shift[safe_ids], 0.0)
    mean_d = jax.ops.segment_sum(d, segment_ids, num_segments) / safe
    mean = shift + mean_d
    dev = jnp.where(valid, d - mean_d[safe_ids], 0.0)
    ss = jax.ops.segment_sum(dev * dev, segment_ids, num_segments)
    var = jnp.where(count > ddof, ss / jnp.maximum(count - ddof, 1.0), 0.0)
    # A segment of equal values has sigma exactly 0. Decided by max == min, which no
    # rounding can disturb: XLA contracts ``a * b - mean`` into a fused multiply-add on
    # the unrounded product (10 * 0.2 - 2.0 -> 3e-8), and / (0 + eps) would blow that up.
    low = jax.ops.segment_min(jnp.where(valid, x, jnp.inf), segment_ids, num_segments)
    return count, mean, jnp.where(shift == low, 0.0, jnp.sqrt(var))


def masked_moments(
    x: Float[Array, "..."], valid: Bool[Array, "..."], *, ddof: int
) -> tuple[Float[Array, ""], Float[Array, ""], Float[Array, ""]]:
    """(count, mean, std) of ``x`` over ``valid`` — one segment holding everything."""
    flat = x.reshape(-1)
    n, mu, sd = segment_moments(flat, valid.reshape(-1), jnp.zeros(flat.shape, jnp.int32), 1, ddof=ddof)
    return n[0], mu[0], sd[0]


def normalise(x, mean, std, *, norm: str, eps, constant=None):
    """``x - mean`` (norm="mean") or ``(x - mean) / (std + eps)`` (norm="mean_std").

    ``constant``: where true, the deviation is exactly 0 — pass ``std == 0`` when ``x``
    are the very values the statistics were taken over (every value of the segment
    equal, see ``segment_moments``), so FMA contraction cannot leave noise behind.
    """
    dev = x - mean
    if constant is not None:
        dev = jnp.where(constant, 0.0, dev)
    if norm == "mean":
        return dev
    return dev / (std + eps)
