"""experiments/claims.py end to end at smoke size: two arms x two seeds x two iterations."""

import dataclasses
import json
import re
import shlex
import shutil

import numpy as np
import pytest
from scipy import stats

from bepo_jax.cli import _run_config, build_parser
from experiments import claims, formatting

from tests.experiments.conftest import E1_SMOKE


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
@pytest.mark.xdist_group("e1_smoke")  # the worker that trains conftest's e1_smoke runs
def test_claims_smoke_writes_results_and_resumes(tmp_path, e1_smoke):
    # the runs claims.main trains with these arguments (conftest's e1_smoke), copied: this test deletes one arm's
    shutil.copytree(e1_smoke / "runs", tmp_path / "runs")
    args = [*E1_SMOKE, "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "res"), "--quiet"]
    summary = claims.main(args)
    info = json.loads((tmp_path / "res" / "e1.json").read_text())
    assert set(info["per_seed"]) == {"grpo", "gated_bepo"}
    # the experiment's other arms are listed as not run yet
    assert info["pending"] == [a.label for a in claims.ESTIMATOR_ARMS if a.label not in ("grpo", "gated_bepo")]
    assert all(len(v) == 2 for v in info["per_seed"].values())
    s = summary["grpo"]
    assert s["seeds"] == 2 and "held_out_after_minus_gated_bepo" in s
    assert s["held_out_after_verdict"] in ("higher", "lower", "not separated")
    # the paired difference is the mean of the per-seed differences
    ps = info["per_seed"]
    d = [a["held_out_after"] - b["held_out_after"] for a, b in zip(ps["grpo"], ps["gated_bepo"])]
    assert s["held_out_after_minus_gated_bepo"][0] == pytest.approx(sum(d) / 2)
    # ... at every evaluation: 0 at iteration 0 (the arms share each seed's initial policy and tasks),
    # the last one equal to the final difference, and the report's second table shows them
    by_eval = s["held_out_minus_gated_bepo_by_eval"]
    assert [it for it, *_ in by_eval] == [0, 2] and by_eval[0][1:] == [0.0, 0.0]
    assert by_eval[-1][1:] == pytest.approx(list(s["held_out_after_minus_gated_bepo"]))
    assert [it for it, *_ in s["train_minus_gated_bepo_by_eval"]] == [0, 2]
    assert "gated_bepo_by_eval" not in str(summary["gated_bepo"])
    # per iteration: the sampled actions' entropy and top share; collapsed = seeds above 90% somewhere
    for x in ps["grpo"]:
        assert len(x["action_entropy"]) == len(x["top_action_share"]) == 2
        assert all(0.25 <= t <= 1.0 for t in x["top_action_share"])  # 4 action words
    assert s["collapsed"] == sum(max(x["top_action_share"]) > 0.9 for x in ps["grpo"])
    md = (tmp_path / "res" / "e1.md").read_text()
    assert "| grpo | grpo |" in md and "| gated_bepo | gated_bepo |" in md and "reference" in md
    m, h = by_eval[-1][1:]
    assert f"| grpo | +0.0 +- 0.0 | {100 * m:+.1f}" + ("" if h != h else f" +- {100 * h:.1f}") in md
    assert (tmp_path / "res" / "e1.png").stat().st_size > 0
    # finished runs are read, not re-run
    metrics = tmp_path / "runs" / "e1" / "grpo" / "seed0" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    claims.main(args)
    assert metrics.stat().st_mtime_ns == before
    # ... but never in place of another config's: the same --out with 8 held-out tasks is refused, naming the field
    more = [*args[:args.index("--eval-tasks") + 1], "8", *args[args.index("--eval-tasks") + 2:]]
    with pytest.raises(SystemExit, match=r"differs from the one asked for in \['eval_tasks'\]"):
        claims.main([*more, "--report-only"])
    assert metrics.stat().st_mtime_ns == before
    # a checkout without gated_bepo's run directories: its numbers come from the results file's earlier
    # version, and a run of another arm adds to the report instead of replacing it
    shutil.rmtree(tmp_path / "runs" / "e1" / "gated_bepo")
    claims.main([*args[:2], "--arms", "grpo", *args[4:]])
    again = json.loads((tmp_path / "res" / "e1.json").read_text())
    assert again["per_seed"] == info["per_seed"] and again["read_from_earlier_results"] == ["gated_bepo"]
    assert "earlier version" in (tmp_path / "res" / "e1.md").read_text()


def test_earlier_results_are_kept_only_when_they_measure_the_same_thing(tmp_path):
    exp = claims.EXPERIMENTS["e1"]
    base = claims.RunConfig(**exp.base, iterations=2, eval_every=2, checkpoint_every=2)
    arms = {a.label: claims.arm_record(a) for a in exp.arms}
    info = dict(config=json.loads(json.dumps(base.to_dict())), seeds=2, scale="cpu", arms=arms,
                per_seed={"grpo": [{"held_out_after": 0.5}], "gated_bepo": [{"held_out_after": 0.25}]})
    path = tmp_path / "e1.json"
    path.write_text(json.dumps(info))
    assert list(claims.earlier_arms(path, exp, base, 2, "cpu")) == ["grpo", "gated_bepo"]
    assert claims.earlier_arms(path, exp, base.replace(iterations=3), 2, "cpu") == {}
    assert claims.earlier_arms(path, exp, base, 3, "cpu") == {}
    assert claims.earlier_arms(path, exp, base, 2, "gpu") == {}
    info["arms"]["grpo"] = dict(arms["grpo"], config={"lam": 0.5})  # the arm was defined differently then
    path.write_text(json.dumps(info))
    assert list(claims.earlier_arms(path, exp, base, 2, "cpu")) == ["gated_bepo"]
    assert claims.earlier_arms(tmp_path / "missing.json", exp, base, 2, "cpu") == {}


def test_contrasts_combine_arms_seed_by_seed():
    """A contrast is the per-seed weighted sum of its arms (recipe_ablation's gap change: a difference of two
    paired differences), at the end and at every evaluation; a contrast with an arm not run is left out."""
    rng = np.random.default_rng(0)

    def arm(shift):
        out = []
        for _ in range(5):
            a, b = rng.uniform(0, 1, 2)
            out.append(dict(held_out_before=0.3, train_before=0.3, held_out_after=a + shift, train_after=b,
                            curve=[[0, 0.0, 0.3, 0.3], [6, 9.0, a + shift, b]], top_action_share=[0.5]))
        return out

    per_arm = {label: arm(i / 10) for i, label in enumerate(
        ("grpo", "gated_bepo", "grpo_groups_8", "gated_bepo_groups_8"))}
    out = claims.contrast_summary(per_arm, claims.RECIPE_GAPS)
    assert set(out) == {"gated_bepo - grpo", "gated_bepo_groups_8 - grpo_groups_8", "gap change, groups_8",
                        "grpo_groups_8 - grpo", "gated_bepo_groups_8 - gated_bepo"}
    v = lambda label, k="held_out_after": np.array([x[k] for x in per_arm[label]])
    gap = v("gated_bepo_groups_8") - v("grpo_groups_8") - (v("gated_bepo") - v("grpo"))
    c = out["gap change, groups_8"]
    t_ci = lambda x: (x.mean(), stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))  # by hand
    assert c["held_out"] == pytest.approx(t_ci(gap)) and c["seeds"] == 5
    assert c["held_out_seeds_above_0"] == int((gap > 0).sum())
    m, h = t_ci(gap)
    assert c["held_out_verdict"] == ("not separated" if abs(m) <= h else "higher" if m > 0 else "lower")
    assert c["held_out_by_eval"][0][1:] == [0.0, 0.0] and c["held_out_by_eval"][-1][1:] == pytest.approx(c["held_out"])
    tgap = v("gated_bepo", "train_after") - v("grpo", "train_after")
    assert out["gated_bepo - grpo"]["train"] == pytest.approx(t_ci(tgap))
    # the same pairing as the main table's difference from the reference
    ref = claims.summarize(per_arm, "gated_bepo")["grpo"]["held_out_after_minus_gated_bepo"]
    assert out["gated_bepo - grpo"]["held_out"] == pytest.approx((-ref[0], ref[1]))
    lines = claims.contrast_lines(out, ["gap change, pool_32"])
    assert any(line.startswith("| gap change, groups_8 | " + formatting.points(c["held_out"])) for line in lines)
    assert lines[-1] == "Contrasts waiting for arms not run yet: gap change, pool_32."
    # a contrast naming an arm the experiment does not have is refused where it is defined
    with pytest.raises(ValueError, match="gated-bepo"):
        claims.Experiment("x", {}, claims.ESTIMATOR_ARMS, "gated_bepo", seeds=2, iterations=2, eval_every=2,
                          contrasts=(claims.Contrast.minus("gated-bepo", "grpo"),))


def test_claims_refuses_unknown_arms(tmp_path):
    with pytest.raises(SystemExit, match="unknown arm"):
        claims.main(["--experiment", "e1", "--arms", "gated-bepo", "--out", str(tmp_path)])


def test_make_train_runs_the_main_job_recipe():
    """`make train` runs the recipe the main_recipe experiment tested (``claims.MAIN_JOB``, read from
    ``bepo_jax.agent.train.recipes``), with the Makefile's own flags parsed as the command line parses them."""
    makefile = (claims.ROOT / "Makefile").read_text().replace("\\\n", " ")
    flags = shlex.split(re.search(r"^MAIN_JOB_FLAGS\s*:=(.*)$", makefile, re.M).group(1))
    args = build_parser().parse_args(["train", *flags])
    exp = claims.EXPERIMENTS["main_recipe"]
    want = claims.RunConfig(**exp.base, iterations=exp.iterations, eval_every=exp.eval_every)
    assert _run_config(args, estimator=args.estimator) == want


def test_recipe_arms_are_shared_across_experiments():
    """e1_recipe's gated_bepo arm is main_recipe's recipe arm (so copying those run directories reads them
    instead of training them again): the same config, seed for seed; and an arm that differs is told apart."""
    def cfg(name, label):
        exp = claims.EXPERIMENTS[name]
        arm = next(a for a in exp.arms if a.label == label)
        return claims.arm_config(claims.base_config(exp, claims.SCALES["cpu"], exp.iterations), arm), exp.seeds

    assert cfg("e1_recipe", "gated_bepo") == cfg("main_recipe", "recipe")
    assert cfg("e1_recipe", "grpo")[0] != cfg("main_recipe", "recipe")[0]
    # recipe_ablation's recipe arms are e1_recipe's; each revert changes only its own fields
    for label in ("grpo", "gated_bepo"):
        assert cfg("recipe_ablation", label) == cfg("e1_recipe", label)
        for name, run in claims.RECIPE_REVERTS.items():
            reverted, recipe = cfg("recipe_ablation", f"{label}_{name}")[0], cfg("e1_recipe", label)[0]
            changed = {k for k, v in reverted.to_dict().items() if recipe.to_dict()[k] != v}
            assert changed == set(run) and reverted == recipe.replace(**run)


@pytest.mark.slow  # an experiment end to end (tens of seconds): make test skips it, CI=1 runs it
def test_fresh_seeds_run_under_their_own_numbers(tmp_path, monkeypatch):
    """An experiment with ``first_seed`` trains and reads seeds first_seed, ... (its run directories and
    configs say so), and results written for other seed numbers are not read as its own."""
    exp = dataclasses.replace(claims.EXPERIMENTS["e1"], first_seed=3)
    monkeypatch.setitem(claims.EXPERIMENTS, "e1_fresh", exp)
    args = ["--experiment", "e1_fresh", "--arms", "grpo", "--seeds", "2", "--iterations", "1", "--groups", "2",
            "--eval-tasks", "2", "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "res"), "--quiet"]
    claims.main(args)
    runs = tmp_path / "runs" / "e1_fresh" / "grpo"
    assert sorted(p.name for p in runs.iterdir()) == ["seed3", "seed4"]
    assert [json.loads((runs / f"seed{s}" / "config.json").read_text())["seed"] for s in (3, 4)] == [3, 4]
    info = json.loads((tmp_path / "res" / "e1_fresh.json").read_text())
    assert info["first_seed"] == 3 and len(info["per_seed"]["grpo"]) == 2
    assert "2 seeds per arm (seeds 3-4, one program per arm)" in (tmp_path / "res" / "e1_fresh.md").read_text()
    base = claims.base_config(exp, {"groups": 2, "eval_tasks": 2}, 1)
    assert list(claims.earlier_arms(tmp_path / "res" / "e1_fresh.json", exp, base, 2, "cpu")) == ["grpo"]
    assert claims.earlier_arms(tmp_path / "res" / "e1_fresh.json", dataclasses.replace(exp, first_seed=0), base, 2,
                               "cpu") == {}
    with pytest.raises(ValueError, match="first_seed"):
        dataclasses.replace(exp, first_seed=-1)


def test_e2_confirm_repeats_e2_on_seeds_e2_did_not_use():
    e2, confirm = claims.EXPERIMENTS["e2"], claims.EXPERIMENTS["e2_confirm"]
    assert confirm.base == e2.base and (confirm.iterations, confirm.eval_every) == (e2.iterations, e2.eval_every)
    arms = {a.label: a for a in e2.arms}
    assert all(arms[a.label] == a for a in confirm.arms)
    assert not set(confirm.seed_ids(confirm.seeds)) & set(e2.seed_ids(e2.seeds))
    assert {c.name for c in confirm.contrasts} == {"gated_bepo - hgpo", "graphgpo - gigpo"}
