"""The LLM memory benchmark's exactness check and its baseline checkout, on made-up reports."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from experiments import bench_llm_memory as bench
from experiments.common import ROOT, checkout


def _report(**metric):
    m = {"success_rate": 0.25, "loss": 0.1, "rollout/decode_s": 40.0, "rollout/compiles": 7.0, **metric}
    return {"metrics": [m, dict(m)], "evaluation": {"success_rate": 0.5, "per_task": [0.5, 0.5]},
            "phases": [{"phase": "setup", "seconds": 3.0, "peak_gib": 1.0, "end_gib": 1.0, "live_gib": 0.6}],
            "sequence_length": 536}


def test_a_variant_that_computes_anything_else_is_named_and_timings_are_not():
    ref = _report()
    assert bench.differences(ref, _report(**{"rollout/decode_s": 55.0, "rollout/compiles": 9.0})) == []
    changed = _report(loss=0.1000001)
    changed["evaluation"]["per_task"] = [0.5, 0.25]
    assert bench.differences(ref, changed) == ["iteration 1: loss", "iteration 2: loss", "evaluation: per-game success"]
    res = {"command": "python -m experiments.bench_llm_memory", "commit": "abc", "recipe": bench.RECIPE, "groups": 4,
           "iterations": 2, "eval_games": 48, "machine": {"platform": "linux", "cpu_count": 2, "jax": "0.10.2"},
           "variants": [{"variant": "before", **ref}, {"variant": "now", **changed, "differs_from_first":
                                                          bench.differences(ref, changed)},
                        {"variant": "killed", "failed": -9}],
           "update": [{"grad_accum": ga, "length": n, "temp_gib": ga * n / 1000, "argument_gib": 0.4}
                      for ga in (8, 4) for n in (1048, 536)]}
    text = "\n".join(bench.render(res))
    assert "now: highest peak 1.00 GiB" in text and "DIFFERENT numbers: iteration 1: loss" in text
    assert "| killed | failed (exit -9) |" in text
    # the update's table: rows by grad_accum, columns by length, each cell its own record's
    assert "| grad_accum | L = 536 | L = 1048 |" in text
    assert "| 4 | 2.14 | 4.19 |" in text and "| 8 | 4.29 | 8.38 |" in text


def test_the_baseline_runs_from_a_worktree_of_the_commit_that_is_removed_after():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    with checkout("HEAD") as tree:
        assert (tree / "bepo_jax" / "agent").is_dir()
        got = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True)
        assert got.stdout == head
    assert not tree.exists() and not tree.parent.exists()
