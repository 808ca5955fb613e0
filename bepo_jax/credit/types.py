"""The data model (docs/data-model.md): ``StepBatch``, outcome codes, estimator outputs,
and host-side validation that turns bad input into a ``ValueError`` naming the field
and the fix.

A batch holds B groups; a group holds K trajectories sampled from one initial state
of one task; each trajectory is padded to T steps. Record i = (b, k, t) with
``mask[b, k, t]``; ``mask`` is a valid *prefix* of length L_k (possibly 0).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, UInt32

SUCCESS: int = 0
FAILURE: int = 1
TRUNCATED: int = 2
OUTCOME_NAMES = ("SUCCESS", "FAILURE", "TRUNCATED")
NUM_OUTCOMES = len(OUTCOME_NAMES)

# jaxtyping aliases used across the package.
Keys = UInt32[Array, "B K T 2"]
PerRecord = Float[Array, "B K T"]
RecordMask = Bool[Array, "B K T"]
Outcomes = Int[Array, "B K"]


def pytree_dataclass(cls):
    """A frozen dataclass registered as a JAX pytree, every field a data leaf (``StepBatch`` and every
    estimator's output: an output type lives in its estimator's module)."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    return jax.tree_util.register_dataclass(cls, data_fields=names, meta_fields=[])


@pytree_dataclass
class StepBatch:
    """B groups x K trajectories x T padded steps (docs/data-model.md).

    Attributes:
      obs_key: uint32 [B, K, T, 2] — 64-bit content hash of the observation *before*
        step t, as two uint32 words (see ``hash_observations`` / ``hash_tokens``).
      reward: float32 [B, K, T] — environment reward of step t.
      mask: bool [B, K, T] — valid steps, a prefix of length L_k per trajectory.
      outcome: int32 [B, K] — ``SUCCESS`` (0), ``FAILURE`` (1) or ``TRUNCATED`` (2).
      penalty: float32 [B, K, T] or None — per-step local penalty (<= 0 in
        verl-agent's use); ``None`` means zeros.
      action_key: uint32 [B, K, T, 2] or None — 64-bit key of the action taken at step t
        (``action_keys``: the canonical action text, hashed); ``None`` when the actions are
        not recorded. Only estimators that group by action read it (ECPO).

    The class is a pytree, so it passes through ``jax.jit``/``vmap``/``shard_map``.
    Host entry points validate it with ``check_batch``.
    """

    obs_key: Keys
    reward: PerRecord
    mask: RecordMask
    outcome: Outcomes
    penalty: Optional[PerRecord] = None
    action_key: Optional[Keys] = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, K, T)."""
        return tuple(self.mask.shape)  # type: ignore[return-value]

    def penalty_or_zeros(self) -> PerRecord:
        return jnp.zeros_like(self.reward) if self.penalty is None else self.penalty


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _as_array(name: str, x: Any):
    if x is None:
        raise ValueError(f"StepBatch.{name} is None; pass an array (see docs/data-model.md).")
    if isinstance(x, (jax.Array, np.ndarray)) or _is_tracer(x):
        return x
    try:
        return np.asarray(x)
    except Exception as err:  # ragged lists and the like
        raise ValueError(f"StepBatch.{name} could not be turned into an array ({err}); pass a padded array.") from err


def _check_shape(name: str, x, expected: tuple[int, ...], what: str) -> None:
    if tuple(x.shape) != expected:
        raise ValueError(
            f"StepBatch.{name} has shape {tuple(x.shape)}, expected {expected} ({what}); "
            "every field must share the mask's [B, K, T] layout."
        )


def _check_real(name: str, x) -> None:
    dt = np.dtype(x.dtype)
    if dt == np.bool_ or not (np.issubdtype(dt, np.floating) or np.issubdtype(dt, np.integer)):
        raise ValueError(
            f"StepBatch.{name} has dtype {dt}; it must be a real number array "
            f"(it is cast to float32), e.g. {name}.astype(np.float32)."
        )


def _check_key(name: str, x: Any, bkt: tuple[int, int, int], fix: str):
    """A 64-bit key field (``obs_key``, ``action_key``): uint32 [B, K, T, 2], else a ValueError naming
    the field and ``fix``."""
    x = _as_array(name, x)
    _check_shape(name, x, bkt + (2,), "[B, K, T, 2]: a 64-bit key as two uint32 words")
    if np.dtype(x.dtype) != np.uint32:
        raise ValueError(f"StepBatch.{name} has dtype {np.dtype(x.dtype)}; it must be uint32 [B, K, T, 2]. {fix}")
    return x


def check_batch(batch: StepBatch, *, values: bool = True) -> StepBatch:
    """Validate ``batch`` and return it with canonical dtypes.

    Shapes and dtypes are always checked. When ``values`` is true and the arrays are
    concrete (not tracers inside a user's ``jit``), values are checked too: masks are
    prefixes, rewards and penalties are finite on valid steps, outcome codes are 0, 1
    or 2. Every failure raises ``ValueError`` naming the field and the fix.

    Returns a ``StepBatch`` with reward/penalty float32, mask bool, outcome int32.
    """
    if not isinstance(batch, StepBatch):
        raise ValueError(
            f"expected a bepo_jax.StepBatch, got {type(batch).__name__}; build one with "
            "StepBatch(obs_key=..., reward=..., mask=..., outcome=..., penalty=None)."
        )
    mask = _as_array("mask", batch.mask)
    if mask.ndim != 3:
        raise ValueError(f"StepBatch.mask must have shape [B, K, T], got {tuple(mask.shape)}.")
    if np.dtype(mask.dtype) != np.bool_:
        raise ValueError(
            f"StepBatch.mask has dtype {np.dtype(mask.dtype)}; it must be bool (valid steps), "
            "e.g. mask.astype(bool)."
        )
    B, K, T = mask.shape
    if min(B, K, T) < 1:
        raise ValueError(f"StepBatch.mask has an empty axis {tuple(mask.shape)}; B, K and T must all be >= 1.")

    obs_key = _check_key("obs_key", batch.obs_key, (B, K, T),
                         "Use bepo_jax.hash_observations(obs) for raw observations, hash_tokens(tokens, mask) "
                         "for token arrays, or split_key64(keys_uint64).")
    reward = _as_array("reward", batch.reward)
    _check_shape("reward", reward, (B, K, T), "[B, K, T]")
    _check_real("reward", reward)
    outcome = _as_array("outcome", batch.outcome)
    _check_shape("outcome", outcome, (B, K), "[B, K]: one code per trajectory")
    if not np.issubdtype(np.dtype(outcome.dtype), np.integer):
        raise ValueError(
            f"StepBatch.outcome has dtype {np.dtype(outcome.dtype)}; it must be an integer array of "
            "SUCCESS (0) / FAILURE (1) / TRUNCATED (2)."
        )
    penalty = batch.penalty
    if penalty is not None:
        penalty = _as_array("penalty", penalty)
        _check_shape("penalty", penalty, (B, K, T), "[B, K, T]")
        _check_real("penalty", penalty)

    action_key = batch.action_key
    if action_key is not None:
        action_key = _check_key("action_key", action_key, (B, K, T),
                                "Use bepo_jax.action_keys(actions) for action texts or ids.")

    if values and not any(_is_tracer(x) for x in (mask, reward, outcome, penalty)):
        _check_values(np.asarray(mask), np.asarray(reward), np.asarray(outcome),
                      None if penalty is None else np.asarray(penalty))

    return StepBatch(
        obs_key=jnp.asarray(obs_key),
        reward=jnp.asarray(reward, dtype=jnp.float32),
        mask=jnp.asarray(mask),
        outcome=jnp.asarray(outcome, dtype=jnp.int32),
        penalty=None if penalty is None else jnp.asarray(penalty, dtype=jnp.float32),
        action_key=None if action_key is None else jnp.asarray(action_key),
    )


def _first(where: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(where)[0])


def _check_values(mask: np.ndarray, reward: np.ndarray, outcome: np.ndarray,
                  penalty: Optional[np.ndarray]) -> None:
    gap = mask[..., 1:] & ~mask[..., :-1]
    if gap.any():
        b, k, t = _first(gap)
        raise ValueError(
            f"StepBatch.mask is not a prefix at group {b}, trajectory {k}: step {t + 1} is valid but "
            f"step {t} is not. Left-align each trajectory's valid steps (mask[b, k] = t < L_k)."
        )
    for name, arr in (("reward", reward), ("penalty", penalty)):
        if arr is None:
            continue
        bad = mask & ~np.isfinite(arr.astype(np.float64))
        if bad.any():
            b, k, t = _first(bad)
            raise ValueError(
                f"StepBatch.{name} is not finite at valid step (group {b}, trajectory {k}, step {t}): "
                f"{arr[b, k, t]!r}. Replace NaN/inf before computing advantages."
            )
        big = mask & (np.abs(arr.astype(np.float64)) > np.finfo(np.float32).max)
        if big.any():
            b, k, t = _first(big)
            raise ValueError(f"StepBatch.{name} at (group {b}, trajectory {k}, step {t}) overflows float32.")
    size = np.where(mask, np.abs(reward.astype(np.float64)), 0.0)
    if penalty is not None:
        size = size + np.where(mask, np.abs(penalty.astype(np.float64)), 0.0)
    size = size.sum(axis=(-2, -1))
    if (size > SCALE_LIMIT).any():
        b = int(np.argmax(size > SCALE_LIMIT))
        raise ValueError(
            f"StepBatch group {b}: the sum of |reward| + |penalty| over its valid steps is {size[b]:.3g}, above "
            f"{SCALE_LIMIT:.0e}; its returns, values and their statistics would overflow float32 (inf/NaN "
            "advantages). Rescale the rewards (e.g. divide by their largest magnitude).")
    bad = (outcome < 0) | (outcome >= NUM_OUTCOMES)
    if bad.any():
        b, k = _first(bad)
        raise ValueError(
            f"StepBatch.outcome[{b}, {k}] = {int(outcome[b, k])} is not an outcome code; use "
            "SUCCESS (0), FAILURE (1) or TRUNCATED (2)."
        )
    if penalty is not None:
        pos = mask & (penalty > 0)
        if pos.any():
            b, k, t = _first(pos)
            raise ValueError(
                f"StepBatch.penalty[{b}, {k}, {t}] = {float(penalty[b, k, t])!r} is positive; penalties are local "
                "costs <= 0 (e.g. -0.1 for an invalid action). Put bonuses into reward instead."
            )
    nonempty = mask.any(axis=-1).sum(axis=-1)
    single = nonempty == 1
    if single.any():
        b = int(np.argmax(single))
        raise ValueError(
            f"StepBatch group {b} has a single non-empty trajectory (K = {mask.shape[1]}); group-relative "
            "credit needs >= 2 trajectories sampled from the same task. Sample K >= 2 per task, or drop the "
            "group (set its whole mask to False)."
        )


# ----------------------------------------------------------------------------------
# In-jit validity: what ``check_batch`` raises about on the host, as per-group flags.

INVALID_OUTCOME = 1     # an outcome code outside {0, 1, 2}
INVALID_MASK = 2        # the mask is not a prefix
INVALID_VALUE = 4       # a NaN/inf reward or penalty on a valid step
INVALID_PENALTY = 8     # a positive penalty
SINGLE_TRAJECTORY = 16  # fewer than two non-empty trajectories (no group baseline)
INVALID_SCALE = 32      # finite rewards so large that the group's statistics would overflow float32
DROPPED = INVALID_OUTCOME | INVALID_MASK | INVALID_VALUE | INVALID_PENALTY | INVALID_SCALE
INVALID_FLAGS = {"INVALID_OUTCOME": INVALID_OUTCOME, "INVALID_MASK": INVALID_MASK, "INVALID_VALUE": INVALID_VALUE,
                 "INVALID_PENALTY": INVALID_PENALTY, "SINGLE_TRAJECTORY": SINGLE_TRAJECTORY,
                 "INVALID_SCALE": INVALID_SCALE}
#: The largest sum over a group's valid records of |reward + penalty| the estimators accept. Returns,
#: fixed-point values (|V| <= this / (1 - gamma) for gamma <= 0.999) and their squared deviations summed
#: over up to 65,536 records then stay far inside float32 (max ~3.4e38); beyond it the group is refused
#: on the host and flagged INVALID_SCALE (dropped) inside jit. Rescale such rewards.
SCALE_LIMIT = 1e12


def group_flags(batch: StepBatch) -> Int[Array, "B"]:
    """Per-group bit flags of invalid input (jittable; 0 = valid). See ``sanitize``."""
    mask = batch.mask
    outcome = batch.outcome
    pen = batch.penalty_or_zeros()
    bad_outcome = jnp.any((outcome < 0) | (outcome >= NUM_OUTCOMES), axis=-1)
    bad_mask = jnp.any(mask[..., 1:] & ~mask[..., :-1], axis=(-2, -1))
    finite = jnp.isfinite(batch.reward) & jnp.isfinite(pen)
    bad_value = jnp.any(mask & ~finite, axis=(-2, -1))
    bad_penalty = jnp.any(mask & (pen > 0), axis=(-2, -1))
    size = jnp.sum(jnp.where(mask & finite, jnp.abs(batch.reward) + jnp.abs(pen), 0.0), axis=(-2, -1))
    bad_scale = ~(size <= SCALE_LIMIT)  # an inf sum (float32 overflow) is caught too
    nonempty = jnp.sum(jnp.any(mask, axis=-1), axis=-1)
    single = nonempty == 1
    flags = (bad_outcome * INVALID_OUTCOME + bad_mask * INVALID_MASK + bad_value * INVALID_VALUE
             + bad_penalty * INVALID_PENALTY + single * SINGLE_TRAJECTORY + bad_scale * INVALID_SCALE)
    return flags.astype(jnp.int32)


def sanitize(batch: StepBatch) -> tuple[StepBatch, Int[Array, "B"]]:
    """Inside jit nothing can raise: flag each group's invalid input (``group_flags``) and
    drop the groups flagged ``DROPPED`` (their mask becomes all false, so their credit is
    exactly 0 and nothing of them reaches a neighbour); outcome codes are clipped into
    range and non-finite values zeroed so no index or NaN can spill. Groups with a single
    non-empty trajectory are kept (the n = 1 rule applies) and flagged SINGLE_TRAJECTORY.
    Every estimator reports the flags as ``invalid`` (GRPO) / ``diagnostics.invalid``."""
    flags = group_flags(batch)
    keep = (flags & DROPPED) == 0
    mask = batch.mask & keep[:, None, None]
    clean = lambda x: jnp.where(mask & jnp.isfinite(x), x, 0.0)
    penalty = None if batch.penalty is None else clean(batch.penalty)
    outcome = jnp.clip(batch.outcome, 0, NUM_OUTCOMES - 1).astype(batch.outcome.dtype)
    return StepBatch(obs_key=batch.obs_key, reward=clean(batch.reward), mask=mask, outcome=outcome,
                     penalty=penalty, action_key=batch.action_key), flags


def split_key64(keys: Any) -> np.ndarray:
    """uint64 keys [...] -> uint32 [..., 2] (high word, low word), on the host."""
    keys = np.asarray(keys)
    if keys.dtype != np.uint64:
        raise ValueError(f"split_key64 expects uint64 keys, got {keys.dtype}.")
    return np.stack([(keys >> np.uint64(32)).astype(np.uint32), keys.astype(np.uint32)], axis=-1)


# ----------------------------------------------------------------------------------
# Outputs. All are frozen pytrees; every per-record field is 0 at padding.


@pytree_dataclass
class GraphDiagnostics:
    """What a user checks when graph credit looks wrong, per group [B].

    num_states:      distinct source states
    singleton_share: share of records whose state was visited once (no comparison possible)
    gated_share:     share of records that received step credit (gate on / non-singleton step group)
    mean_out_degree: mean number of distinct successors per state (as the gate counts them)
    iterations:      fixed-point / shortest-path sweeps (0 where none is run)
    converged:       whether that iteration met its stopping rule
    overflow:        the group had more states than the solver's bucket ``max_states``
                     (the batch was then evaluated by the bucket-free sparse solver)
    invalid:         bit flags of invalid input found inside jit (``group_flags``; 0 = valid).
                     Groups with INVALID_OUTCOME/MASK/VALUE/PENALTY were dropped (credit 0).
    """

    num_states: Int[Array, "B"]
    singleton_share: Float[Array, "B"]
    gated_share: Float[Array, "B"]
    mean_out_degree: Float[Array, "B"]
    iterations: Int[Array, "B"]
    converged: Bool[Array, "B"]
    overflow: Bool[Array, "B"]
    invalid: Int[Array, "B"]


def outcome_codes(success, terminal) -> Int[Array, "..."]:
    """SUCCESS if the episode succeeded, FAILURE if the environment ended it otherwise,
    TRUNCATED if only the time limit ended it (the rollouts' and the lab's one rule)."""
    return jnp.where(success, SUCCESS, jnp.where(terminal, FAILURE, TRUNCATED)).astype(jnp.int32)
