"""experiments/claims.py end to end at smoke size: two arms x two seeds x two iterations."""

import json

import pytest

from experiments import claims


def test_claims_smoke_writes_results_and_resumes(tmp_path):
    args = ["--experiment", "e1", "--arms", "grpo,gated_bepo", "--seeds", "2", "--iterations", "2", "--groups", "2",
            "--eval-tasks", "4", "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "res"), "--quiet"]
    summary = claims.main(args)
    info = json.loads((tmp_path / "res" / "e1.json").read_text())
    assert set(info["per_seed"]) == {"grpo", "gated_bepo"} and info["pending"] == []
    assert all(len(v) == 2 for v in info["per_seed"].values())
    s = summary["grpo"]
    assert s["seeds"] == 2 and "held_out_after_minus_gated_bepo" in s
    assert s["held_out_after_verdict"] in ("higher", "lower", "not separated")
    # the paired difference is the mean of the per-seed differences
    ps = info["per_seed"]
    d = [a["held_out_after"] - b["held_out_after"] for a, b in zip(ps["grpo"], ps["gated_bepo"])]
    assert s["held_out_after_minus_gated_bepo"][0] == pytest.approx(sum(d) / 2)
    # per iteration: the sampled actions' entropy and top share; collapsed = seeds above 90% somewhere
    for x in ps["grpo"]:
        assert len(x["action_entropy"]) == len(x["top_action_share"]) == 2
        assert all(0.25 <= t <= 1.0 for t in x["top_action_share"])  # 4 action words
    assert s["collapsed"] == sum(max(x["top_action_share"]) > 0.9 for x in ps["grpo"])
    md = (tmp_path / "res" / "e1.md").read_text()
    assert "| grpo | grpo |" in md and "| gated_bepo | gated_bepo |" in md and "reference" in md
    assert (tmp_path / "res" / "e1.png").stat().st_size > 0
    # finished runs are read, not re-run
    metrics = tmp_path / "runs" / "e1" / "grpo" / "seed0" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    claims.main(args)
    assert metrics.stat().st_mtime_ns == before


def test_claims_refuses_unknown_arms(tmp_path):
    with pytest.raises(SystemExit, match="unknown arm"):
        claims.main(["--experiment", "e1", "--arms", "gated-bepo", "--out", str(tmp_path)])
