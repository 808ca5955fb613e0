"""bepo_jax against its rivals' official code, vendored unchanged under its license
(tests/fixtures/official/README.md) and run under torch: verl-agent's GiGPO through the verl
drop-in, G2PO's and ProxMO's authors' advantage functions against ``bepo_jax.g2po`` and
``bepo_jax.proxmo``. Runs where torch installs (``make test-verl``); the full-size comparisons
are ``experiments/{verl,g2po,proxmo}_official.py``."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

OFFICIAL = Path(__file__).resolve().parents[1] / "fixtures" / "official"


def test_verl_agents_own_gigpo_equals_the_drop_in():
    from experiments.verl_official import _official, agreement

    official = _official(str(OFFICIAL / "verl_agent" / "core_gigpo.py"))
    out = agreement(official, seed=3)
    assert {(r["mode"], r["similarity"]) for r in out} == {(m, s) for m in ("mean_norm", "mean_std_norm")
                                                          for s in (None, 0.9)}
    assert sum(r["rows"] for r in out) > 2000 and any(r["single_row_groups"] for r in out)
    for r in out:
        assert r["max_abs_diff"] <= 1e-5 * r["scale"], r


def test_the_g2po_authors_code_equals_g2po():
    from experiments.g2po_official import compare

    worst, runs = compare(str(OFFICIAL / "g2po" / "core_g2po.py"), sys.executable, seeds=4)
    assert set(worst) == {"mean_norm", "mean_std_norm"} and sum(r["rows"] for r in runs) > 100
    scale = max(1.0, max(r["max_abs_advantage"] for r in runs))
    assert max(worst.values()) <= 1e-5 * scale, worst


def test_the_proxmo_authors_code_equals_proxmo():
    from experiments.proxmo_official import compare

    worst, runs = compare(str(OFFICIAL / "proxmo" / "core_proxmo.py"), sys.executable, seeds=4)
    assert len(worst) == 6 and any(r["words"] for r in runs) and any(not r["words"] for r in runs)
    scale = max(1.0, max(r["max_abs_advantage"] for r in runs))
    assert max(worst.values()) <= 1e-5 * scale, worst
