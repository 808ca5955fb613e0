"""Evaluation pools disjoint in content from the pools a policy was trained on.

Training and held-out tasks are drawn from separate seed streams (``seed`` and ``seed +
EVAL_SEED_OFFSET``), but a small generator repeats itself: a 6x6 Sokoban level drawn for
evaluation can be, cell for cell, a level of the training pool. An evaluation pool is therefore
the first ``n`` tasks of its seeded sequence whose *content* is new: not the content of any task
in ``exclude`` (the training pool, a warm start's demonstration pool) and not that of an earlier
task of the same pool (so no level is scored twice)::

    pool = first n of [t_0, t_1, ...] (the held-out sequence)
           keeping t_i iff sig(t_i) not in exclude and sig(t_i) != sig(t_j) for every kept j < i

Content is what an environment's ``task_signatures(tasks) -> list[str]`` says (one digest per
task; Sokoban: the level's walls, targets, boxes and player), or TextWorld's ``game_signature``.
An environment without ``task_signatures`` keeps the plain seeded sequence (its held-out tasks
are then separated from training only by seed: ``has_signatures`` says which).

When the environment's ``sample_tasks(m, seed)`` begins with ``sample_tasks(n, seed)`` for m > n
(Sokoban's generator does), a larger pool begins with a smaller one, as a rescoring needs.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Collection, Iterable, TypeVar

import jax
import numpy as np

T = TypeVar("T")
# How a run's held-out pool is kept apart from its training pool (recorded in the run directory:
# train.rundir.held_out_pools). "structural": new in structure (TextWorld: no renamed copy of a training
# game, textworld_env.game_structure; a JAX environment's levels have no names, so for them it is
# "disjoint"); "disjoint": new in content (runs of 2026-12-04 to 12-06); "seeded": the plain seeded
# sequence (runs before).
HELD_OUT_POOLS = ("structural", "disjoint", "seeded")
DEFAULT_HELD_OUT = "structural"
MAX_DRAWS = 20  # a pool of n is drawn from at most MAX_DRAWS * n candidates before the generator is called too small


def first_new(candidates: Iterable[T], n: int, signature: Callable[[T], str], exclude: Collection[str]) -> list[T]:
    """The first ``n`` of ``candidates`` whose ``signature`` is neither in ``exclude`` nor that of
    an earlier kept candidate (fewer when the candidates run out)."""
    out, seen = [], set(exclude)
    if n <= 0:
        return out
    for c in candidates:
        sig = signature(c)
        if sig not in seen:
            seen.add(sig)
            out.append(c)
            if len(out) == n:
                break
    return out


def has_signatures(env) -> bool:
    """Does ``env`` say what its tasks are as content (``task_signatures``)?"""
    return callable(getattr(env, "task_signatures", None))


def digest(*arrays) -> str:
    """A content digest of arrays (dtype, shape and bytes of each)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def take(tasks: Any, idx) -> Any:
    """Tasks ``idx`` of a pytree of stacked tasks (host arrays)."""
    idx = np.asarray(idx, np.int64)
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[idx], tasks)


def disjoint_tasks(env, n: int, seed: int, exclude: Collection[str]) -> Any:
    """The first ``n`` tasks of ``env.sample_tasks(., seed)``'s sequence with new content
    (``first_new`` over ``env.task_signatures``), as a pytree of stacked host arrays. Raises a
    ValueError naming the generator's settings when MAX_DRAWS * n candidates do not hold n."""
    m = max(n, 1)
    while True:
        drawn = env.sample_tasks(m, seed)
        sigs = env.task_signatures(drawn)
        keep = first_new(range(m), n, sigs.__getitem__, exclude)
        if len(keep) == n:
            return take(drawn, keep)
        if m >= MAX_DRAWS * max(n, 1):
            raise ValueError(f"held-out tasks: only {len(keep)} of {n} {getattr(env, 'name', 'environment')} tasks "
                             f"with content new to the {len(exclude)} excluded ones in {m} drawn from seed {seed}; "
                             "the generator's space is too small for this pool (lower eval_tasks or task_pool, or "
                             "enlarge the environment: size, boxes).")
        m = min(2 * m, MAX_DRAWS * max(n, 1))


def task_ids(env, tasks) -> list[str]:
    """Per task of a pool, a short content id (the first 16 hex digits of its signature; a host
    environment's game: its file name), so per-task results can be matched to tasks later."""
    if has_signatures(env):
        return [s[:16] for s in env.task_signatures(tasks)]
    if isinstance(tasks, list):
        return [str(t).rsplit("/", 1)[-1] for t in tasks]
    return []
