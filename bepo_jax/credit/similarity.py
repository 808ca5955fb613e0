"""Similarity merging of observations inside jit (docs/similarity.md).

Exact hashing gives two observations one state only when they are identical; a counter
or a reordered line splits a state in two. The reference GiGPO (``enable_similarity``)
and GraphGPO recipes instead cluster the observations of a group by Python's
``difflib.SequenceMatcher(None, a, b).ratio() >= 0.95`` over all pairs. This module is
the jittable counterpart, for token arrays and every graph estimator:

1. **Signature.** The observation's token n-grams (``ngram`` consecutive valid tokens;
   an observation with fewer valid tokens than ``ngram`` is one gram of all of them),
   each hashed to 32 bits, then one-permutation MinHash: the gram's hash h picks the
   bin ``fmix32(h ^ seed) mod num_bins`` and the bin keeps the smallest
   ``fmix32(h ^ seed')`` that falls into it (empty bins hold 0xFFFFFFFF).
2. **Similarity.** The Jaccard similarity |A ∩ B| / |A ∪ B| of the two n-gram sets,
   estimated as (bins equal and non-empty in both) / (bins non-empty in either); two
   observations with no valid token at all have similarity 1.
3. **Leader clustering**, in record order (trajectory k, then step t), exactly the
   reference's rule: a record joins the first earlier cluster whose *leader* (its first
   record) is at least ``threshold`` similar, else it leads a new cluster.
4. The record's state key becomes its leader's ``obs_key``: the graph estimators then
   run unchanged on cluster ids (``merge_similar``).

The Jaccard of n-gram sets is not ``SequenceMatcher.ratio`` (2 M / (|a| + |b|) with M
the characters in matching blocks): one edited character removes up to n grams from a
160-character observation, so ratio 0.99 is Jaccard ~0.96 at n = 3 and ratio 0.95 can
be Jaccard ~0.75; word reordering keeps most grams (Jaccard high) while it breaks
matching blocks (ratio lower). ``experiments/similarity_agreement.py`` measures the
agreement of the two on TextWorld observations.

Cost per group of N records: O(N W) for the signatures and O(U N num_bins) for the
clustering, U the number of distinct observations in the group (a ``while_loop`` over
them, each compared with every earlier leader), vmapped over groups (the loop runs to
the largest U); no [N, N] matrix is kept.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int, UInt32

from .configs import check_int, check_range, pytree_config
from .hashing import _fmix32 as fmix32
from .graph import dense_ids
from .hashing import hash_tokens, token_words
from .types import StepBatch

_EMPTY = np.uint32(0xFFFFFFFF)
_G = 0x9E3779B9


@pytree_config(static=("ngram", "num_bins"))
class SimilarityConfig:
    """threshold: estimated Jaccard similarity of the n-gram sets at or above which a
    record joins a cluster (0.9: of 0.5-0.95 the value that agrees best with the
    reference's SequenceMatcher ratio >= 0.95 on TextWorld, experiments/results/similarity.md). ngram: tokens per gram (3). num_bins: MinHash bins per
    signature (64; the estimate's standard error is about sqrt(J (1 - J) / num_bins)).
    seed: hash seed (0)."""

    threshold: float = 0.9
    ngram: int = 3
    num_bins: int = 64
    seed: int = 0

    def __post_init__(self):
        n = "SimilarityConfig"
        check_range(n, "threshold", self.threshold, lo=0.0, hi=1.0, lo_open=True)
        check_int(n, "ngram", self.ngram, lo=1)
        check_int(n, "num_bins", self.num_bins, lo=1)
        if self.num_bins > 16384:
            raise ValueError(f"{n}.num_bins={self.num_bins} is too large; use at most 16384 (64 is plenty).")
        check_int(n, "seed", self.seed, lo=0)


def _u32(x) -> UInt32[Array, "..."]:
    return jnp.asarray(x).astype(jnp.uint32)


def minhash_signatures(tokens: Int[Array, "*batch W"], mask: Bool[Array, "*batch W"],
                       config: SimilarityConfig = SimilarityConfig()) -> UInt32[Array, "*batch M"]:
    """One-permutation MinHash signatures of the token n-gram sets (module doc, step 1).
    Valid tokens need not be contiguous: a gram is ``ngram`` consecutive positions that
    are all valid."""
    n, m = config.ngram, config.num_bins
    W = tokens.shape[-1]
    batch_shape = tokens.shape[:-1]
    tokens = jnp.asarray(tokens)
    ok = jnp.asarray(mask, bool).reshape(-1, W)
    tok = token_words(tokens.reshape(-1, W).astype(jnp.int32) if tokens.dtype.itemsize == 8 else tokens.reshape(-1, W))
    seed = _u32(config.seed)
    span = max(W - n + 1, 1)
    h = jnp.zeros((tok.shape[0], span), jnp.uint32)
    valid = jnp.ones((tok.shape[0], span), bool)
    for j in range(min(n, W)):  # gram hash: an order-dependent combination of n tokens
        h = fmix32((h ^ fmix32(tok[:, j:j + span] * jnp.uint32(_G) + jnp.uint32(j))) * jnp.uint32(0x85EBCA6B))
        valid &= ok[:, j:j + span]
    count = ok.sum(-1)
    short = (count > 0) & ((count < n) | (W < n))  # fewer valid tokens than a gram: one gram of them all
    whole = hash_tokens(tok, ok)[:, 0]
    first = jnp.arange(span)[None] == 0
    h = jnp.where(short[:, None], jnp.where(first, whole[:, None], jnp.uint32(0)), h)
    valid = jnp.where(short[:, None], first, valid)
    bins = (fmix32(h ^ seed ^ jnp.uint32(0x5BD1E995)) % jnp.uint32(m)).astype(jnp.int32)
    value = jnp.where(valid, fmix32(h ^ (seed * jnp.uint32(_G) + jnp.uint32(0x27D4EB2F))), _EMPTY)
    rows = jnp.broadcast_to(jnp.arange(tok.shape[0])[:, None], bins.shape)
    sig = jnp.full((tok.shape[0], m), _EMPTY).at[rows, bins].min(value)
    return sig.reshape(batch_shape + (m,))


def _bin_counts(a: UInt32[Array, "*batch M"], b: UInt32[Array, "*batch M"]):
    """(bins equal and non-empty, bins non-empty in either) of two signatures, int32."""
    empty_a, empty_b = a == _EMPTY, b == _EMPTY
    both = jnp.sum((a == b) & ~empty_a, axis=-1, dtype=jnp.int32)
    either = jnp.sum(~(empty_a & empty_b), axis=-1, dtype=jnp.int32)
    return both, either


def jaccard_estimate(a: UInt32[Array, "*batch M"], b: UInt32[Array, "*batch M"]) -> Array:
    """Estimated Jaccard similarity of two signatures (module doc, step 2)."""
    both, either = _bin_counts(a, b)
    return jnp.where(either > 0, both / jnp.maximum(either, 1), 1.0)


THRESHOLD_SCALE = 1 << 16  # the threshold is applied at a resolution of 1/65536


def _similar(sig_i, sigs, threshold):
    """sig_i [M] against sigs [N, M]: estimate >= threshold, decided in integers:
    both * 65536 >= round(threshold * 65536) * either (no float rounding at the edge)."""
    both, either = _bin_counts(sigs, sig_i)
    q = jnp.round(jnp.asarray(threshold, jnp.float32) * THRESHOLD_SCALE).astype(jnp.int32)
    return jnp.where(either > 0, both * THRESHOLD_SCALE >= q * either, True)


def _first_twins(keys: UInt32[Array, "N 2"], valid: Bool[Array, "N"]) -> Int[Array, "N"]:
    """Index of the first valid record with the same key (a record itself when it is the
    first, or invalid): the graph's own key numbering (``dense_ids``), then the smallest
    record index per key."""
    N = keys.shape[0]
    idx = jnp.arange(N)
    ids, _ = dense_ids((keys[:, 0], keys[:, 1]), valid, pad_id=N)
    first = jax.ops.segment_min(idx, ids, num_segments=N + 1)
    return jnp.where(valid, first[ids], idx)


def leader_clusters(sigs: UInt32[Array, "N M"], valid: Bool[Array, "N"], threshold) -> Int[Array, "N"]:
    """Leader index of every record of one group (module doc, step 3); invalid records
    lead themselves and never attract others.

    Records with identical signatures are similarity 1 to each other and compare alike
    with every leader, so they end in the same cluster: only the distinct signatures
    (U of them, in record order) go through the loop — a ``while_loop`` of U steps, each
    comparing one signature with the earlier leaders — and the others copy the result of
    their first twin. Equal, record for record, to the plain rule over all N records."""
    N = sigs.shape[0]
    idx = jnp.arange(N)
    twin = _first_twins(hash_tokens(sigs, jnp.ones(sigs.shape, bool)), valid)
    rep = valid & (twin == idx)
    U = jnp.sum(rep)
    reps = jnp.nonzero(rep, size=N, fill_value=0)[0]  # distinct signatures, in record order
    rsigs = sigs[reps]

    def cond(c):
        return c[0] < U

    def body(c):
        u, lead = c
        cand = (lead == idx) & (idx < u) & _similar(rsigs[u], rsigs, threshold)
        return u + 1, lead.at[u].set(jnp.where(jnp.any(cand), jnp.argmax(cand), u))

    _, lead = jax.lax.while_loop(cond, body, (jnp.zeros((), U.dtype), idx))
    pos = jnp.cumsum(rep) - 1  # a representative's place among the distinct signatures
    return jnp.where(valid, reps[lead[pos[twin]]], idx)


def similarity_clusters(obs_tokens: Int[Array, "B K T W"], mask: Bool[Array, "B K T"],
                        config: SimilarityConfig = SimilarityConfig(), *,
                        token_mask: Bool[Array, "B K T W"] | None = None) -> Int[Array, "B K T"]:
    """Per record, the flat index k * T + t of its cluster's leader in its group."""
    B, K, T, W = obs_tokens.shape
    tmask = obs_tokens != 0 if token_mask is None else token_mask
    sigs = minhash_signatures(obs_tokens, tmask, config).reshape(B, K * T, -1)
    lead = jax.vmap(leader_clusters, in_axes=(0, 0, None))(sigs, jnp.asarray(mask).reshape(B, K * T), config.threshold)
    return lead.reshape(B, K, T)


def merge_similar(batch: StepBatch, obs_tokens: Int[Array, "B K T W"], config: SimilarityConfig = SimilarityConfig(),
                  *, token_mask: Bool[Array, "B K T W"] | None = None) -> StepBatch:
    """``batch`` with every record's ``obs_key`` replaced by its cluster leader's, so that
    any graph estimator (GiGPO, GraphGPO, HGPO, GAGPO, Gated-BEPO) merges similar
    observations. ``obs_tokens``: each record's observation as tokens, PAD (0) = no
    token unless ``token_mask`` says otherwise. Jittable."""
    obs_tokens = jnp.asarray(obs_tokens)
    if obs_tokens.ndim != 4 or obs_tokens.shape[:3] != batch.mask.shape:
        raise ValueError(f"merge_similar: obs_tokens must be [B, K, T, W] with [B, K, T] = {tuple(batch.mask.shape)} "
                         f"(the batch's mask); got {tuple(obs_tokens.shape)}.")
    B, K, T = batch.mask.shape
    lead = similarity_clusters(obs_tokens, batch.mask, config, token_mask=token_mask)
    keys = jnp.asarray(batch.obs_key).reshape(B, K * T, 2)
    merged = jnp.take_along_axis(keys, lead.reshape(B, K * T, 1), axis=1).reshape(B, K, T, 2)
    return dataclasses.replace(batch, obs_key=merged)
