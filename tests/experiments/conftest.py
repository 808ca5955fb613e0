"""Fixtures of the experiments' tests (only these tests import ``experiments``)."""

import pytest

# e1's grpo and gated_bepo at smoke size, as claims.py trains them (conftest's e1_smoke fixture): the claims
# smoke test and the rescore tests read these runs (one training instead of two identical ones).
E1_SMOKE = ["--experiment", "e1", "--arms", "grpo,gated_bepo", "--seeds", "2", "--iterations", "2", "--groups", "2",
            "--eval-tasks", "4"]


@pytest.fixture(scope="session")
def e1_smoke(tmp_path_factory):
    """``E1_SMOKE`` trained by ``claims.main`` into ``<dir>/runs`` (results in ``<dir>/res``), once per
    test worker: tests that use it carry ``xdist_group("e1_smoke")`` so that one worker trains it. Its runs
    are shared: copy them where a test changes them."""
    from experiments import claims

    tmp = tmp_path_factory.mktemp("e1_smoke")
    claims.main([*E1_SMOKE, "--out", str(tmp / "runs"), "--results", str(tmp / "res"), "--quiet"])
    return tmp
