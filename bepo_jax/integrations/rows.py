"""Row layout (verl / verl-agent style) <-> padded ``StepBatch``.

Row-based trainers keep one row per environment step with ``uid`` (the group: all
trajectories sampled from one task instance), ``traj_uid`` (the trajectory) and the
step index. ``from_rows`` pads them into a StepBatch — groups in order of first
appearance, trajectories in order of first appearance within their group — and
returns a ``RowIndex`` so that ``to_rows(advantage, index)`` gives one number per
row in the original order.

Statistics match verl-agent's on the same rows: the StepBatch's "step" weighting is
its occurrence weighting (a trajectory of L rows counts L times in the episode-level
mean/std), std is unbiased, and the singleton rules are those of docs/estimators.md.

``from_rows`` is vectorised (NumPy grouping, one hashing pass over string
observations): its cost is linear in the rows (``experiments/bench_advantages.py --rows``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import numpy as np

from ..credit.hashing import action_keys, hash_observation, hash_tokens
from ..credit.similarity import SimilarityConfig, merge_similar
from ..credit.types import NUM_OUTCOMES, StepBatch


@dataclasses.dataclass(frozen=True)
class RowIndex:
    """Where each row lives in the padded batch: ``batch[b[i], k[i], t[i]]`` is row i."""

    b: np.ndarray
    k: np.ndarray
    t: np.ndarray
    groups: np.ndarray        # uid of each group b
    trajectories: np.ndarray  # traj_uid of each (b, k), padding slots None
    shape: tuple[int, int, int]
    obs_tokens: Optional[np.ndarray] = None  # [B, K, T, W] when from_rows got obs_tokens


def _column(name: str, x: Any, n: int) -> np.ndarray:
    a = np.asarray(x)
    if a.shape[:1] != (n,):
        raise ValueError(f"from_rows: {name} has {a.shape[0] if a.ndim else 'no'} rows, expected {n} (one per row).")
    return a


def _factorize(values: np.ndarray) -> tuple[np.ndarray, list, np.ndarray]:
    """Codes 0.. in order of first appearance, the distinct values in that order, and
    the row of each value's first appearance. Integer arrays: one sort; anything else
    (strings, mixed hashables): one dict pass."""
    if values.dtype != object and (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.str_)):
        uniq, first, inv = np.unique(values, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(order), np.int64)
        rank[order] = np.arange(len(order))
        return rank[inv.reshape(-1)], uniq[order].tolist(), first[order]
    seen: dict = {}
    codes = np.fromiter((seen.setdefault(v, len(seen)) for v in values.tolist()), np.int64, count=len(values))
    return codes, list(seen), np.unique(codes, return_index=True)[1]


def key_words(max_bytes: int) -> int:
    """The uint32 words ``_string_keys`` hashes for a string of ``max_bytes`` UTF-8 bytes."""
    return 1 + -(-max(int(max_bytes), 1) // 4)


def _string_keys(obs: list, min_rows: int = 1) -> Optional[np.ndarray]:
    """uint32 [R, 2] keys of a list of str (or of bytes) in one vectorised pass: the
    UTF-8 bytes, four to a uint32 word, hashed with ``hash_tokens`` after a type word;
    None when the list is not homogeneous or holds NUL characters (NumPy's fixed-width
    byte strings drop trailing NULs, so those go through ``hash_observation``). The rows are
    padded to a power of two >= ``min_rows`` (a caller with a fixed row budget compiles once)."""
    if not obs:
        return None
    kind = type(obs[0])
    if kind not in (str, bytes) or not all(type(o) is kind for o in obs):
        return None
    if kind is str:
        if "\x00" in "".join(obs):
            return None
        data = [o.encode("utf-8") for o in obs]
    else:
        if b"\x00" in b"".join(obs):
            return None
        data = obs
    arr = np.array(data, dtype="S")
    width = max(arr.dtype.itemsize, 1)
    raw = np.frombuffer(arr.tobytes(), np.uint8).reshape(len(obs), arr.dtype.itemsize) if arr.dtype.itemsize else \
        np.zeros((len(obs), 1), np.uint8)
    raw = np.pad(raw, ((0, 0), (0, -width % 4)))
    words = raw.view("<u4")  # no NUL bytes: an all-zero word is padding and nothing else
    words = np.concatenate([np.full((len(obs), 1), 0x5354 if kind is str else 0x4259, np.uint32), words], axis=1)
    mask = np.ones(words.shape, bool)
    mask[:, 1:] = words[:, 1:] != 0
    # few shapes, few compiles: words and rows padded to powers of two (padding rows are dropped)
    bucket = 1 << int(np.ceil(np.log2(words.shape[1])))
    rows = 1 << int(np.ceil(np.log2(max(len(obs), min_rows, 1))))
    words = np.pad(words, ((0, rows - len(obs)), (0, bucket - words.shape[1])))
    mask = np.pad(mask, ((0, rows - len(obs)), (0, bucket - mask.shape[1])))
    return np.asarray(_hash_rows(words, mask))[: len(obs)]


_merge_similar = jax.jit(merge_similar)


@jax.jit
def _hash_rows(words, mask):
    return hash_tokens(words, mask)


def _keys_of(obs_key, n: int) -> np.ndarray:
    if isinstance(obs_key, np.ndarray) and obs_key.dtype == np.uint32:
        return obs_key
    if isinstance(obs_key, np.ndarray) and obs_key.dtype != object:
        raise ValueError(f"from_rows: obs_key is a {obs_key.dtype} array; pass uint32 [R, 2] keys, one raw "
                         "observation per row (a list of str, bytes or arrays), or token observations as obs_tokens.")
    obs = obs_key.tolist() if isinstance(obs_key, np.ndarray) else list(obs_key)
    keys = _string_keys(obs)
    if keys is None:  # row by row: each row's observation is one leaf (str, bytes or an array)
        keys = np.array([hash_observation(o) for o in obs], np.uint32).reshape(len(obs), 2)
    return keys


def from_rows(uid, traj_uid, step, obs_key, reward, outcome, penalty=None, *,
              shape: Optional[tuple[int, int, int]] = None, obs_tokens=None,
              similarity: Optional[SimilarityConfig] = None, action=None) -> tuple[StepBatch, RowIndex]:
    """Pad rows into a StepBatch.

    Args (one entry per row, any order):
      uid: group id (any hashable: strings, ints).   traj_uid: trajectory id.
      step: the step's index within its trajectory; each trajectory must hold steps
        0 .. L-1 exactly once.
      obs_key: uint32 [R, 2] keys, or raw observations (strings, bytes, arrays). A list
        of str (or of bytes) is hashed in one vectorised pass (equal strings, equal keys;
        the keys differ from ``hash_observation``'s digests); anything else row by row
        with ``hash_observation`` (typed: "1", b"1" and int32 [1] differ).
      reward: [R] step rewards.   outcome: [R] the trajectory's outcome code (equal
        on all its rows): SUCCESS (0), FAILURE (1), TRUNCATED (2); booleans such as
        verl-agent's ``won`` are refused (True would read as 1 = FAILURE).
      penalty: [R] or None.
      obs_tokens: [R, W] integer tokens of each row's observation (PAD 0), needed for
        ``similarity``; placed in ``RowIndex.obs_tokens`` [B, K, T, W].
      similarity: a ``SimilarityConfig``: merge similar observations (``merge_similar``)
        so that every graph estimator groups them; None = exact keys.
      action: [R] the action each row took (texts, canonicalised and hashed by ``action_keys``,
        or integer ids), for ``StepBatch.action_key`` (ECPO groups by it); None = not recorded.

    verl-agent's rows of one group (two trajectories), GRPO's credit back on the rows (step
    weighting: statistics over the rows' scores 10, 10, 0):

    >>> import bepo_jax as bj
    >>> batch, index = bj.from_rows(uid=["g", "g", "g"], traj_uid=["t0", "t0", "t1"], step=[0, 1, 0],
    ...                             obs_key=["look", "take key", "look"], reward=[0.0, 10.0, 0.0],
    ...                             outcome=[bj.SUCCESS, bj.SUCCESS, bj.FAILURE])
    >>> batch.mask.shape
    (1, 2, 2)
    >>> [round(float(a), 4) for a in bj.to_rows(bj.grpo(batch).advantage, index)]
    [0.5774, 0.5774, -1.1547]
    """
    uid = uid if isinstance(uid, np.ndarray) else np.asarray(uid, dtype=object)
    n = len(uid)
    if n == 0:
        raise ValueError("from_rows got no rows.")
    traj_uid = _column("traj_uid", traj_uid if isinstance(traj_uid, np.ndarray) else np.asarray(traj_uid, dtype=object), n)
    step = _column("step", step, n)
    if not np.issubdtype(step.dtype, np.integer):
        raise ValueError(f"from_rows: step has dtype {step.dtype}; it must hold integer step indices.")
    reward = _column("reward", reward, n)
    outcome = _column("outcome", outcome, n)
    if outcome.dtype == np.bool_ or (outcome.dtype == object and any(isinstance(o, (bool, np.bool_)) for o in outcome)):
        raise ValueError("from_rows: outcome holds booleans, which would read True as 1 = FAILURE. Pass outcome "
                         "codes: SUCCESS (0), FAILURE (1), TRUNCATED (2), e.g. np.where(won, SUCCESS, FAILURE).")
    if not np.issubdtype(outcome.dtype, np.integer) and outcome.dtype != object:
        raise ValueError(f"from_rows: outcome has dtype {outcome.dtype}; pass integer outcome codes "
                         "SUCCESS (0), FAILURE (1), TRUNCATED (2).")
    outcome = outcome.astype(np.int64)
    if penalty is not None:
        penalty = _column("penalty", penalty, n)
    if similarity is not None and obs_tokens is None:
        raise ValueError("from_rows: similarity merging needs obs_tokens ([R, W] tokens of each row's observation).")
    if obs_tokens is not None:
        obs_tokens = _column("obs_tokens", obs_tokens, n)
        if obs_tokens.ndim != 2 or not np.issubdtype(obs_tokens.dtype, np.integer):
            raise ValueError(f"from_rows: obs_tokens must be integer tokens [R, W]; got {obs_tokens.dtype} "
                             f"{obs_tokens.shape}.")
    keys = _column("obs_key", _keys_of(obs_key, n), n)
    if keys.shape != (n, 2):
        raise ValueError(f"from_rows: obs_key must be uint32 [R, 2] or one raw observation per row; got {keys.shape}.")

    b, group_names, _ = _factorize(uid)
    traj, traj_names, first = _factorize(traj_uid)
    traj_group = b[first]
    if (bad := traj_group[traj] != b).any():
        i = int(np.argmax(bad))
        raise ValueError(f"from_rows: traj_uid {traj_uid[i]!r} appears in two groups (uid); a trajectory "
                         "belongs to one group.")
    order = np.lexsort((first, traj_group))  # trajectories by group, then by first appearance
    rank = np.empty(len(traj_names), np.int64)
    starts = np.searchsorted(traj_group[order], traj_group[order], side="left")
    rank[order] = np.arange(len(order)) - starts
    k = rank[traj]
    B = len(group_names)
    K = int(rank.max()) + 1
    lengths = np.bincount(b * K + k, minlength=B * K).reshape(B, K)
    T = int(lengths.max())
    if shape is not None:
        if len(shape) != 3 or any(want < have for want, have in zip(shape, (B, K, T))):
            raise ValueError(f"from_rows: the rows need shape at least {(B, K, T)} (groups, trajectories per "
                             f"group, steps); shape={tuple(shape)} is too small.")
        B, K, T = (int(x) for x in shape)
        lengths = np.pad(lengths, ((0, B - lengths.shape[0]), (0, K - lengths.shape[1])))
    t = step.astype(np.int64)
    if (t < 0).any() or (t >= lengths[b, k]).any():
        i = int(np.argmax((t < 0) | (t >= lengths[b, k])))
        raise ValueError(f"from_rows: row {i} has step {t[i]} but its trajectory {traj_uid[i]!r} has "
                         f"{lengths[b[i], k[i]]} rows; steps must be 0 .. L-1.")
    counts = np.bincount((b * K + k) * T + t, minlength=B * K * T).reshape(B, K, T)
    if (counts > 1).any():
        bb, kk, tt = np.argwhere(counts > 1)[0]
        name = traj_names[int(order[np.searchsorted(traj_group[order], bb) + kk])]
        raise ValueError(f"from_rows: step {tt} of trajectory {name!r} appears twice.")

    if (bad := (outcome < 0) | (outcome >= NUM_OUTCOMES)).any():
        i = int(np.argmax(bad))
        raise ValueError(f"from_rows: row {i} has outcome {outcome[i]}; use SUCCESS (0), FAILURE (1) or TRUNCATED (2).")
    traj_outcome = outcome[first]
    if (bad := traj_outcome[traj] != outcome).any():
        i = int(np.argmax(bad))
        raise ValueError(f"from_rows: trajectory {traj_uid[i]!r} has two outcomes ({traj_outcome[traj[i]]} and "
                         f"{outcome[i]}); give every row of a trajectory its final outcome.")
    out_bk = np.full((B, K), 1, np.int64)  # padding trajectories: any valid code
    out_bk[traj_group, rank] = traj_outcome

    obs = np.zeros((B, K, T, 2), np.uint32)
    rew = np.zeros((B, K, T), np.float32)
    pen = np.zeros((B, K, T), np.float32)
    obs[b, k, t] = keys
    rew[b, k, t] = reward
    if penalty is not None:
        pen[b, k, t] = penalty
    mask = np.arange(T)[None, None, :] < lengths[..., None]
    act_key = None
    if action is not None:
        act_key = np.zeros((B, K, T, 2), np.uint32)
        act_key[b, k, t] = _column("action", action_keys(action if isinstance(action, np.ndarray) else list(action)), n)
    batch = StepBatch(obs_key=obs, reward=rew, mask=mask, outcome=out_bk.astype(np.int32),
                      penalty=pen if penalty is not None else None, action_key=act_key)
    tokens = None
    if obs_tokens is not None:
        tokens = np.zeros((B, K, T, obs_tokens.shape[1]), obs_tokens.dtype)
        tokens[b, k, t] = obs_tokens
        if similarity is not None:
            merged = _merge_similar(batch, tokens, similarity)  # jitted: eager, its while_loop compiled every call
            batch = dataclasses.replace(batch, obs_key=np.asarray(merged.obs_key))
    trajectories = np.full((B, K), None, dtype=object)
    trajectories[traj_group, rank] = np.asarray(traj_names + [None], dtype=object)[:-1]
    groups = np.empty(B, dtype=object)
    groups[: len(group_names)] = np.asarray(group_names + [None], dtype=object)[:-1]
    return batch, RowIndex(b=b, k=k, t=t, groups=groups, trajectories=trajectories, shape=(B, K, T),
                           obs_tokens=tokens)


def to_rows(values, index: RowIndex) -> np.ndarray:
    """Per-record values [B, K, T] (e.g. ``.advantage``) -> one value per row, in row order.

    >>> import numpy as np, bepo_jax as bj
    >>> batch, index = bj.from_rows(uid=[7, 7], traj_uid=[0, 1], step=[0, 0], obs_key=["a", "a"],
    ...                             reward=[1.0, 0.0], outcome=[bj.SUCCESS, bj.FAILURE])
    >>> bj.to_rows(np.array([[[5.0], [6.0]]]), index).tolist()  # record (b, k, t) of each row
    [5.0, 6.0]
    """
    values = np.asarray(values)
    if tuple(values.shape[:3]) != tuple(index.shape):
        raise ValueError(f"to_rows: values have shape {values.shape}, expected {index.shape} (the batch from_rows built).")
    return values[index.b, index.k, index.t]
