import os

from hypothesis import HealthCheck, settings


# XLA_FLAGS, JAX_PLATFORMS and the persistent compilation cache: the repository's conftest.py.

settings.register_profile(
    "default",
    deadline=None,
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
    print_blob=True,
)
# CI (.ci/run sets CI=1): more examples per property (25 against 15). Shapes and config structures are
# fixed per test, so the extra examples reuse the compiled kernels and cost little.
settings.register_profile("ci", parent=settings.get_profile("default"), max_examples=25, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


# XLA:CPU maps every compiled program into the process's memory (hundreds of mappings
# each); a long-lived test worker that compiles many shapes reaches the kernel's
# vm.max_map_count (65530 by default) and the next compile aborts with "LLVM compilation
# error: Cannot allocate memory". Drop the compiled programs before that happens.
_MAPS = "/proc/self/maps"
_MAX_MAPS = 30_000


def _map_count() -> int:
    try:
        with open(_MAPS, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def pytest_runtest_teardown(item, nextitem):
    if _map_count() > _MAX_MAPS:
        import jax

        jax.clear_caches()
