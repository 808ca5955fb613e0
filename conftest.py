"""Set before JAX starts, for every pytest run from the repository: the tests (tests/conftest.py
holds their hypothesis profiles) and the notebooks (`make test`'s nbmake step; each notebook's
kernel inherits this environment)."""

import os
import sys
from pathlib import Path

# 8 simulated CPU devices for the multi-device tests and notebook 03.
# XLA:CPU's LLVM backend at its lowest optimisation level: the tests compile hundreds of small
# programs and run each a few times, so compiling is most of their time, and this takes about a
# third off it (a hypothesis kernel test 29 -> 19 s of CPU, three training tests 77 -> 47 s). The
# tests compare these programs' numbers with tolerances against independent references, or two
# runs under the same flags with each other. BEPO_TEST_FULL_OPT=1 tests the code as users compile it.
FAST_CODEGEN = ("" if os.environ.get("BEPO_TEST_FULL_OPT") else
                " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8" + FAST_CODEGEN)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A persistent compilation cache shared by the test workers, the notebooks' kernels, the
# subprocesses the tests start and later runs: a program that several tests compile is compiled
# once. One directory per interpreter (the keys hold the JAX version and the flags anyway).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parent / ".jax_cache"
                                                       / f"py{sys.version_info[0]}{sys.version_info[1]}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
