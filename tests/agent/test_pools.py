"""Held-out pools disjoint in content from every training and demonstration pool (``envs.pools``,
``Setup.held_out_tasks``): checked on the levels' arrays themselves, not on seeds or digests."""

import json

import numpy as np
import pytest

from bepo_jax.agent.envs.pools import first_new
from bepo_jax.agent.envs.sokoban import level_at
from bepo_jax.agent.train import EVAL_SEED_OFFSET, RunConfig, Setup
from bepo_jax.agent.train.pieces import JaxTextGames


def _levels(tasks) -> list[tuple]:
    """Each level as a tuple of its arrays' bytes (content, compared cell for cell)."""
    n = len(np.asarray(tasks.player))
    return [tuple(np.asarray(x).tobytes() for x in level_at(tasks, i)) for i in range(n)]


# 1 box in a 6x6 room with short scrambles: a small space, so the plain seed streams collide often
SMALL = dict(env="sokoban", boxes=1, layers=1, width=32, heads=2, groups=2, group_size=2, iterations=1,
             prompt_history=0, seed=3)


def _plain_collisions(setup: Setup, n: int) -> int:
    train = set(_levels(setup.train_tasks))
    plain = setup.env.sample_tasks(n, setup.cfg.seed + EVAL_SEED_OFFSET)
    return sum(lv in train for lv in _levels(plain))


def test_held_out_levels_share_no_content_with_the_training_pool_and_none_repeats():
    setup = Setup(RunConfig(**SMALL, task_pool=512, eval_tasks=64))
    assert _plain_collisions(setup, 64) > 0  # the plain seeded sequence did collide (what this guards against)
    train = set(_levels(setup.train_tasks))
    held = _levels(setup.held_out_tasks(64))
    assert len(held) == 64 and not any(lv in train for lv in held)
    assert len(set(held)) == 64
    # the pool is the plain sequence with the colliding and repeated levels skipped, in order (a plain loop)
    plain = _levels(setup.env.sample_tasks(2000, setup.cfg.seed + EVAL_SEED_OFFSET))
    expect, seen = [], set(train)
    for lv in plain:
        if lv not in seen:
            seen.add(lv)
            expect.append(lv)
    assert held == expect[:64]
    # a larger pool begins with the smaller one (the rescoring's fresh levels come after the scored ones)
    assert _levels(setup.held_out_tasks(200))[:64] == held


def test_a_planted_copy_of_a_training_level_is_skipped_and_nothing_else():
    """Not relying on natural collisions: the plain held-out sequence's levels 2 and 5 planted into the
    training side (their signatures excluded); the pool is the sequence without exactly those two."""
    from bepo_jax.agent.envs.pools import disjoint_tasks

    setup = Setup(RunConfig(**{**SMALL, "boxes": 2}, task_pool=8, eval_tasks=8))
    env, seed = setup.env, setup.cfg.seed + EVAL_SEED_OFFSET
    plain = env.sample_tasks(40, seed)
    sigs = env.task_signatures(plain)
    assert len(set(sigs[:10])) == 10  # no natural repeat among the first ten: only the planted ones are skipped
    got = _levels(disjoint_tasks(env, 8, seed, {sigs[2], sigs[5]}))
    want = [lv for i, lv in enumerate(_levels(plain)[:10]) if i not in (2, 5)]
    assert got == want


def test_held_out_levels_avoid_the_warm_starts_demonstration_pool(tmp_path):
    source = RunConfig(**{**SMALL, "seed": 11}, task_pool=1024, eval_tasks=8)
    (tmp_path / "warm").mkdir()
    (tmp_path / "warm" / "config.json").write_text(json.dumps(source.to_dict()))
    cold = Setup(RunConfig(**SMALL, task_pool=16, eval_tasks=64))
    warm = Setup(RunConfig(**SMALL, task_pool=16, eval_tasks=64, init_from=str(tmp_path / "warm")))
    demos = set(_levels(Setup(source).train_tasks))
    assert any(lv in demos for lv in _levels(cold.held_out_tasks(64)))  # without the warm start they collide
    assert not any(lv in demos for lv in _levels(warm.held_out_tasks(64)))
    assert not any(lv in set(_levels(warm.train_tasks)) for lv in _levels(warm.held_out_tasks(64)))


def test_a_chat_models_sokoban_games_are_disjoint_too():
    cfg = RunConfig(**{**SMALL, "layers": 1}, task_pool=512, eval_tasks=16)
    games = JaxTextGames(Setup(cfg).env, cfg)
    train = set(_levels(Setup(cfg).train_tasks))
    held = games.held_out(64)
    assert len(held) == 64
    assert not any(tuple(np.asarray(x).tobytes() for x in lv) in train for lv in held)


def test_first_new_keeps_order_and_skips_excluded_and_repeated():
    assert first_new("abcabdxe", 4, str, {"b"}) == list("acdx")
    assert first_new("aaa", 2, str, set()) == ["a"]  # the candidates ran out
    assert first_new("abc", 0, str, set()) == []


def test_a_generator_too_small_for_the_pool_is_named():
    class Tiny:
        name = "tiny"

        def sample_tasks(self, n, seed):
            return np.arange(n) % 3

        def task_signatures(self, tasks):
            return [str(int(t)) for t in tasks]

    from bepo_jax.agent.envs.pools import disjoint_tasks

    np.testing.assert_array_equal(disjoint_tasks(Tiny(), 2, 0, {"0"}), [1, 2])
    with pytest.raises(ValueError, match="only 2 of 3 tiny tasks.*too small"):
        disjoint_tasks(Tiny(), 3, 0, {"0"})


def test_a_run_written_before_the_disjoint_pools_keeps_its_own(tmp_path):
    """A run directory with a config.json but no held_out.json was written before held-out pools were made
    disjoint: resuming, evaluating or rescoring it keeps the plain seeded pools it was scored on (and the
    directory records that); a new run records and uses the disjoint ones ("structural": a level's arrays
    are its structure, so for Sokoban they are the content-disjoint pools)."""
    from bepo_jax.agent.train import rundir
    from bepo_jax.agent.train.loop import _setup_for_run

    cfg = RunConfig(**SMALL, task_pool=512, eval_tasks=64)
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    (old / "config.json").write_text(json.dumps(cfg.to_dict()))  # as a run of an earlier version left it
    assert rundir.held_out_pools(old) == "seeded" and rundir.held_out_pools(new) == "structural"
    rundir.prepare(cfg, old, resume=True)
    rundir.prepare(cfg, new, resume=False)
    assert json.loads((old / "held_out.json").read_text()) == {"held_out": "seeded"}
    assert json.loads((new / "held_out.json").read_text()) == {"held_out": "structural"}
    plain = _levels(Setup(cfg).env.sample_tasks(64, cfg.seed + EVAL_SEED_OFFSET))
    assert _levels(_setup_for_run(cfg, old).held_out_tasks(64)) == plain
    assert _levels(_setup_for_run(cfg, new).held_out_tasks(64)) == _levels(Setup(cfg).held_out_tasks(64)) != plain
