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
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from ..hashing import hash_observations
from ..types import NUM_OUTCOMES, StepBatch


@dataclasses.dataclass(frozen=True)
class RowIndex:
    """Where each row lives in the padded batch: ``batch[b[i], k[i], t[i]]`` is row i."""

    b: np.ndarray
    k: np.ndarray
    t: np.ndarray
    groups: np.ndarray        # uid of each group b
    trajectories: np.ndarray  # traj_uid of each (b, k), padding slots None
    shape: tuple[int, int, int]


def _column(name: str, x: Any, n: int) -> np.ndarray:
    a = np.asarray(x)
    if a.shape[:1] != (n,):
        raise ValueError(f"from_rows: {name} has {a.shape[0] if a.ndim else 'no'} rows, expected {n} (one per row).")
    return a


def from_rows(uid, traj_uid, step, obs_key, reward, outcome, penalty=None, *,
              shape: Optional[tuple[int, int, int]] = None) -> tuple[StepBatch, RowIndex]:
    """Pad rows into a StepBatch.

    Args (one entry per row, any order):
      uid: group id (any hashable: strings, ints).   traj_uid: trajectory id.
      step: the step's index within its trajectory; each trajectory must hold steps
        0 .. L-1 exactly once.
      obs_key: uint32 [R, 2] keys, or raw observations (strings, bytes, arrays), hashed
        with ``hash_observations``.
      reward: [R] step rewards.   outcome: [R] the trajectory's outcome code (equal
        on all its rows): SUCCESS (0), FAILURE (1), TRUNCATED (2); booleans such as
        verl-agent's ``won`` are refused (True would read as 1 = FAILURE).
      penalty: [R] or None.
    """
    uid = np.asarray(uid, dtype=object) if not isinstance(uid, np.ndarray) else uid
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
    if penalty is not None:
        penalty = _column("penalty", penalty, n)
    keys = obs_key if isinstance(obs_key, np.ndarray) and obs_key.dtype == np.uint32 else None
    if keys is None:
        obs = obs_key if isinstance(obs_key, np.ndarray) and obs_key.dtype == object else list(obs_key)
        keys = hash_observations(obs)
    keys = _column("obs_key", keys, n)
    if keys.shape != (n, 2):
        raise ValueError(f"from_rows: obs_key must be uint32 [R, 2] or one raw observation per row; got {keys.shape}.")

    group_of, traj_of = {}, {}
    b = np.empty(n, np.int64)
    k = np.empty(n, np.int64)
    for i in range(n):
        g = group_of.setdefault(uid[i], len(group_of))
        trajs = traj_of.setdefault(g, {})
        key = traj_uid[i]
        if key not in trajs:
            for other_g, other in traj_of.items():
                if other_g != g and key in other:
                    raise ValueError(f"from_rows: traj_uid {key!r} appears in two groups (uid); a trajectory "
                                     "belongs to one group.")
            trajs[key] = len(trajs)
        b[i], k[i] = g, trajs[key]
    B = len(group_of)
    K = max(len(t) for t in traj_of.values())
    lengths = np.zeros((B, K), np.int64)
    np.add.at(lengths, (b, k), 1)
    T = int(lengths.max())
    if shape is not None:
        if len(shape) != 3 or any(want < have for want, have in zip(shape, (B, K, T))):
            raise ValueError(f"from_rows: the rows need shape at least {(B, K, T)} (groups, trajectories per "
                             f"group, steps); shape={tuple(shape)} is too small.")
        B, K, T = (int(x) for x in shape)
        lengths = np.pad(lengths, ((0, B - lengths.shape[0]), (0, K - lengths.shape[1])))
    t = step.astype(np.int64)
    seen = np.zeros((B, K, T), bool)
    if (t < 0).any() or (t >= lengths[b, k]).any():
        i = int(np.argmax((t < 0) | (t >= lengths[b, k])))
        raise ValueError(f"from_rows: row {i} has step {t[i]} but its trajectory {traj_uid[i]!r} has "
                         f"{lengths[b[i], k[i]]} rows; steps must be 0 .. L-1.")
    np.add.at(seen, (b, k, t), True)
    counts = np.zeros((B, K, T), np.int64)
    np.add.at(counts, (b, k, t), 1)
    if (counts > 1).any():
        bb, kk, tt = np.argwhere(counts > 1)[0]
        raise ValueError(f"from_rows: step {tt} of trajectory {list(traj_of[bb])[kk]!r} appears twice.")

    out_bk = np.full((B, K), -1, np.int64)
    for i in range(n):
        o = int(outcome[i])
        if not 0 <= o < NUM_OUTCOMES:
            raise ValueError(f"from_rows: row {i} has outcome {o}; use SUCCESS (0), FAILURE (1) or TRUNCATED (2).")
        if out_bk[b[i], k[i]] not in (-1, o):
            raise ValueError(f"from_rows: trajectory {traj_uid[i]!r} has two outcomes ({out_bk[b[i], k[i]]} and {o}); "
                             "give every row of a trajectory its final outcome.")
        out_bk[b[i], k[i]] = o
    out_bk[out_bk < 0] = 1  # padding trajectories: any valid code

    obs = np.zeros((B, K, T, 2), np.uint32)
    rew = np.zeros((B, K, T), np.float32)
    pen = np.zeros((B, K, T), np.float32)
    obs[b, k, t] = keys
    rew[b, k, t] = reward
    if penalty is not None:
        pen[b, k, t] = penalty
    mask = np.arange(T)[None, None, :] < lengths[..., None]
    batch = StepBatch(obs_key=obs, reward=rew, mask=mask, outcome=out_bk.astype(np.int32),
                      penalty=pen if penalty is not None else None)
    trajectories = np.full((B, K), None, dtype=object)
    for g, trajs in traj_of.items():
        for name, kk in trajs.items():
            trajectories[g, kk] = name
    groups = np.empty(B, dtype=object)
    for name, g in group_of.items():
        groups[g] = name
    return batch, RowIndex(b=b, k=k, t=t, groups=groups, trajectories=trajectories, shape=(B, K, T))


def to_rows(values, index: RowIndex) -> np.ndarray:
    """Per-record values [B, K, T] (e.g. ``.advantage``) -> one value per row, in row order."""
    values = np.asarray(values)
    if tuple(values.shape[:3]) != tuple(index.shape):
        raise ValueError(f"to_rows: values have shape {values.shape}, expected {index.shape} (the batch from_rows built).")
    return values[index.b, index.k, index.t]
