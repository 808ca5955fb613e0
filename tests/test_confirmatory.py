"""experiments/confirmatory.py: the protocol's fixed pieces, its statistics, and the run -> rescore -> report chain."""

import json
import math

import numpy as np
import pytest

from experiments import claims, confirmatory as cf
from experiments.readme_tables import size_verdict


def test_the_protocol_is_fixed_in_code():
    exp = claims.EXPERIMENTS["confirmatory_runs"]
    assert [a.label for a in exp.arms] == ["gated_bepo", "grpo", "gigpo", "ladder_fp_added", "hgpo", "bepo_additive"]
    assert (exp.seeds, exp.first_seed, exp.iterations, exp.eval_every) == (16, 100, 60, 30)
    assert exp.base == claims.MAIN_JOB  # the recipe as it is
    # fresh seeds: no other experiment's seeds reach 100
    others = [e for n, e in claims.EXPERIMENTS.items() if n != "confirmatory_runs"]
    assert max(max(e.seed_ids(e.seeds)) for e in others) < min(exp.seed_ids(exp.seeds))
    assert [c.name for c in claims.CONFIRMATORY_PRIMARY] == [
        "gated_bepo - gigpo", "gated_bepo - ladder_fp_added", "gated_bepo - grpo", "gated_bepo - hgpo"]
    ladder = {a.label: a for a in claims.ESTIMATOR_ARMS}["ladder_fp_added"]
    assert (ladder.estimator, ladder.config) == ("bepo_nogate", {"eta_gated": 1.0})


def test_holm_matches_the_textbook_procedure():
    # sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2: the first two rejected, then stop
    p = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005}
    h = cf.holm(p)
    assert {k: v["rejected"] for k, v in h.items()} == {"d": True, "a": True, "c": False, "b": False}
    assert {k: round(v["holm_p"], 6) for k, v in h.items()} == {"d": 0.02, "a": 0.03, "c": 0.06, "b": 0.06}
    # step-down stops at the first acceptance even if a later p would pass its own threshold
    assert not cf.holm({"x": 0.2, "y": 0.011, "z": 0.012})["x"]["rejected"]
    assert cf.decision({"mean": -2.0}, {"rejected": True}) == "contradicted"
    assert cf.decision({"mean": 2.0}, {"rejected": False}) == "not confirmed"


def test_paired_test_is_the_t_interval_and_the_t_test():
    x = np.array([3.0, -1.0, 4.0, 2.5, 0.5, 6.0])
    t = cf.paired_test(x)
    n, m, sd = len(x), x.mean(), x.std(ddof=1)
    half = 2.570581835636314 * sd / math.sqrt(n)  # t_{0.975, 5}
    tstat = m / (sd / math.sqrt(n))
    assert t["mean"] == pytest.approx(m) and t["half_width"] == pytest.approx(half)
    assert tstat == pytest.approx(2.4594, abs=1e-3)
    assert 0.05 < t["p"] < 0.1 and t["seeds_above_0"] == 5


def test_size_verdicts():
    assert size_verdict((6.2, 2.1), 13.4) == "smaller than the paper's"
    assert size_verdict((6.2, 2.1), 7.0) == "the paper's size"
    assert size_verdict((-4.0, 2.0), 7.4) == "opposite"
    assert size_verdict((-1.0, 2.0), 7.4) == "smaller than the paper's"  # includes 0: not opposite
    assert size_verdict((7.0, 2.4), 3.9) == "larger than the paper's"
    assert size_verdict((1.0, 3.2), None) == "no paper number"


@pytest.mark.slow
def test_run_rescore_report_chain(tmp_path):
    out, res = tmp_path / "runs", tmp_path / "res"
    common = ["--smoke", "--arms", "gated_bepo,grpo", "--out", str(out), "--results", str(res)]
    with pytest.raises(SystemExit, match="--smoke writes elsewhere"):
        cf.main(["run", "--smoke", "--arms", "grpo"])
    cf.main(["run", *common])
    cf.main(["rescore", *common])
    cf.main(["report", "--out", str(out), "--results", str(res)])
    summary = json.loads((res / "confirmatory.json").read_text())
    rescored = json.loads((res / "confirmatory_rescore.json").read_text())["runs"]
    d = [100 * (rescored[f"confirmatory_runs/gated_bepo/seed{s}"]["fresh"] -
                rescored[f"confirmatory_runs/grpo/seed{s}"]["fresh"]) for s in (100, 101)]
    got = summary["contrasts"]["gated_bepo - grpo"]["fresh_512"]
    assert got["mean"] == pytest.approx(np.mean(d)) and got["seeds"] == 2
    assert not summary["family_complete"] and "holm" not in summary["contrasts"]["gated_bepo - grpo"]
    events = [json.loads(x) for x in (out / "confirmatory_runs" / "log.jsonl").read_text().splitlines()]
    assert [(e["event"], e["arm"]) for e in events] == [("start", "gated_bepo"), ("finish", "gated_bepo"),
                                                        ("start", "grpo"), ("finish", "grpo")]
    md = (res / "confirmatory.md").read_text()
    assert "The family is not complete yet" in md and "start gated_bepo" in md
    assert set(summary["gated_share"]) == {"gated_bepo"}  # GRPO builds no graph
    assert (res / "confirmatory.png").exists()
