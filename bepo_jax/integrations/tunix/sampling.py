"""Sampling in Tunix's rollout: a fresh key per model call (``fresh_sampling_seeds``, keyed by the call's
group, trajectory, turn and repeat) and model calls one at a time (``serial_model_calls``); both wrap one
cluster's ``rollout.generate`` and nothing else."""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from typing import Callable

import numpy as np


def _key_part(x) -> int:
    """A stable 31-bit integer for a group id or trajectory index (ints as they are, anything else by CRC32)."""
    import zlib

    if isinstance(x, (int, np.integer)) and 0 <= int(x) < 2**31:
        return int(x)
    return zlib.crc32(repr(x).encode()) & 0x7FFFFFFF


class _Repeats:
    """How many calls with one key (a model call's (group, trajectory, turn)) came before (thread-safe)."""

    def __init__(self):
        self._lock, self._seen = threading.Lock(), collections.Counter()

    def next(self, identity: tuple) -> int:
        with self._lock:
            n = self._seen[identity]
            self._seen[identity] += 1
            return n


_SAMPLING = threading.local()  # the (group, trajectory, turn, repeat) of the model call this thread is making


def fresh_sampling_seeds(rl_cluster, seed: int = 0) -> None:
    """Give every rollout call its own sampling key (idempotent).

    Tunix's "vanilla" rollout engine samples with ``RolloutConfig.seed`` -- with the default
    ``seed=None`` PRNGKey(0) -- on every call: the trajectories of a group, all started
    from one prompt, come out identical and every group-relative advantage is 0. This
    wraps that cluster's rollout object so that each call samples with its own key on a copy
    of the config it was given (calls stay concurrent; engines that draw their own
    randomness, such as vLLM, do not need it). A call made by ``StepCollectEngine`` gets
    fold_in(PRNGKey(seed), group, trajectory, turn, repeat) (repeat: how many earlier episodes
    had the same group, trajectory and turn), so a run samples the same tokens whatever
    ``max_concurrency`` and the threads' order; any other call gets fold_in(PRNGKey(seed), i)
    for the i-th such call. ``StepCreditGRPOLearner`` applies it to the vanilla engine unless
    ``sampling_seed=None``."""
    import jax

    def fresh_keys(generate):
        calls = _Repeats()  # the calls made outside a collect engine, counted

        def generate_with_fresh_key(prompts, rollout_config, *args, **kwargs):
            key = jax.random.PRNGKey(seed)
            identity = getattr(_SAMPLING, "identity", None)
            if identity is None:
                identity = (calls.next(()) + 1,)
            for part in identity:
                key = jax.random.fold_in(key, part)
            return generate(prompts, dataclasses.replace(rollout_config, seed=key), *args, **kwargs)

        return generate_with_fresh_key

    _wrap_generate(rl_cluster, "bepo_fresh_seeds", fresh_keys)


def _wrap_generate(rl_cluster, marker: str, wrapper: Callable[[Callable], Callable]) -> None:
    """Replace the cluster's ``rollout.generate`` by ``wrapper(generate)`` unless a wrapper marked
    ``marker`` is already in it (idempotent, in any order: each wrapper carries the markers of the
    ones inside it)."""
    rollout = rl_cluster.rollout
    if getattr(rollout.generate, marker, False):
        return
    wrapped = functools.wraps(rollout.generate)(wrapper(rollout.generate))
    setattr(wrapped, marker, True)
    rollout.generate = wrapped


def serial_model_calls(rl_cluster) -> None:
    """Make the cluster's rollout calls one at a time (idempotent): a lock around ``generate``.

    JAX 0.12's jit is not safe when several threads make the first call of one jitted function
    at once (a cache miss in each): Tunix's vanilla sampler does that under ``max_concurrency`` >
    1, every time a sampler meets a new shape, and the process segfaults then or at exit, or hangs
    at exit in ``jax.clear_backends`` (docs/tunix.md, "Sampling"). With the lock the episodes stay
    concurrent -- their environment steps, parsing and the collect engine's bookkeeping -- and only
    the model calls queue; on one device they shared it anyway. ``StepCreditGRPOLearner`` applies
    it to the vanilla engine unless ``serial_generate=False``; apply it after
    ``fresh_sampling_seeds`` so that the keys' own small programs run under the lock too."""
    def one_at_a_time(generate):
        lock = threading.Lock()

        def generate_one_at_a_time(*args, **kwargs):
            with lock:
                return generate(*args, **kwargs)

        return generate_one_at_a_time

    _wrap_generate(rl_cluster, "bepo_serial", one_at_a_time)
