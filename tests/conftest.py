import os

# 8 simulated CPU devices for the multi-device tests; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
