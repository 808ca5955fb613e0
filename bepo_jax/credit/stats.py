"""Masked segment statistics, written once for every estimator.

For segment s with valid members x_i:  n_s = |{i : seg_i = s}|,
mu_s = (1/n_s) sum_i x_i,  sigma_s = sqrt( sum_i (x_i - mu_s)^2 / (n_s - ddof) ),
computed in two passes (mean first, then squared deviations) on data shifted by a
member of the segment; a segment of equal values gets sigma = 0 exactly.
``ddof = 1`` is the unbiased (torch default, verl-agent) convention, ``ddof = 0``
the population one. Segments with ``n_s <= ddof`` get sigma_s = 0; callers apply the
singleton rules (docs/estimators.md) on top.

Order-independent sums. Both passes sum with ``exact_segment_sum``: every value is
split into integer limbs on a power-of-two grid set by its segment's largest
magnitude, the limbs are summed as integers below 2^24 (exact in float32, so the
order of the rows cannot matter) and recombined once. The result is the same bits for every row order and
within ~1 float32 ulp of the exact sum (a plain float32 ``segment_sum`` drifts by up
to ~n ulps and changes with the order: measured 6e-6 relative on a 400-record group).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

STD_DDOF = {"unbiased": 1, "population": 0}


def _segment(op: str, x, segment_ids, num_segments: int):
    """``jax.ops.segment_{sum,max,min}``; with one segment a masked reduction instead (no
    scatter: XLA:CPU 0.10.2 miscompiled a one-segment scatter with ids shared across a
    vmapped batch in our tests). Ids outside [0, num_segments) are dropped either way."""
    if num_segments == 1:
        fill = {"sum": 0, "max": -jnp.inf, "min": jnp.inf}[op]
        inside = segment_ids == 0
        reduce = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}[op]
        return reduce(jnp.where(inside, x, jnp.asarray(fill, x.dtype)), keepdims=True).reshape(1)
    return {"sum": jax.ops.segment_sum, "max": jax.ops.segment_max, "min": jax.ops.segment_min}[op](
        x, segment_ids, num_segments)
_MANTISSA = 26  # bits of precision kept below each segment's largest magnitude (float32 has 24)
_EXACT_BITS = 24  # float32 holds every integer below 2^24 exactly


def exact_segment_sum(x: Float[Array, "N"], segment_ids: Int[Array, "N"], num_segments: int) -> Float[Array, "S"]:
    """Sum of ``x`` per segment, independent of the order of the entries.

    With M_s = the largest |x| of segment s rounded up to a power of two 2^e_s and b
    bits per limb (b = 24 - ceil(log2 N), so a sum of N limbs below 2^b stays an
    integer below 2^24, which float32 adds exactly in any order), each |x| is cut into
    L = ceil((26 + log2 N) / b) limbs q_j = floor(|x| 2^((j + 1) b - e_s)) mod 2^b by
    integer shifts of its significand; sum_i sign_i q_ij is exact, and
    sum_s = sum_j (sum_i sign_i q_ij) 2^(e_s - (j + 1) b). Truncation error
    <= N 2^-(L b) M_s <= 2^-26 M_s. Entries with ids outside [0, num_segments) are
    dropped. (Written without ``jnp.ldexp``, int32 ``segment_sum`` and float limb
    arithmetic: under ``jit(vmap)`` on XLA:CPU 0.10.2 the first two gave wrong sums and
    the third position-dependent ones in our tests.)
    """
    n = x.shape[0]
    log_n = max(int(n - 1).bit_length(), 1)
    b = max(_EXACT_BITS - log_n, 1)
    limbs = -(-(_MANTISSA + log_n) // b)
    ids_ok = (segment_ids >= 0) & (segment_ids < num_segments)
    x = jnp.where(ids_ok, x, 0.0).astype(jnp.float32)
    safe_ids = jnp.clip(segment_ids, 0, num_segments - 1)
    top = _segment("max", jnp.abs(x), segment_ids, num_segments)
    # e_s with top_s < 2^e_s, from the float's exponent bits.
    e = jnp.clip((jax.lax.bitcast_convert_type(top, jnp.int32) >> 23) - 126, -125, 127)
    # |x| = m 2^(ex - 150) exactly (m the 24-bit significand); its limbs relative to 2^e_s
    # come from integer shifts of m: no float rounding, so every element gives the same
    # limbs wherever it sits (float limb arithmetic did not, in XLA:CPU's vector loops).
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    ex = (bits >> 23) & 0xFF
    m = jnp.where(ex > 0, (bits & 0x7FFFFF) | 0x800000, (bits & 0x7FFFFF))  # subnormals: no implicit bit
    ex = jnp.maximum(ex, 1)
    sign = jnp.where(bits < 0, -1.0, 1.0).astype(jnp.float32)
    k = ex - 150 - e[safe_ids]  # |x| / 2^e_s = m 2^k
    total = jnp.zeros((num_segments,), jnp.float32)
    mask = jnp.int32((1 << b) - 1)
    for j in range(limbs):  # limb j holds the bits of weight 2^(e_s - (j + 1) b) .. 2^(e_s - j b - 1)
        shift = k + (j + 1) * b  # limb_j = floor(m 2^shift) mod 2^b
        # Shifts clipped to 31 stay right: m < 2^24 shifted right by >= 24 is 0, and m shifted
        # left by >= 31 > b has no bits left below 2^b.
        limb = jnp.where(shift > 0, jnp.left_shift(m, jnp.clip(shift, 0, 31)),
                         jnp.right_shift(m, jnp.clip(-shift, 0, 31))) & mask
        qs = _segment("sum", sign * limb.astype(jnp.float32), segment_ids, num_segments)  # integers < 2^24: exact
        total = total + qs * _pow2(jnp.full((), -(j + 1) * b, jnp.int32))
    return total * _pow2(e)


def _pow2(k: Int[Array, "..."]) -> Float[Array, "..."]:
    """2^k as float32 for integer k in [-126, 127], by building the exponent bits."""
    return jax.lax.bitcast_convert_type(((k + 127) << 23).astype(jnp.int32), jnp.float32)


class Moments(NamedTuple):
    """Per-segment count, mean and std, and each entry's deviation from its segment mean.

    ``dev`` is computed as (x - shift) - mean(x - shift) with ``shift`` a member of the
    segment, so it is exact for equal values (0) and never suffers the rounding of the
    mean itself (x - mean would, for values far from 0); 0 at invalid entries."""

    count: Float[Array, "S"]
    mean: Float[Array, "S"]
    std: Float[Array, "S"]
    dev: Float[Array, "N"]


def segment_moments(
    x: Float[Array, "N"],
    valid: Bool[Array, "N"],
    segment_ids: Int[Array, "N"],
    num_segments: int,
    *,
    ddof: int,
) -> Moments:
    """(count, mean, std, dev) per segment over the valid entries (``Moments``).

    Invalid entries (and ids outside [0, num_segments)) contribute nothing.
    """
    w = valid.astype(x.dtype)
    count = _segment("sum", w, segment_ids, num_segments)  # integers: exact in any order
    safe = jnp.maximum(count, 1.0)
    safe_ids = jnp.clip(segment_ids, 0, num_segments - 1)
    # Shifted data: subtract a member of each segment (its max) before summing, so a
    # segment of equal values has mean exactly that value and deviations exactly 0.
    shift = _segment("max", jnp.where(valid, x, -jnp.inf), segment_ids, num_segments)
    shift = jnp.where(count > 0, shift, 0.0)
    d = jnp.where(valid, x - shift[safe_ids], 0.0)
    mean_d = exact_segment_sum(d, segment_ids, num_segments) / safe
    mean = shift + mean_d
    dev = jnp.where(valid, d - mean_d[safe_ids], 0.0)
    ss = exact_segment_sum(dev * dev, segment_ids, num_segments)
    var = jnp.where(count > ddof, ss / jnp.maximum(count - ddof, 1.0), 0.0)
    # A segment of equal values has sigma exactly 0 (and deviations exactly 0). Decided by
    # max == min, which no rounding can disturb: XLA contracts ``a * b - mean`` into a
    # fused multiply-add on the unrounded product (10 * 0.2 - 2.0 -> 3e-8), and
    # / (0 + eps) would blow that up.
    low = _segment("min", jnp.where(valid, x, jnp.inf), segment_ids, num_segments)
    constant = shift == low
    dev = jnp.where(constant[safe_ids], 0.0, dev)
    return Moments(count, mean, jnp.where(constant, 0.0, jnp.sqrt(var)), dev)


def masked_moments(x: Float[Array, "..."], valid: Bool[Array, "..."], *, ddof: int) -> Moments:
    """``segment_moments`` with one segment holding everything: scalar count, mean and
    std, and ``dev`` shaped like ``x``."""
    flat = x.reshape(-1)
    m = segment_moments(flat, valid.reshape(-1), jnp.zeros(flat.shape, jnp.int32), 1, ddof=ddof)
    return Moments(m.count[0], m.mean[0], m.std[0], m.dev.reshape(x.shape))


def scale_deviation(dev, std, *, norm: str, eps):
    """``dev`` (norm="mean") or ``dev / (std + eps)`` (norm="mean_std"); ``dev`` = x - mean
    from ``Moments.dev`` (exactly 0 for a segment of equal values)."""
    if norm == "mean":
        return dev
    return dev / (std + eps)
