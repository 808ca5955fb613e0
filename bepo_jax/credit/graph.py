"""The empirical state graph of one group, built inside jit (a hash table on CPU, sorts on
GPU/TPU, then segment ops).

A group has N = K * T record slots. Its nodes are

* source states: the distinct ``obs_key`` values of the valid records, numbered
  0 .. S-1 (S <= N; ids are group-local, never shared across groups; the order of the
  numbering is not part of the contract, see ``dense_ids``);
* three typed absorbing nodes END[o] = N + o for o in (SUCCESS, FAILURE, TRUNCATED),
  with value 0.

Record (k, t) is the edge s_i -> s'_i with s'_i = state(k, t+1) if step t+1 is valid,
else END[outcome_k]. Padding records get the sentinel id ``N + 3`` (``PAD``) as both
source and successor; segment sums over [0, N) drop them.

Everything here works on one group; estimators ``vmap`` it over the B groups.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, UInt32

from .types import NUM_OUTCOMES


class GroupGraph(NamedTuple):
    """One group's empirical graph (docs/data-model.md, the empirical graph).

    state:          source state id of each record in [0, S), ``N + 3`` at padding  [K, T]
    succ:           successor node: a state id, ``N + outcome`` for END, ``N + 3`` at padding  [K, T]
    valid:          the record mask  [K, T]
    num_states:     S, the number of distinct source states  []
    out_count:      |E(s)|, records leaving each state slot (0 for unused slots)  [N]
    num_successors: distinct successors (or distinct (r, s') pairs) per state  [N]
    """

    state: Int[Array, "K T"]
    succ: Int[Array, "K T"]
    valid: Bool[Array, "K T"]
    num_states: Int[Array, ""]
    out_count: Float[Array, "N"]
    num_successors: Int[Array, "N"]

    @property
    def num_slots(self) -> int:
        """N = K * T, the static number of state slots."""
        return self.valid.size


# On the sort path (GPU/TPU, and one-key successor counts everywhere): up to this many
# record slots per group, ids come from single-operand uint32 sorts (packed ranks, see
# ``_rank``), which XLA:CPU ran ~7x faster than the multi-operand comparator sort used
# above it: n * (n + 4) must stay below 2**32 - 1.
FAST_SORT_MAX_SLOTS = 65_532
_SENTINEL = np.uint32(0xFFFFFFFF)


def _rank(x: UInt32[Array, "N"]) -> UInt32[Array, "N"]:
    """Position of the first occurrence of x_i in sorted(x): equal iff the values are equal."""
    return jnp.searchsorted(jnp.sort(x), x, side="left").astype(jnp.uint32)


def _joint_rank(keys: Sequence[Array], n: int) -> UInt32[Array, "N"]:
    """One uint32 per record, in [0, n), equal iff every key column is equal (ranks packed pairwise)."""
    r = _rank(keys[0].astype(jnp.uint32))
    for k in keys[1:]:
        r = _rank(r * jnp.uint32(n) + _rank(k.astype(jnp.uint32)))
    return r


def _runs(composite: UInt32[Array, "N"]):
    """Sort packed keys (invalid = sentinel, last); flag the first of each run of valid equal keys."""
    s = jnp.sort(composite)
    start = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]]) & (s != _SENTINEL)
    return s, start


def _sorted_runs(keys: Sequence[Array], valid: Bool[Array, "N"]):
    """Multi-operand path (groups above FAST_SORT_MAX_SLOTS): sort by (invalid last, *keys)
    and flag the first record of every run of equal valid keys. Returns (perm, sorted keys, start)."""
    n = valid.shape[0]
    operands = ((~valid).astype(jnp.uint32), *keys, jnp.arange(n, dtype=jnp.int32))
    out = jax.lax.sort(operands, num_keys=1 + len(keys))
    invalid_s, keys_s, perm = out[0], out[1:-1], out[-1]
    differs = jnp.zeros((n,), bool).at[0].set(True)
    for k in keys_s:
        differs = differs.at[1:].set(differs[1:] | (k[1:] != k[:-1]))
    return perm, keys_s, differs & (invalid_s == 0)


def _mix32(h: UInt32[Array, "N"]) -> UInt32[Array, "N"]:
    """MurmurHash3's 32-bit finaliser (every input bit flips about half the output bits)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def first_occurrence(words: UInt32[Array, "N W"], valid: Bool[Array, "N"]) -> Int[Array, "N"]:
    """For each valid record, the index of the first valid record with the same key words
    (itself when it is the first); ``N`` for invalid records.

    An open-addressing hash table built inside jit: a table of M >= 2N slots holds record
    indices; every pending record looks at slot h(key) (+1, +2, ... on collisions with
    another key): an empty slot is claimed by the smallest pending index there
    (``scatter-min``), a slot owned by an equal key resolves the record to its owner.
    Records with equal keys probe the same slots in the same rounds, so all resolve to
    the same owner — the smallest index of the key, i.e. its first occurrence. Rounds:
    the longest probe sequence + 1 (a handful at load <= 1/2; a ``while_loop``, at most
    M + 1). No sort: on XLA:CPU this replaces four sorts and four binary searches.
    """
    n, width = words.shape
    m = 1 << max(2 * n - 1, 1).bit_length()  # power of two >= 2n
    words = words.astype(jnp.uint32)
    h = _mix32(words[:, 0])
    for j in range(1, width):
        h = _mix32(h ^ (words[:, j] + jnp.uint32(0x9E3779B9) + (h << 6) + (h >> 2)))
    idx = jnp.arange(n, dtype=jnp.int32)
    empty = jnp.int32(n)

    def body(carry):
        table, slot, rep = carry
        pending = rep < 0
        owner = table[slot]
        occupied = owner < empty
        same = occupied & jnp.all(words[jnp.minimum(owner, n - 1)] == words, axis=1)
        rep = jnp.where(pending & same, owner, rep)
        slot = jnp.where(pending & occupied & ~same, (slot + 1) & (m - 1), slot)
        claim = pending & ~occupied
        table = table.at[jnp.where(claim, slot, m)].min(idx, mode="drop")
        return table, slot, rep

    init = (jnp.full((m,), empty, jnp.int32), (h & jnp.uint32(m - 1)).astype(jnp.int32),
            jnp.where(valid, -1, empty))
    return jax.lax.while_loop(lambda c: jnp.any(c[2] < 0), body, init)[2]


def _hashed_dense_ids(keys: Sequence[Array], valid: Bool[Array, "N"], pad_id: int):
    """``dense_ids`` by ``first_occurrence``: ids in order of first appearance."""
    rep = first_occurrence(jnp.stack([k.astype(jnp.uint32) for k in keys], axis=1), valid)
    n = valid.shape[0]
    first = valid & (rep == jnp.arange(n))
    dense = jnp.cumsum(first.astype(jnp.int32)) - 1
    ids = jnp.where(valid, dense[jnp.minimum(rep, n - 1)], pad_id)
    return ids, jnp.sum(first.astype(jnp.int32))


def _sorted_dense_ids(keys: Sequence[Array], valid: Bool[Array, "N"], pad_id: int):
    """``dense_ids`` by sorting: ids in key order."""
    n = valid.shape[0]
    if n <= FAST_SORT_MAX_SLOTS:
        composite = jnp.where(valid, _joint_rank(keys, n), _SENTINEL)
        s, start = _runs(composite)
        dense = jnp.cumsum(start.astype(jnp.int32)) - 1
        ids = dense[jnp.searchsorted(s, composite, side="left")]
        return jnp.where(valid, ids, pad_id), jnp.sum(start.astype(jnp.int32))
    perm, _, start = _sorted_runs(keys, valid)
    ids_sorted = jnp.cumsum(start.astype(jnp.int32)) - 1
    ids_sorted = jnp.where(valid[perm], ids_sorted, pad_id)
    ids = jnp.zeros_like(ids_sorted).at[perm].set(ids_sorted)
    return ids, jnp.sum(start.astype(jnp.int32))


def dense_ids(keys: Sequence[Array], valid: Bool[Array, "N"], pad_id: int) -> tuple[Int[Array, "N"], Int[Array, ""]]:
    """Number the distinct key tuples of the valid records 0 .. S-1.

    Invalid records get ``pad_id``. Returns (ids, S). The numbering's order is not part
    of the contract: on CPU a hash table (``first_occurrence``: ids in order of first
    appearance, ~5x faster than XLA:CPU's sorts), on GPU/TPU sorts (ids in key order).
    """
    return jax.lax.platform_dependent(
        keys, valid, cpu=lambda k, v: _hashed_dense_ids(k, v, pad_id),
        default=lambda k, v: _sorted_dense_ids(k, v, pad_id))


def _hashed_count_distinct(segment, keys, valid, num_segments):
    words = jnp.stack([segment.astype(jnp.uint32), *(k.astype(jnp.uint32) for k in keys)], axis=1)
    first = valid & (first_occurrence(words, valid) == jnp.arange(valid.shape[0]))
    return jax.ops.segment_sum(first.astype(jnp.int32), jnp.where(valid, segment, num_segments), num_segments)


def _sorted_count_distinct(segment, keys, valid, num_segments):
    n = valid.shape[0]
    if n <= FAST_SORT_MAX_SLOTS:
        # A single key below n + 4 (successor ids) packs as is; otherwise pack its joint rank.
        width = n + 4 if len(keys) == 1 else n
        key = keys[0].astype(jnp.uint32) if len(keys) == 1 else _joint_rank(keys, n)
        composite = jnp.where(valid, segment.astype(jnp.uint32) * jnp.uint32(width) + key, _SENTINEL)
        s, start = _runs(composite)
        seg_sorted = (s // jnp.uint32(width)).astype(jnp.int32)
        return jax.ops.segment_sum(start.astype(jnp.int32), seg_sorted, num_segments)
    seg_key = segment.astype(jnp.uint32)
    perm, keys_s, start = _sorted_runs((seg_key, *keys), valid)
    return jax.ops.segment_sum(start.astype(jnp.int32), keys_s[0].astype(jnp.int32), num_segments)


def count_distinct(
    segment: Int[Array, "N"], keys: Sequence[Array], valid: Bool[Array, "N"], num_segments: int
) -> Int[Array, "S"]:
    """Number of distinct ``keys`` tuples among the valid records of each segment.

    ``segment`` must lie in [0, n) for valid records (n = number of records). One key
    below n + 4 (successor ids) packs with the segment into one uint32: one sort
    everywhere; several keys: a hash table on CPU, sorts on GPU/TPU (as ``dense_ids``).
    """
    n = valid.shape[0]
    if len(keys) == 1 and n <= FAST_SORT_MAX_SLOTS:
        return _sorted_count_distinct(segment, keys, valid, num_segments)
    return jax.lax.platform_dependent(
        segment, keys, valid, cpu=lambda s, k, v: _hashed_count_distinct(s, k, v, num_segments),
        default=lambda s, k, v: _sorted_count_distinct(s, k, v, num_segments))


def float_key(x: Float[Array, "N"]) -> UInt32[Array, "N"]:
    """Bit pattern of a float32 as a sort key (+0.0 and -0.0 map to one key)."""
    return jax.lax.bitcast_convert_type(x.astype(jnp.float32) + 0.0, jnp.uint32)


def state_ids(obs_key: UInt32[Array, "K T 2"], mask: Bool[Array, "K T"]) -> tuple[Int[Array, "K T"], Int[Array, ""]]:
    """Group-local ids of the source states (merge records with equal 64-bit keys).

    Two trajectories that see "a", "b" and "a", "c": three states, "a" shared.

    >>> import jax.numpy as jnp
    >>> from bepo_jax import hash_observations
    >>> keys = jnp.asarray(hash_observations([["a", "b"], ["a", "c"]]))
    >>> ids, count = state_ids(keys, jnp.ones((2, 2), bool))
    >>> ids.tolist(), int(count)
    ([[0, 1], [0, 2]], 3)
    """
    K, T = mask.shape
    n = K * T
    flat = obs_key.reshape(n, 2)
    ids, count = dense_ids((flat[:, 0], flat[:, 1]), mask.reshape(n), pad_id=n + NUM_OUTCOMES)
    return ids.reshape(K, T), count


def successor_ids(state: Int[Array, "K T"], mask: Bool[Array, "K T"], outcome: Int[Array, "K"]) -> Int[Array, "K T"]:
    """s'_i = state(k, t+1) if step t+1 is valid, else END[outcome_k] = N + outcome_k."""
    K, T = mask.shape
    n = K * T
    nxt_state = jnp.concatenate([state[:, 1:], jnp.zeros((K, 1), state.dtype)], axis=1)
    nxt_valid = jnp.concatenate([mask[:, 1:], jnp.zeros((K, 1), bool)], axis=1)
    end = (n + outcome.astype(state.dtype))[:, None]
    succ = jnp.where(nxt_valid, nxt_state, end)
    return jnp.where(mask, succ, n + NUM_OUTCOMES)


def build_graph(
    obs_key: UInt32[Array, "K T 2"],
    mask: Bool[Array, "K T"],
    outcome: Int[Array, "K"],
    edge_reward: Float[Array, "K T"] | None = None,
) -> GroupGraph:
    """Build one group's graph.

    ``num_successors`` counts distinct successor nodes per state, or distinct
    (r, s') pairs when ``edge_reward`` is given (``gate_on="reward_successor"``).

    The gate's input: state "a" has two distinct successors ("b", "c"), the others one
    (an END node each):

    >>> import jax.numpy as jnp
    >>> from bepo_jax import FAILURE, SUCCESS, hash_observations
    >>> keys = jnp.asarray(hash_observations([["a", "b"], ["a", "c"]]))
    >>> g = build_graph(keys, jnp.ones((2, 2), bool), jnp.array([SUCCESS, FAILURE]))
    >>> int(g.num_states), g.num_successors[:3].tolist()
    (3, [2, 1, 1])
    """
    K, T = mask.shape
    n = K * T
    state, num_states = state_ids(obs_key, mask)
    succ = successor_ids(state, mask, outcome)
    valid = mask.reshape(n)
    src = state.reshape(n)
    out_count = jax.ops.segment_sum(valid.astype(jnp.float32), src, n)
    keys = [succ.reshape(n).astype(jnp.uint32)]
    if edge_reward is not None:
        keys.append(float_key(edge_reward.reshape(n)))
    num_successors = count_distinct(src, keys, valid, n)
    return GroupGraph(state, succ, mask, num_states, out_count, num_successors)


def gather_node(values: Float[Array, "N"], node: Int[Array, "..."]) -> Float[Array, "..."]:
    """values[node] for state nodes; 0 for END nodes and padding (V(END) = 0)."""
    n = values.shape[0]
    return jnp.where(node < n, values[jnp.clip(node, 0, n - 1)], 0.0)


# Key of "no observation before the start": a history slot before t = 0.
_START_KEY = (0x5354_4152, 0x5421_0000)


def history_keys(obs_key: UInt32[Array, "K T 2"], history: int) -> UInt32[Array, "K T 2"]:
    """History-aware state keys (HGPO's remedy for aliasing, He et al. 2026).

    key'_t = hash(o_t, o_{t-1}, ..., o_{t-h}) with a fixed START key for t - j < 0, so
    two records merge only when their last h + 1 observations agree. The observation
    after an action encodes it in deterministic environments; fold actions into
    ``obs_key`` yourself when they are not. ``history = 0`` returns ``obs_key``
    unchanged.
    """
    if history == 0:
        return obs_key
    from .hashing import hash_tokens  # local import: hashing does not depend on graph

    K, T, _ = obs_key.shape
    start = jnp.broadcast_to(jnp.asarray(_START_KEY, jnp.uint32), (K, history, 2))
    padded = jnp.concatenate([start, obs_key], axis=1)  # [K, h + T, 2]
    window = jnp.stack([padded[:, history - j: history - j + T] for j in range(history + 1)], axis=2)
    words = window.reshape(K, T, 2 * (history + 1))
    return hash_tokens(words, jnp.ones(words.shape, bool))


def graph_diagnostics(graph: GroupGraph, credited: Bool[Array, "K T"], iterations, converged, overflow=False):
    """Per-group numbers of ``types.GraphDiagnostics`` (as a tuple, in its field order)."""
    n = graph.num_slots
    valid = graph.valid
    records = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32)
    visits = gather_node(graph.out_count, graph.state)
    singleton = jnp.sum(valid & (visits == 1)) / records
    credited_share = jnp.sum(credited & valid) / records
    used = jnp.arange(n) < graph.num_states
    degree = jnp.sum(jnp.where(used, graph.num_successors, 0)) / jnp.maximum(graph.num_states, 1)
    return (graph.num_states, singleton, credited_share, degree.astype(jnp.float32),
            jnp.asarray(iterations, jnp.int32), jnp.asarray(converged, bool), jnp.asarray(overflow, bool),
            jnp.int32(0))  # invalid: set by the estimator's input check (``estimators.common.with_sanitized_input``)


def in_shared_state(graph: GroupGraph) -> Bool[Array, "K T"]:
    """Records whose state was visited more than once in the group (non-singleton step groups)."""
    return graph.valid & (gather_node(graph.out_count, graph.state) > 1)
