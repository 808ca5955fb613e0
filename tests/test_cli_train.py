"""The main job through the command line: train, kill + resume, eval, compare, bad flags."""

import json

import numpy as np
import pytest

from bepo_jax.cli import main
from bepo_jax.agent.train import RunConfig, read_metrics, train

TINY = ["--iterations", "4", "--groups", "2", "--group-size", "2", "--max-steps", "3", "--width", "16", "--heads", "2",
        "--eval-tasks", "2", "--eval-every", "2", "--checkpoint-every", "2", "--task-pool", "4", "--quiet"]


def _tiny_config(**kw):
    return RunConfig(iterations=4, groups=2, group_size=2, max_steps=3, width=16, heads=2, eval_tasks=2, eval_every=2,
                     checkpoint_every=2, task_pool=4, **kw)


class Killed(Exception):
    pass


@pytest.mark.slow
def test_train_writes_its_outputs_and_resume_continues_a_killed_run(tmp_path, capsys):
    whole = tmp_path / "whole"
    assert main(["train", "--out", str(whole), *TINY]) == 0
    printed = capsys.readouterr().out
    assert "success rate on 2 training tasks" in printed and "held-out" in printed
    for name in ("config.json", "metrics.jsonl", "curve.png"):
        assert (whole / name).exists(), name
    assert list((whole / "tb").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (whole / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
    rows = read_metrics(whole)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3, 4]
    assert "eval/success_rate" in rows[2] and "eval_train/success_rate" in rows[4]

    # the same run killed during iteration 3 (after its metrics line, before checkpoint 4)
    cut = tmp_path / "cut"

    def kill(it, row):
        if it == 3:
            raise Killed

    with pytest.raises(Killed):
        train(_tiny_config(), cut, progress=False, on_iteration=kill)
    assert [r["iteration"] for r in read_metrics(cut)] == [0, 1, 2, 3]
    with pytest.raises(SystemExit):  # the directory holds a run: refuse to overwrite it
        main(["train", "--out", str(cut), *TINY])
    assert "already holds a run" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a resumed run keeps its config (only --iterations may change)
        main(["train", "--out", str(cut), "--resume", "--quiet", "--width", "32"])
    err = capsys.readouterr().err
    assert "differs from" in err and "['width']" in err
    assert main(["train", "--out", str(cut), "--resume", "--quiet"]) == 0
    resumed = read_metrics(cut)
    assert [r["iteration"] for r in resumed] == [0, 1, 2, 3, 4]
    for a, b in zip(rows, resumed):
        for k in a:
            if k not in ("step_time", "env_steps_per_s"):
                assert a[k] == b[k], f"iteration {a['iteration']} {k}: {a[k]!r} != {b[k]!r} (resume must be exact)"

    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(cut / "checkpoints"), "--tasks", "3"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["iteration"] == 4 and ev["tasks"] == 3 and 0.0 <= ev["success_rate"] <= 1.0


@pytest.mark.slow
def test_compare_writes_a_table_and_a_plot_and_refuses_runs_of_another_config(tmp_path, capsys):
    out = tmp_path / "cmp"
    tiny = [a for a in TINY]
    tiny[tiny.index("--iterations") + 1] = "2"
    assert main(["compare", "--arms", "grpo,lam0=gated_bepo:lam=0", "--seeds", "2", "--out", str(out), *tiny]) == 0
    table = (out / "compare.md").read_text()
    assert "| grpo | grpo |" in table and "| lam0 | gated_bepo (lam=0) |" in table and "+-" in table
    assert (out / "compare.png").exists()
    summary = json.loads((out / "compare.json").read_text())["summary"]
    assert summary["lam0"]["runs"] == 2 and summary["grpo"]["final_success_minus_grpo"][0] == 0.0
    assert len(list((out / "grpo").iterdir())) == 2
    # the per-arm setting reached that arm's runs, and only them (the runs' own config.json)
    assert json.loads((out / "lam0" / "seed1" / "config.json").read_text())["estimator_config"] == {"lam": 0}
    assert json.loads((out / "grpo" / "seed0" / "config.json").read_text())["estimator_config"] == {}
    # the paired column from the runs' own metrics: per seed, lam0's final held-out rate minus grpo's
    diffs = [read_metrics(out / "lam0" / f"seed{s}")[-1]["eval/success_rate"]
             - read_metrics(out / "grpo" / f"seed{s}")[-1]["eval/success_rate"] for s in (0, 1)]
    assert summary["lam0"]["final_success_minus_grpo"][0] == pytest.approx(np.mean(diffs))
    # the same --out with another setting: refused, never the old runs reported under the new one
    capsys.readouterr()
    lr = [*tiny, "--learning-rate", "0.01"]
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--arms", "grpo,lam0=gated_bepo:lam=0", "--seeds", "2", "--out", str(out), *lr])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "holds a finished run whose config differs" in err and "['learning_rate']" in err
    with pytest.raises(SystemExit):  # another estimator setting under an existing label: refused too
        main(["compare", "--arms", "grpo,lam0=gated_bepo:lam=1", "--seeds", "2", "--out", str(out), *tiny])
    assert "['estimator_config']" in capsys.readouterr().err


def test_every_run_config_field_has_a_flag():
    """Each RunConfig field (but env / estimator / estimator_config, which have --env, --estimator
    and --set) is settable from the command line: its flag, given a value other than the default,
    reaches the config."""
    import dataclasses

    from bepo_jax.cli import _run_config, build_parser

    # fields whose values are names: another valid one
    other = {"action_format": "tag", "dtype": "bfloat16", "lora_targets": "q_proj", "model": "smollm2-135m"}
    for f in dataclasses.fields(RunConfig):
        if f.name in ("env", "estimator", "estimator_config"):
            continue
        default = getattr(RunConfig(), f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, bool):
            argv, want = [flag if not default else "--no-" + f.name.replace("_", "-")], not default
        else:
            want = other.get(f.name, type(default)(default * 2 if default else 1))
            argv = [flag, str(want)]
        args = build_parser().parse_args(["train", *argv])
        assert getattr(_run_config(args), f.name) == want, f.name


def test_estimator_config_takes_the_estimators_own_config():
    import bepo_jax as bj

    typed = RunConfig(estimator="gated_bepo", estimator_config=bj.GatedBEPOConfig(lam=0.0, eta_gated=0.25))
    assert typed == RunConfig(estimator="gated_bepo", estimator_config={"lam": 0.0, "eta_gated": 0.25})
    assert json.loads(json.dumps(typed.to_dict()))["estimator_config"] == {"lam": 0.0, "eta_gated": 0.25}
    with pytest.raises(ValueError, match="must be a GiGPOConfig"):
        RunConfig(estimator="gigpo", estimator_config=bj.GatedBEPOConfig())


def test_a_recipe_is_a_whole_config_and_flags_override_it():
    from bepo_jax.cli import _run_config, build_parser
    from bepo_jax.agent.train.recipes import recipe

    args = build_parser().parse_args(["train", "--recipe", "main_job", "--iterations", "3"])
    assert _run_config(args) == recipe("main_job").replace(iterations=3)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--recipe", "nope"])


@pytest.mark.parametrize("argv,message", [
    (["train", "--env", "chess"], "RunConfig.env='chess' is not valid; valid names: sokoban, sokoban_hard, maze"),
    (["train", "--env", "no_such_module:make"], "cannot import 'no_such_module'"),
    (["train", "--env", "json:no_such_factory"], "'json' has no attribute 'no_such_factory'"),
    (["train", "--estimator", "ppo"], "invalid choice: 'ppo'"),
    (["train", "--set", "lamb=0.5"], "lamb"),
    (["train", "--set", "norm=median"], "GatedBEPOConfig.norm='median' is not valid; use one of 'mean', 'mean_std'"),
    (["train", "--heads", "3"], "width=64 must be a multiple of heads=3"),
    (["train", "--groups", "0"], "RunConfig.groups"),
    (["train", "--head-init-scale", "0"], "RunConfig.head_init_scale"),
    (["compare", "--estimators", "grpo,nope"], "unknown estimator 'nope'; valid names: grpo"),
    (["compare", "--arms", "grpo,gated_bepo", "--set", "lam=0"], "does not apply to arm 'grpo'"),
    (["compare", "--arms", "grpo,grpo"], "the labels ['grpo'] appear twice"),
    (["compare", "--arms", "a/b=grpo"], "a label names a directory"),
    (["eval", "--checkpoint", "/nonexistent/run"], "no config.json"),
    (["eval", "--checkpoint", "/nonexistent/run", "--episodes", "4"], "--episodes applies to --games DIR or --game-seeds"),
])
def test_bad_flags_name_the_valid_values(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
