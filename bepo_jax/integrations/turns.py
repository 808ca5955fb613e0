"""Multi-turn conversations -> step credit -> per-token advantages (trainer-neutral).

A multi-turn agent trainer (Tunix's agentic learner, or any other) keeps each trajectory
as one token stream after the prompt: turn t's assistant tokens, then the environment's
reply to it, then turn t + 1's assistant tokens, ... with a mask that is 1 on assistant
tokens and 0 on environment tokens. This module turns groups of such trajectories into
the estimators' StepBatch and their per-step advantages back into that stream:

    Turn(state, reward, assistant_tokens, env_tokens)      one per turn t of a trajectory
    credit_for_groups(groups, outcomes, name, config)       -> A[g][k][t] for many groups, in ONE
                                                               estimator call on a bucketed shape
    group_step_advantages(turns, outcomes, name, config)    -> A[k][t] for one group
    token_advantages(turns, A, mask)                        -> float32 [K, L]:
        adv[k, p] = A[k][t] for the p in turn t's assistant span, 0 on environment and padding

A turn's ``state`` is the observation the model acted on (a string: equal strings are the
same state of the empirical graph; with ``similarity`` nearly equal strings are merged,
docs/similarity.md, over the string's UTF-8 bytes); ``reward`` its step reward. Spans are
laid out in order -- assistant_tokens of turn 0, env_tokens of turn 0, assistant_tokens of
turn 1, ... -- and cut at the stream's padded length L.

Outcomes: ``outcome_of(ending, success)`` -- TRUNCATED when a limit ended the episode
(``LIMIT_ENDINGS``: the step limit, the token budget, a timeout), otherwise SUCCESS or
FAILURE as the environment says. A trajectory's reward that no single step earned (a
score of the whole conversation) is put on one turn with ``add_trajectory_reward``.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import NamedTuple, Optional, Sequence

import numpy as np

from ..credit.estimators.registry import compute_advantages, get_estimator, make_config
from ..credit.types import FAILURE, SUCCESS, TRUNCATED
from .rows import _string_keys, from_rows, key_words, to_rows

#: Endings that a limit, not the environment, chose: their trajectories are TRUNCATED.
LIMIT_ENDINGS = ("step_limit", "context_limit", "time_limit", "env_timeout")
#: Every ending ``outcome_of`` knows: the environment's own ("env") and the limits.
ENDINGS = ("env",) + LIMIT_ENDINGS


class Turn(NamedTuple):
    """One turn of a trajectory: the observation acted on, the step reward, how many
    assistant and environment tokens the turn adds to the token stream, and optionally the
    action taken (its text: ``StepBatch.action_key`` for ECPO; "" = no valid action)."""

    state: str
    reward: float
    assistant_tokens: int
    env_tokens: int
    action: Optional[str] = None


def outcome_of(ending: str, success: Optional[bool]) -> int:
    """The trajectory's outcome code.

    ``ending``: "env" when the environment itself ended the episode, else one of
    ``LIMIT_ENDINGS`` ("step_limit", "context_limit", "time_limit", "env_timeout").
    A limit gives TRUNCATED whatever ``success`` says; an environment's ending gives
    SUCCESS when ``success`` is true, FAILURE otherwise."""
    if ending not in ENDINGS:
        raise ValueError(f"outcome_of: ending={ending!r}; use one of {', '.join(ENDINGS)}.")
    if ending != "env":
        return TRUNCATED
    return SUCCESS if success else FAILURE


def add_trajectory_reward(turns: Sequence[Turn], extra: float, *, turn: str = "first") -> list[Turn]:
    """``turns`` with ``extra`` added to the reward of its first (``turn="first"``) or last
    (``"last"``) turn: a reward scored on the whole trajectory, or on one of its replies,
    that no environment step paid. A trajectory without turns is returned unchanged
    (it has no record to carry the reward)."""
    if turn not in ("first", "last"):
        raise ValueError(f"add_trajectory_reward: turn={turn!r}; use 'first' or 'last'.")
    out = list(turns)
    if out and extra != 0.0:
        i = 0 if turn == "first" else len(out) - 1
        out[i] = out[i]._replace(reward=float(out[i].reward) + float(extra))
    return out


def bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two >= max(n, minimum): padded shapes come from a few buckets,
    so a stream of groups of varying size compiles each kernel a few times, not per shape."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def _state_tokens(states: Sequence[str]) -> np.ndarray:
    """UTF-8 bytes + 1 of each state (PAD 0), [R, W] with W a bucket: the tokens similarity
    merging compares (character n-grams, as verl-agent's SequenceMatcher compares strings)."""
    raw = [s.encode("utf-8") for s in states]
    W = bucket(max((len(r) for r in raw), default=1), 16)
    out = np.zeros((len(raw), W), np.int32)
    for i, r in enumerate(raw):
        out[i, :len(r)] = np.frombuffer(r, np.uint8).astype(np.int32) + 1
    return out


def _device_scope(device: Optional[str]):
    """``None``: JAX's default device; ``"cpu"``: the host CPU (so credit never queues behind
    sampling on the accelerator); any other string: ``jax.devices(device)[0]``."""
    if device is None:
        return contextlib.nullcontext()
    import jax

    return jax.default_device(jax.devices(device)[0])


_COMPILING = threading.local()  # the compile counter of the credit call running in this thread, if any


def _on_jax_event(event: str, duration: float, **kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration" and getattr(_COMPILING, "count", None) is not None:
        _COMPILING.count += 1


@contextlib.contextmanager
def _counting_compiles():
    """Count the XLA compilations this thread runs inside the block (JAX's monitoring events; other
    threads' compiles, e.g. a trainer's sampler, are not counted). Yields a one-element list."""
    import jax

    # (re-)registered on every call: a trainer may clear JAX's listeners (Tunix's metrics logger does)
    try:
        jax.monitoring.unregister_event_duration_listener(_on_jax_event)
    except (AssertionError, ValueError):
        pass
    jax.monitoring.register_event_duration_secs_listener(_on_jax_event)
    _COMPILING.count = 0
    out = [0]
    try:
        yield out
    finally:
        out[0] = _COMPILING.count
        _COMPILING.count = None


class BucketWatch:
    """The bucketed shapes a stream of ``credit_for_groups`` calls used, and the compilations a
    new one cost: after the first call (the warm-up), every bucket larger than any seen before
    in one dimension is an overflow, counted in ``overflows[dimension]`` and described
    by ``hint(dimension)`` (the dimensions: the keys of ``HINTS``); ``compiles`` and
    ``compiles_after_warmup`` count the XLA compilations the calls ran in their own thread (an
    overflow usually costs one per program it reaches)."""

    HINTS = {
        "groups": "a call held more groups than before: keep the groups per call constant (Tunix: "
                  "RLTrainingConfig.compute_logps_micro_batch_size; evaluation calls hold their own number)",
        "trajectories": "a group held more trajectories than before: keep num_generations constant",
        "turns": "an episode had more turns than before: the Tunix learner pads turns to the environment's "
                 "max_steps, so give the environment a max_steps that bounds its episodes (credit_for_groups: "
                 "min_shape)",
        "state_words": "a state string was longer than before (each power of two of its UTF-8 length compiles "
                       "the state hashing once more): shorten states with state_fn, e.g. the latest observation",
        "similarity_width": "a state string was longer than before (similarity merging compares up to a power "
                            "of two of bytes, one compile per width): shorten states with state_fn",
    }

    def __init__(self):
        self.calls = 0
        self.largest: dict = {}
        self.overflows = collections.Counter()
        self.compiles = 0
        self.compiles_after_warmup = 0
        self.last: dict = {}  # the last call's overflows: dimension -> (size, bucket)

    def record(self, sizes: dict, buckets: dict, compiles: int) -> None:
        """Note one call's sizes and buckets (its overflows: ``last``, dimension -> (size, bucket))."""
        new = {}
        for dim, b in buckets.items():
            if self.calls and b > self.largest.get(dim, 0):
                new[dim] = (sizes[dim], b)
                self.overflows[dim] += 1
            self.largest[dim] = max(self.largest.get(dim, 0), b)
        self.compiles += compiles
        if self.calls:
            self.compiles_after_warmup += compiles
        self.calls += 1
        self.last = new

    def hint(self, dim: str) -> str:
        return self.HINTS[dim]


def credit_for_groups(groups: Sequence[Sequence[Sequence[Turn]]], outcomes: Sequence[Sequence[int]],
                      estimator: str, config=None, *, buckets: bool = True, device: Optional[str] = None,
                      similarity=None, min_shape: Optional[tuple[int, int, int]] = None,
                      watch: Optional[BucketWatch] = None) -> tuple[list[list[np.ndarray]], list[dict]]:
    """Per-turn advantages of many groups in one estimator call.

    ``groups[g][k]``: trajectory k of group g as a list of ``Turn``; ``outcomes[g][k]`` its
    outcome code. The groups' rows go into one StepBatch [B, K, T] (``from_rows``), padded
    to powers of two in each axis when ``buckets`` (padding changes no number: the
    estimators ignore masked records, and an empty trajectory takes no part in any
    statistic), and the estimator runs once on ``device`` (``_device_scope``).
    ``min_shape`` (groups, trajectories, turns): pad to at least this, e.g. turns = the
    environment's step limit, so that every call has the same shape and only the first
    compiles. ``similarity``: a ``SimilarityConfig`` to merge nearly equal states. When every turn
    gives its ``action``, the batch carries the action keys (``StepBatch.action_key``). ``watch``: a
    ``BucketWatch`` that records this call's buckets and compilations (overflows after warm-up).
    An estimator that reads the states' texts (the registry's ``text_inputs``: ProxMO's soft grouping,
    their TF-IDF, as its authors' code does) gets the turns' state texts.

    Returns ``A[g][k]`` (float32, one value per turn) and, per group, the diagnostics as
    floats (``states``, ``gated_share``, ``converged``, ``iterations``, ``mean_out_degree``
    where the estimator builds a state graph). A trajectory without turns takes no part;
    a group in which fewer than two trajectories have turns has nothing to compare: its
    credit is 0 and its diagnostics are empty."""
    if len(outcomes) != len(groups):
        raise ValueError(f"credit_for_groups: {len(groups)} groups but {len(outcomes)} outcome lists; "
                         "give one per group.")
    uid, traj, step, obs, reward, outcome, action = [], [], [], [], [], [], []
    live = []
    for g, (turns, outs) in enumerate(zip(groups, outcomes)):
        if len(outs) != len(turns):
            raise ValueError(f"credit_for_groups: group {g} has {len(turns)} trajectories but {len(outs)} "
                             "outcomes; give one per trajectory.")
        ok = sum(len(tr) > 0 for tr in turns) >= 2
        live.append(ok)
        for k, tr in enumerate(turns):
            for i, t in enumerate(tr):
                if not isinstance(t.state, str):
                    raise ValueError(f"Turn.state must be a string (the observation text), got "
                                     f"{type(t.state).__name__} in group {g}, trajectory {k}, turn {i}.")
                if ok:
                    uid.append(g)
                    traj.append((g, k))
                    step.append(i)
                    obs.append(t.state)
                    reward.append(float(t.reward))
                    outcome.append(int(outs[k]))
                    action.append(t.action)
    result = [[np.zeros(len(tr), np.float32) for tr in turns] for turns in groups]
    info: list[dict] = [{} for _ in groups]
    if not uid:
        return result, info
    n_live = sum(live)
    K = max(len(turns) for turns, ok in zip(groups, live) if ok)
    T = max(len(tr) for turns, ok in zip(groups, live) if ok for tr in turns)
    lo = (1, 1, 2) if min_shape is None else tuple(int(x) for x in min_shape)
    if len(lo) != 3:
        raise ValueError(f"credit_for_groups: min_shape={min_shape!r}; give (groups, trajectories, turns).")
    shape = (bucket(n_live, lo[0]), bucket(K, lo[1]), bucket(T, lo[2])) if buckets else None
    tokens = _state_tokens(obs) if similarity is not None else None
    counter = _counting_compiles() if watch is not None else contextlib.nullcontext([0])
    with _device_scope(device), counter as compiled:
        keys = _string_keys(obs, min_rows=int(np.prod(shape)) if shape else 1)  # one hash shape per batch shape
        batch, index = from_rows(np.asarray(uid), np.asarray([f"{g}/{k}" for g, k in traj], dtype=object),
                                 np.asarray(step), obs if keys is None else keys, np.asarray(reward, np.float32),
                                 np.asarray(outcome, np.int32), shape=shape, obs_tokens=tokens,
                                 similarity=similarity,
                                 action=action if all(a is not None for a in action) else None)
        if get_estimator(estimator).text_inputs is not None:  # it reads the states' texts (ProxMO's TF-IDF)
            texts = np.full(index.shape, "", object)
            texts[index.b, index.k, index.t] = obs
            out = get_estimator(estimator).fn(batch, make_config(estimator, config), texts=texts)
        else:
            out = compute_advantages(estimator, batch, config)  # validates config (a dict or an instance)
        per_row = to_rows(np.asarray(out.advantage), index)
        diag = getattr(out, "diagnostics", None)
        diag = None if diag is None else {k: np.asarray(getattr(diag, k)) for k in
                                          ("num_states", "gated_share", "converged", "iterations",
                                           "mean_out_degree") if hasattr(diag, k)}
    if watch is not None:
        longest = max(len(o.encode("utf-8")) for o in obs)
        sizes = {"groups": n_live, "trajectories": K, "turns": T, "state_words": key_words(longest)}
        bucketed = dict(zip(("groups", "trajectories", "turns"), shape or (n_live, K, T)),
                        state_words=bucket(sizes["state_words"]))  # _string_keys' power-of-two width
        if tokens is not None:
            sizes["similarity_width"], bucketed["similarity_width"] = longest, tokens.shape[1]
        watch.record(sizes, bucketed, compiled[0])
    at = 0
    b_of = {name: b for b, name in enumerate(index.groups) if name is not None}
    for g, (turns, ok) in enumerate(zip(groups, live)):
        if not ok:
            continue
        for k, tr in enumerate(turns):
            result[g][k] = np.asarray(per_row[at: at + len(tr)], np.float32)
            at += len(tr)
        if diag is not None:
            b = b_of[g]
            info[g] = {("states" if k == "num_states" else k): float(v[b]) for k, v in diag.items()}
    return result, info


def group_step_advantages(turns: Sequence[Sequence[Turn]], outcomes: Sequence[int], estimator: str,
                          config=None, **kwargs) -> tuple[list[np.ndarray], dict]:
    """Per-turn advantages of one group (K trajectories sampled from one task):
    ``credit_for_groups`` with one group (same keywords). Returns one float32 array of
    length len(turns[k]) per trajectory and the group's diagnostics."""
    if len(outcomes) != len(turns):
        raise ValueError(f"group_step_advantages: {len(turns)} trajectories but {len(outcomes)} outcomes; "
                         "give one per trajectory.")
    adv, info = credit_for_groups([turns], [outcomes], estimator, config, **kwargs)
    return adv[0], info[0]


def token_advantages(turns: Sequence[Sequence[Turn]], step_advantages: Sequence[np.ndarray], mask) -> np.ndarray:
    """Lay per-turn advantages onto the token stream: float32 [K, L] with L = mask's width.

    ``mask`` [K, L]: the trainer's completion mask (1 on assistant tokens); the result is
    zero wherever it is zero. A turn's assistant span that the mask does not cover (the
    stream was cut at L, or the trainer zeroed a filtered trajectory) gets no credit there."""
    mask = np.asarray(mask)
    K, L = mask.shape
    if len(turns) != K or len(step_advantages) != K:
        raise ValueError(f"token_advantages: mask has {K} rows but {len(turns)} trajectories and "
                         f"{len(step_advantages)} advantage arrays; give one per trajectory.")
    adv = np.zeros((K, L), np.float32)
    for k, (tr, a) in enumerate(zip(turns, step_advantages)):
        if len(a) != len(tr):
            raise ValueError(f"token_advantages: trajectory {k} has {len(tr)} turns but {len(a)} advantages.")
        p = 0
        for t, v in zip(tr, a):
            adv[k, p: min(p + int(t.assistant_tokens), L)] = v
            p += int(t.assistant_tokens) + int(t.env_tokens)
    return adv * (mask != 0)
