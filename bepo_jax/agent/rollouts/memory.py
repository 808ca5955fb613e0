"""Give the host's freed memory back to the operating system between the phases of an LLM iteration.

On CPU, JAX's buffers come from the C allocator. glibc keeps what a program frees in its
arenas (one per thread that allocated, up to 8 per core) for later requests, and XLA's
worker threads allocate and free gigabytes in every chat turn (a turn's KV cache: rows x
slots x 30 blocks x keys and values). Measured on the ``llm_textworld_wide`` recipe
(``experiments/results/bench_llm_memory_g4_e16_i2.md``): without it the process held 6.53 GiB
after its second iteration with 1.77 GiB of live arrays, with it 2.69; kept, that memory stacks
under the next phase's own peak.

``release()`` calls glibc's ``malloc_trim(0)``, which returns every arena's free pages,
and does nothing on another C library (macOS, musl) or when ``BEPO_JAX_MALLOC_TRIM=0``. It
frees nothing that is in use, so no number changes; the chat rollout calls it after each
turn and ``Setup.iterate`` after the update.

    >>> from bepo_jax.agent.rollouts.memory import release
    >>> isinstance(release(), bool)
    True

"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

ENV = "BEPO_JAX_MALLOC_TRIM"  # "0": never trim


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library)."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release() -> bool:
    """Return the C allocator's free memory to the operating system (glibc ``malloc_trim(0)``).
    True when memory was returned; False when there was none, on another C library, or when
    the environment variable ``BEPO_JAX_MALLOC_TRIM`` is ``0``."""
    if os.environ.get(ENV, "1") == "0":
        return False
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False
