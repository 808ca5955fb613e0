"""The run config in parts (``train.parts``): every field in exactly the parts that read it, stored
configs of earlier runs still load, resume and split, and a run's pieces receive only their part."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from bepo_jax.agent.train import RunConfig
from bepo_jax.agent.train import parts as P

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"


def stored_configs() -> list[tuple[str, dict]]:
    """Every run config the repository keeps: each run directory's config.json under experiments/results
    and every "config" / "recipe" record of a results file that names an env and an estimator."""
    found = [(str(p.relative_to(ROOT)), json.loads(p.read_text())) for p in sorted(RESULTS.rglob("config.json"))]

    def walk(x, where):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("config", "recipe") and isinstance(v, dict) and {"env", "estimator"} <= set(v):
                    found.append((where, v))
                else:
                    walk(v, where)
        elif isinstance(x, list):
            for v in x:
                walk(v, where)

    for p in sorted(RESULTS.rglob("*.json")):
        if p.name != "config.json" and p.stat().st_size < 5_000_000:
            walk(json.loads(p.read_text()), str(p.relative_to(ROOT)))
    return found


def test_every_field_lives_in_the_parts_that_read_it_and_only_the_seed_in_several():
    """A plain count over the dataclasses: each flat field appears in exactly one part (renamed ones by
    RENAMED_IN_PART), the seed in the four that draw from it, and no part holds a field RunConfig lacks."""
    flat = {f.name for f in dataclasses.fields(RunConfig)}
    inverse = {v: k for k, v in P.RENAMED_IN_PART.items()}
    homes: dict[str, list[str]] = {}
    for name, cls in zip(P.RunParts._fields, P.PARTS):
        for f in dataclasses.fields(cls):
            homes.setdefault(inverse.get((name, f.name), f.name), []).append(name)
    assert set(homes) == flat
    assert {k: v for k, v in homes.items() if len(v) > 1} == {"seed": ["env", "policy", "schedule"]}


def test_the_repositorys_stored_configs_load_split_and_join_back():
    found = stored_configs()
    assert len(found) >= 20, "the results hold the configs of many earlier runs"
    for where, d in found:
        cfg = RunConfig.from_stored(d)
        assert RunConfig.from_parts(cfg.parts) == cfg, where
        # every value the file stored is the one its parts hold (estimator_config: as normalised)
        for key, value in d.items():
            if key in ("history", "estimator_config"):
                continue
            if key == "env":
                value = cfg.env  # an import path renamed to a built-in name (envs.registry.RENAMED)
            if key in P.RENAMED_IN_PART:
                part, field = P.RENAMED_IN_PART[key]
                owners = [getattr(cfg.parts, part)]
            else:
                field = key
                owners = [p for p in cfg.parts if field in {f.name for f in dataclasses.fields(p)}]
            assert owners and all(getattr(o, field) == value for o in owners), (where, key)


def test_an_old_run_directory_resumes_with_its_stored_config(tmp_path):
    """A config.json written before the parts (with the old spelling ``history``) is the config a resume
    runs: ``rundir.prepare`` accepts it and hands back the same config."""
    from bepo_jax.agent.train import rundir

    src = next(p for p in sorted(RESULTS.rglob("config.json")))
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(src, run / "config.json")
    stored = json.loads(src.read_text())
    old = dict(stored)
    old["history"] = old.pop("prompt_history")
    (run / "config.json").write_text(json.dumps(old))
    cfg = RunConfig.from_stored(old)
    assert rundir.prepare(cfg, run, resume=True) == RunConfig.from_stored(stored)
    assert json.loads((run / "config.json").read_text()) == RunConfig.from_stored(stored).to_dict()


def test_an_environment_factory_receives_the_env_part_only():
    from bepo_jax.agent.envs.registry import register_env
    from bepo_jax.agent.envs.diagnostic import make_diagnostic
    from bepo_jax.agent.train import Setup

    got = []

    def factory(env):
        got.append(env)
        return make_diagnostic("key_door")

    register_env("parts_probe", factory, overwrite=True)
    cfg = RunConfig(env="parts_probe", max_steps=7, seed=3, groups=2, group_size=2, eval_tasks=2, layers=1,
                    width=16, heads=2)
    Setup(cfg)
    assert got and all(type(g) is P.EnvPart for g in got)
    assert got[0] == P.EnvPart(name="parts_probe", max_steps=7, task_pool=0, boxes=2, rooms=2, objects=3,
                               quest_length=1, seed=3)


@pytest.mark.parametrize("field,value,message", [
    ("temperature", 0.0, "RunConfig.temperature=0.0"), ("group_size", 0, "RunConfig.group_size=0"),
    ("action_format", "xml", "RunConfig.action_format"), ("similarity", 1.5, "RunConfig.similarity=1.5"),
    ("eval_train", 1, "RunConfig.eval_train=1"), ("width", 30, "RunConfig.width=30 must be a multiple of heads=4")])
def test_a_bad_field_is_refused_by_its_part_naming_the_flat_field(field, value, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        RunConfig(**{field: value})


def test_parts_that_disagree_on_the_seed_are_refused():
    parts = RunConfig(seed=1).parts
    with pytest.raises(ValueError, match="disagree on seed"):
        RunConfig.from_parts(parts._replace(schedule=parts.schedule.replace(seed=2)))
