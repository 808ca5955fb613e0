"""``agent.rollouts.memory.release``: the C allocator's free pages go back to the system, by the kernel's count."""

from __future__ import annotations

import ctypes

import pytest

from bepo_jax.agent.rollouts import memory


def _resident_bytes() -> int:
    """The process's resident memory as the kernel counts it (/proc/self/status)."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(memory._malloc_trim() is None, reason="glibc's malloc_trim only")
def test_release_gives_the_freed_holes_of_the_heap_back_to_the_system(monkeypatch):
    # blocks below glibc's mmap threshold live in the heap; freeing every other one leaves holes that
    # free() keeps (only the heap's top is trimmed by itself); release() returns them
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, n = 64 * 1024, 4096  # 256 MiB in all, 128 MiB freed as holes
    blocks = [libc.malloc(size) for _ in range(n)]
    assert all(blocks)
    try:
        for b in blocks:
            ctypes.memset(b, 1, size)  # resident
        for b in blocks[1::2]:
            libc.free(b)
        monkeypatch.setenv(memory.ENV, "0")  # switched off: nothing returned
        before = _resident_bytes()
        assert memory.release() is False
        assert _resident_bytes() > before - 16 * 2**20
        monkeypatch.delenv(memory.ENV)
        assert memory.release() is True
        freed = before - _resident_bytes()
        assert freed > 0.75 * (n // 2) * size, f"only {freed / 2**20:.0f} MiB of 128 MiB returned"
    finally:
        for b in blocks[::2]:
            libc.free(b)
