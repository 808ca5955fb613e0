"""Bring your own environment: the README's key-and-door example trains through
``train(..., env=...)``, a registered name and the CLI's import path."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bepo_jax.cli import main
from bepo_jax.agent.envs import register_env
from bepo_jax.agent.envs.base import env_reset, env_step
from bepo_jax.agent.train import RunConfig, read_metrics, train
from examples.key_door import KeyDoorEnv, make_env, solve

TINY = dict(iterations=2, groups=2, group_size=2, width=16, heads=2, eval_tasks=2, eval_every=2, checkpoint_every=2,
            task_pool=4)


def _scripted(env, task):
    """Walk to the key, then along the row of the door and into it."""
    from examples.key_door import DOOR_POS, MOVES

    state = env_reset(env, jax.tree_util.tree_map(jnp.asarray, task))
    rewards = []
    pos = np.asarray(task.start)
    for target in (np.asarray(task.key), DOOR_POS - np.array([0, 1]), DOOR_POS):
        while not np.array_equal(pos, target):
            d = np.sign(target - pos)
            move = np.array([d[0], 0]) if d[0] else np.array([0, d[1]])
            a = int(np.flatnonzero((MOVES == move).all(1))[0])
            state, r, valid = env_step(env, state, jnp.int32(a))
            rewards.append(float(r))
            pos = np.asarray(state.inner.pos)
    return state, rewards


def test_the_example_is_solvable_and_keeps_its_contract():
    env = KeyDoorEnv(max_steps=30)
    tasks = env.sample_tasks(6, seed=3)
    for i in range(6):
        task = jax.tree_util.tree_map(lambda x: x[i], tasks)
        state, rewards = _scripted(env, task)
        assert bool(state.success) and bool(state.done) and len(rewards) == solve(task)
        assert rewards[-1] == 1.0 and np.allclose(rewards[:-1], -0.01)
    # without the key the door blocks like a wall; with it, the same step succeeds
    from examples.key_door import DOOR_POS, State

    before = jnp.asarray(DOOR_POS - np.array([0, 1]))
    inner = State(before, jnp.array([0, 0], jnp.int32), jnp.bool_(False))
    blocked, r, success, terminal = env.step(inner, jnp.int32(3))  # right, into the door
    assert np.array_equal(blocked.pos, before) and not bool(success) and not bool(terminal)
    opened, r, success, terminal = env.step(inner._replace(has_key=jnp.bool_(True)), jnp.int32(3))
    assert np.array_equal(opened.pos, DOOR_POS) and bool(success) and bool(terminal) and float(r) == 1.0
    assert env.render(inner).shape == (env.obs_len,)
    np.testing.assert_array_equal(env.sample_tasks(3, 1).key, env.sample_tasks(3, 1).key)


def test_train_on_an_environment_instance(tmp_path):
    res = train(RunConfig(**TINY), tmp_path / "run", env=KeyDoorEnv(), progress=False)
    assert res["iterations"] == 2
    assert json.loads((tmp_path / "run" / "config.json").read_text())["env"] == "key_door_room"
    last = read_metrics(tmp_path / "run")[-1]
    assert {"actions/share_up", "actions/share_right", "eval/success_rate", "graph/states"} <= set(last)
    assert abs(sum(last[f"actions/share_{w}"] for w in KeyDoorEnv.action_words) - 1.0) < 1e-5


@pytest.mark.slow
def test_registered_names_and_import_paths(tmp_path, capsys):
    with pytest.raises(ValueError, match="RunConfig.env='key_door_reg' is not valid"):
        RunConfig(env="key_door_reg")
    register_env("key_door_reg", make_env)
    assert RunConfig(env="key_door_reg").env == "key_door_reg"
    with pytest.raises(ValueError, match="already registered"):
        register_env("key_door_reg", lambda cfg: KeyDoorEnv())
    with pytest.raises(ValueError, match="built-in"):
        register_env("sokoban", make_env)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    out = tmp_path / "cli"
    assert main(["train", "--env", "examples.key_door:make_env", "--out", str(out), "--quiet", *flags]) == 0
    assert json.loads((out / "config.json").read_text())["env"] == "examples.key_door:make_env"
    assert main(["train", "--out", str(out), "--resume", "--quiet", "--iterations", "3"]) == 0
    assert [r["iteration"] for r in read_metrics(out)] == [0, 1, 2, 3]


def test_a_factory_that_returns_something_else_is_named():
    register_env("not_an_env", lambda cfg: object(), overwrite=True)
    from bepo_jax.agent.train import Setup

    with pytest.raises(ValueError, match="lacks .*'action_words'"):
        Setup(RunConfig(env="not_an_env", **TINY))


def test_built_in_names_build_the_environments_they_name():
    """The registry's built-ins: the experiments' E1-hard room (it was an import path into
    experiments/, which stored run configs still name: read as the built-in) and the lab's worlds."""
    from bepo_jax.agent.envs.registry import make_jax_env
    from bepo_jax.lab import make_diagnostic

    hard = make_jax_env("sokoban_hard", RunConfig(boxes=2))
    assert (hard.config.size, hard.config.num_boxes, hard.config.reverse_steps, hard.max_steps) == (7, (1, 2), 50, 20)
    old = RunConfig(env="sokoban_hard").to_dict() | {"env": "experiments.claims:sokoban_hard"}
    assert RunConfig.from_stored(old).env == "sokoban_hard"
    world = make_jax_env("key_door", RunConfig())
    assert world.views == make_diagnostic("key_door").views and world.max_steps == make_diagnostic("key_door").max_steps
    assert make_jax_env("key_door", RunConfig(max_steps=9)).max_steps == 9
    with pytest.raises(ValueError, match="built-in"):
        register_env("key_door", make_env)


@pytest.mark.slow
def test_a_lab_world_trains_by_name_and_an_import_path_enumerates(tmp_path):
    """``--env key_door`` trains the lab's world; ``credit --env package.module:factory`` enumerates
    the user's environment (it was refused: only built-in names)."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items() if k != "task_pool"]
    assert main(["train", "--env", "key_door", "--out", str(tmp_path / "kd"), "--quiet", *flags]) == 0
    rows = read_metrics(tmp_path / "kd")
    assert {"actions/share_left", "actions/share_right"} <= set(rows[-1])
    out = tmp_path / "credit"
    assert main(["credit", "--env", "examples.key_door:make_env", "--estimators", "grpo,gated_bepo", "--group-sizes",
                 "2", "--batches", "2", "--groups", "4", "--tasks", "1", "--quiet", "--out", str(out)]) == 0
    res = json.loads((out / "credit.json").read_text())
    assert res["settings"]["env"] == "examples.key_door:make_env"
