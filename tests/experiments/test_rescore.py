"""experiments/rescore.py: finished runs' final policies scored again on held-out tasks they were never scored on."""

import json

import numpy as np
import pytest

from bepo_jax.agent.train import load_run
from experiments import rescore


# One worker runs this module and the claims smoke test (--dist loadgroup): conftest's e1_smoke runs are
# trained once, not once per worker.
pytestmark = pytest.mark.xdist_group("e1_smoke")


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
def test_rescore_scores_the_scored_tasks_again_and_the_fresh_ones_after_them(e1_smoke, monkeypatch):
    args = ["--experiment", "e1", "--arms", "grpo,gated_bepo", "--seeds", "2", "--iterations", "2", "--tasks", "7",
            "--groups", "2", "--eval-tasks", "4", "--out", str(e1_smoke / "runs"), "--results", str(e1_smoke / "res")]
    info = rescore.main(args)
    recorded = json.loads((e1_smoke / "res" / "e1.json").read_text())["per_seed"]
    assert sorted(info["runs"]) == [f"e1/{a}/seed{s}" for a in ("gated_bepo", "grpo") for s in (0, 1)]
    for arm in ("grpo", "gated_bepo"):
        for s in (0, 1):
            r = info["runs"][f"e1/{arm}/seed{s}"]
            assert r["recorded"] == recorded[arm][s]["held_out_after"]  # the run's own final score
            assert (r["scored_tasks"], r["fresh_tasks"], len(r["per_task"])) == (4, 3, 7)
            assert r["again"] == pytest.approx(np.mean(r["per_task"][:4]))
            assert r["fresh"] == pytest.approx(np.mean(r["per_task"][4:]))
            # each level's content id beside its outcome: the arms of a seed share the seed's 7 distinct levels
            assert len(set(r["task_ids"])) == 7 and r["task_ids"] == info["runs"][f"e1/grpo/seed{s}"]["task_ids"]
    assert not set(info["runs"]["e1/grpo/seed0"]["task_ids"]) & set(info["runs"]["e1/grpo/seed1"]["task_ids"])
    # the evaluation is the run's final policy on its seed's first 7 held-out levels, with the rescoring key
    setup, state, it = load_run(e1_smoke / "runs" / "e1" / "grpo" / "seed1")
    ev = setup.evaluate(state.params, n_tasks=7, seed=rescore.RESCORE_KEY + 1)
    assert it == 2 and ev["per_task"] == info["runs"]["e1/grpo/seed1"]["per_task"]
    # e1 has no contrasts of its own: each arm minus the reference, paired per seed
    (name,) = info["summary"]["contrasts"]
    assert name == "grpo - gated_bepo"
    g = info["summary"]["contrasts"][name]["e1"]
    d = [info["runs"][f"e1/grpo/seed{s}"]["fresh"] - info["runs"][f"e1/gated_bepo/seed{s}"]["fresh"] for s in (0, 1)]
    assert g["seeds"] == 2 and g["fresh"][0] == pytest.approx(np.mean(d))
    assert g["fresh_seeds_above_0"] == sum(x > 0 for x in d)
    noise = [r["recorded"] - r["again"] for r in info["runs"].values()]
    assert info["summary"]["sampling_noise"]["sigma_sample"] == pytest.approx(np.std(noise, ddof=1) / np.sqrt(2))
    # the held-out tasks' noise: the per-task paired differences' variance over a seed's 7 tasks, over 4 or 3
    per_task = lambda arm, s: np.asarray(info["runs"][f"e1/{arm}/seed{s}"]["per_task"])
    v = np.mean([np.var(per_task("grpo", s) - per_task("gated_bepo", s), ddof=1) for s in (0, 1)])
    assert (g["sd_tasks_recorded"], g["sd_tasks_fresh"]) == pytest.approx((np.sqrt(v / 4), np.sqrt(v / 3)))
    assert g["sd_fresh"] == pytest.approx(np.std(d, ddof=1))
    md = (e1_smoke / "res" / "e1_rescore.md").read_text()
    assert "| grpo - gated_bepo | 0-1 (e1) |" in md and "SD from the held-out tasks alone" in md
    # resumable: finished evaluations are read back, not repeated
    monkeypatch.setattr(rescore, "rescore_run", lambda *a, **k: pytest.fail("evaluated again"))
    assert rescore.main(args)["runs"] == info["runs"]
    # and never overwritten by another rescoring under the same name
    with pytest.raises(SystemExit, match="holds another rescoring"):
        rescore.main([*args[:args.index("--tasks") + 1], "6", *args[args.index("--tasks") + 2:]])
    assert json.loads((e1_smoke / "res" / "e1_rescore.json").read_text())["runs"] == info["runs"]


@pytest.mark.slow  # needs the trained runs (the fixture): CI=1 runs it
def test_rescore_refuses_a_run_it_did_not_ask_for(e1_smoke):
    base = ["--experiment", "e1", "--arms", "grpo,gated_bepo", "--seeds", "2", "--iterations", "2",
            "--out", str(e1_smoke / "runs"), "--results", str(e1_smoke / "other"), "--groups", "2", "--eval-tasks", "4"]
    with pytest.raises(SystemExit, match="must exceed the 4 held-out tasks"):
        rescore.main([*base, "--tasks", "4"])
    with pytest.raises(SystemExit, match="not a finished run of 3 iterations"):
        rescore.main([*base[:7], "3", *base[8:], "--tasks", "6"])
    with pytest.raises(SystemExit, match=r"differs from the one asked for in \['groups'\]"):  # not the arm's runs
        rescore.main([*base[:-4], "--eval-tasks", "4", "--tasks", "6"])


def test_rescore_refuses_what_it_cannot_measure(tmp_path):
    base = ["--experiment", "e1", "--arms", "grpo,gated_bepo", "--seeds", "2", "--iterations", "2",
            "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "other"), "--groups", "2",
            "--eval-tasks", "4"]
    with pytest.raises(SystemExit, match="--arms"):
        rescore.main([*base[:2], "--arms", "grpo,nope", *base[4:]])
    with pytest.raises(SystemExit, match="their base configs differ"):
        rescore.main(["--experiment", "e1,e2"])
    with pytest.raises(SystemExit, match="'grpo-gigpo' must be 'arm-arm'"):
        rescore.main([*base, "--contrasts", "grpo-gigpo"])
    assert not (tmp_path / "other").exists()  # refused before anything was written
    # fresh tasks must follow the scored ones: a pool that does not begin with them is told apart
    a, b = np.arange(12).reshape(6, 2), np.arange(8).reshape(4, 2)
    assert rescore.begins_with({"x": a}, {"x": b}, 4) and not rescore.begins_with({"x": a}, {"x": b + 1}, 4)
    assert rescore.begins_with(["g0", "g1", "g2"], ["g0", "g1"], 2) and not rescore.begins_with(["g1"], ["g0"], 1)
