"""Set before JAX starts, for every pytest run from the repository: the tests (tests/conftest.py
holds their hypothesis profiles) and the notebooks (nbmake in `make test-notebooks` and CI; each notebook's
kernel inherits this environment)."""

import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# 8 simulated CPU devices for the multi-device tests and notebook 03.
# XLA:CPU's LLVM backend at its lowest optimisation level: the tests compile hundreds of small
# programs and run each a few times, so compiling is most of their time, and this takes about a
# third off it (a hypothesis kernel test 29 -> 19 s of CPU, three training tests 77 -> 47 s). The
# tests compare these programs' numbers with tolerances against independent references, or two
# runs under the same flags with each other. BEPO_TEST_FULL_OPT=1 tests the code as users compile it.
FAST_CODEGEN = ("" if os.environ.get("BEPO_TEST_FULL_OPT") else
                " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")


def _jaxlib_minor() -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in version("jaxlib").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return ()


# JAX 0.10's XLA:CPU also has the older elemental emitters for fusions: compiling with them takes
# about half the time (an HGPO kernel 3.5 -> 1.8 s, a Gated-BEPO kernel 2.5 -> 0.9 s; make test's
# tests 1,140 -> 698 s on one worker, docs/benchmarks.md). XLA aborts the process on a flag it
# does not know, and the 3.12 lock's JAX (0.12) no longer has this one: 0.10 only.
if FAST_CODEGEN and _jaxlib_minor() == (0, 10):
    FAST_CODEGEN += " --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8" + FAST_CODEGEN)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A persistent compilation cache shared by the test workers, the notebooks' kernels, the
# subprocesses the tests start and later runs: a program that several tests compile is compiled
# once. One directory per interpreter (the keys hold the JAX version and the flags anyway).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parent / ".jax_cache"
                                                       / f"py{sys.version_info[0]}{sys.version_info[1]}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# pytest collects the package's docstring examples too (--doctest-modules, pyproject.toml): every module is imported
# for that, but a script is not a module to import (the multi-host worker runs on import), and the Tunix
# adapter needs google-tunix (Python 3.12's lock only).
collect_ignore = ["tests/agent/multihost_worker.py", "tests/fixtures"]  # the fixtures' generator needs torch
try:
    import tunix  # noqa: F401
except ImportError:
    collect_ignore.append("bepo_jax/integrations/tunix")
