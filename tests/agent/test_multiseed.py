"""Seeds vmapped into one program (bepo_jax.agent.train.SeedBatch, train_seeds): run i equals the single run with
that seed, on one device and with the run axis sharded over simulated devices."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bepo_jax.agent.train.multiseed import SeedBatch, unstack
from bepo_jax.credit.sharding import make_mesh
from bepo_jax.agent.train import RunConfig, Setup

CFG = RunConfig(iterations=2, groups=2, group_size=4, layers=1, width=16, heads=2, task_pool=4, eval_tasks=2,
                prompt_history=1)


def _single(seed, iterations):
    setup = Setup(CFG.replace(seed=seed))
    state = setup.trainer.init_state()
    rows = []
    for it in range(1, iterations + 1):
        state, m = setup.iterate(state, it)
        rows.append(m)
    return state, rows


def _close_params(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
@pytest.mark.parametrize("sharded,runs_per_step", [(False, None), (False, 2), (True, None)])
def test_each_vmapped_seed_equals_its_single_run(sharded, runs_per_step):
    """All runs vmapped, looped in chunks of 2 (3 seeds: a chunk of 2 and a remainder of 1),
    and vmapped with the run axis sharded over 2 devices."""
    seeds = [0, 1, 2, 3] if sharded else [0, 1, 2]
    mesh = make_mesh((2,), ("runs",), devices=jax.devices()[:2]) if sharded else None
    runs = SeedBatch(CFG, seeds, mesh=mesh, runs_per_step=runs_per_step)
    states = runs.init_states()
    per_seed = [[] for _ in seeds]
    for it in (1, 2):
        states, ms = runs.iterate(states, it)
        for i, m in enumerate(ms):
            per_seed[i].append(m)
    if sharded:
        assert jax.tree_util.tree_leaves(states.params)[0].sharding.spec[0] == "runs"
    for i, seed in enumerate(seeds[:3]):
        state, rows = _single(seed, 2)
        for got, want in zip(per_seed[i], rows):
            for k in ("success_rate", "return", "env_steps", "episode_length", "loss", "grad_norm"):
                np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=f"seed {seed} {k}")
        _close_params(unstack(states, i).params, state.params)
    assert per_seed[0][0]["env_steps"] != per_seed[1][0]["env_steps"] or per_seed[0][0]["loss"] != per_seed[1][0]["loss"]


def test_the_seed_batch_evaluates_as_each_single_run_does_with_its_eval_episodes():
    """``evaluate_all`` is every seed's ``Setup.evaluate``: the same tasks, key and ``eval_episodes`` per task
    (3 here, not the group size 4)."""
    cfg = CFG.replace(eval_episodes=3)
    runs = SeedBatch(cfg, [0, 1])
    states = runs.init_states()
    got = runs.evaluate_all(states, [7, 8])
    for i, seed in enumerate((0, 1)):
        setup = Setup(cfg.replace(seed=seed))
        want = setup.evaluate(unstack(states, i).params, seed=7 + i)
        assert got[i]["task_ids"] == want["task_ids"]
        np.testing.assert_allclose(got[i]["per_task"], want["per_task"], atol=1e-6)
        assert all(abs(3 * p - round(3 * p)) < 1e-9 for p in got[i]["per_task"])  # thirds: 3 episodes per task


def test_seed_batch_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="seeds must differ"):
        SeedBatch(CFG, [1, 1])
    with pytest.raises(ValueError, match="host loop"):
        SeedBatch(CFG.replace(env="textworld"), [0, 1])
    with pytest.raises(ValueError, match="runs_per_step=0 must be"):
        SeedBatch(CFG, [0, 1], runs_per_step=0)
    with pytest.raises(ValueError, match="leave runs_per_step=None"):
        SeedBatch(CFG, [0, 1], runs_per_step=1, mesh=make_mesh((2,), ("runs",), devices=jax.devices()[:2]))
    with pytest.raises(ValueError, match="add a 'runs' axis"):
        SeedBatch(CFG, [0, 1], mesh=make_mesh((2,), ("data",), devices=jax.devices()[:2]))


TIMING = ("step_time", "env_steps_per_s")


class Killed(Exception):
    pass


def _numbers(row):
    return {k: v for k, v in row.items() if k not in TIMING}


@pytest.mark.slow
def test_train_seeds_run_dirs_equal_single_runs_and_resume_exactly(tmp_path):
    """train_seeds writes one ordinary run directory per seed; seed i equals train() with
    that seed (float32 tolerance); killed during iteration 3 and resumed, every metric and
    parameter equals the uninterrupted vmapped run exactly."""
    from bepo_jax.agent.train import load_run, read_metrics, train, train_seeds

    cfg = CFG.replace(iterations=4, eval_every=2, checkpoint_every=2, max_steps=3)
    seeds = [0, 1]
    whole = [tmp_path / f"whole{s}" for s in seeds]
    res = train_seeds(cfg, seeds, whole, progress=False)
    assert [r["iterations"] for r in res] == [4, 4]
    for d in whole:
        assert {"config.json", "metrics.jsonl", "curve.png", "summary.json", "checkpoints", "tb"} <= {
            p.name for p in d.iterdir()}
    train(cfg.replace(seed=1), tmp_path / "single1", progress=False)
    for got, want in zip(read_metrics(whole[1]), read_metrics(tmp_path / "single1"), strict=True):
        for k, v in _numbers(want).items():
            if k.endswith("task_ids"):  # the evaluated tasks' ids: the same tasks, exactly
                assert got[k] == v, f"iteration {want['iteration']} {k}"
                continue
            np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5, err_msg=f"iteration {want['iteration']} {k}")

    cut = [tmp_path / f"cut{s}" for s in seeds]

    def kill(it, rows):
        if it == 3:
            raise Killed

    with pytest.raises(Killed):
        train_seeds(cfg, seeds, cut, progress=False, on_iteration=kill)
    assert [r["iteration"] for r in read_metrics(cut[0])] == [0, 1, 2, 3]
    train_seeds(cfg, seeds, cut, resume=True, progress=False)
    for a, b in zip(whole, cut):
        assert [_numbers(r) for r in read_metrics(a)] == [_numbers(r) for r in read_metrics(b)]
        _, sa, ia = load_run(a)
        _, sb, ib = load_run(b)
        assert ia == ib == 4
        for x, y in zip(jax.tree_util.tree_leaves(sa.params), jax.tree_util.tree_leaves(sb.params)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
