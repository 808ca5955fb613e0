import io

import numpy as np
import pytest

import bepo_jax as bj
from bepo_jax.cli import main
from bepo_jax.demo import DEMO_GROUPS, run_demo


def test_to_token_advantages():
    adv = np.array([[[1.0, -2.0]]], np.float32)
    rmask = np.array([[[[1, 1, 0], [1, 0, 0]]]], bool)
    tok = np.asarray(bj.to_token_advantages(adv, rmask))
    np.testing.assert_array_equal(tok, [[[[1, 1, 0], [-2, 0, 0]]]])
    np.testing.assert_array_equal(np.asarray(bj.to_token_advantages(adv, rmask.astype(np.float32))), tok)
    with pytest.raises(ValueError, match="expected \\(1, 1, 2\\) \\+ \\[L\\]"):
        bj.to_token_advantages(adv, np.ones((1, 2, 2, 3), bool))
    with pytest.raises(ValueError, match="0/1"):
        bj.to_token_advantages(adv, np.full((1, 1, 2, 3), 0.5))


def test_demo_prints_every_group_and_estimator():
    buf = io.StringIO()
    res = run_demo(out=buf)
    text = buf.getvalue()
    for name in DEMO_GROUPS:
        assert name in text
    assert "GRPO" in text and "GiGPO" in text and "BEPO" in text
    assert np.all(np.asarray(res["gated_bepo"].converged))
    # The useful step inside a failed trajectory ("key" then "pit", group 0, trajectory 1, t=0)
    # gets more credit from Gated-BEPO than the failed trajectory that never found the key.
    adv = np.asarray(res["gated_bepo"].advantage)[0]
    assert adv[1, 0] > adv[2, 0]


def test_cli_demo_and_bad_flags(capsys):
    assert main(["demo", "--lam", "0.0", "--solver", "sparse"]) == 0
    assert "loop that returns to a state" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["demo", "--lam", "3"])
    assert "GatedBEPOConfig.lam=3.0 is out of range" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--solver", "cg"])
    assert "invalid choice" in capsys.readouterr().err
