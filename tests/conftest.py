import os

# 8 simulated CPU devices for the multi-device tests; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A persistent compilation cache shared by the test workers, the subprocesses the tests start and
# later runs (the Makefile points the notebooks at the same place): a program that several tests
# compile is compiled once. One directory per interpreter (the keys hold the JAX version anyway).
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".jax_cache"
                                                       / f"py{sys.version_info[0]}{sys.version_info[1]}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

from hypothesis import HealthCheck, settings  # noqa: E402

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
