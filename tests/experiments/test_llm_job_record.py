"""README's second-job table cites experiments/results/llm_textworld_wide/summary.json: the recorded run
must still be what `make train-llm` runs today. The config is recomputed from
bepo_jax.agent.train.recipes, the pools' digests from the games' own content (setup.pool_digests on the
current code, generating the games when not cached), and the evaluated games' ids from the held-out
sequence, and each is compared with what the record carries (experiments/llm_learning.py wrote it)."""

import json

import pytest

from bepo_jax.agent.train.config import RunConfig
from bepo_jax.agent.train.recipes import recipe
from bepo_jax.agent.train.setup import pool_digests

from experiments.common import RESULTS

RECORD = RESULTS / "llm_textworld_wide" / "summary.json"


@pytest.mark.slow  # generates about 110 TextWorld games when not cached (1-2 minutes): CI=1 runs it
def test_the_recorded_llm_job_is_todays_recipe_on_todays_games():
    pytest.importorskip("textworld")
    record = json.loads(RECORD.read_text())
    prov = record["provenance"]
    cfg = RunConfig.from_stored(record["recipe"])
    assert cfg.to_dict() == recipe("llm_textworld_wide").to_dict(), \
        "the llm_textworld_wide recipe changed since its run was recorded: make train-llm again"
    assert prov["recipe"] == "llm_textworld_wide" and prov["held_out_pools"] == "structural"
    assert prov["pools"] == pool_digests(cfg, pools=prov["held_out_pools"]), \
        "the LLM job's training or held-out games changed since it was recorded: make train-llm again"
    # every evaluation played the run's first eval_tasks held-out games and its first training games
    from bepo_jax.agent.envs.registry import make_host_env
    from bepo_jax.agent.envs.pools import task_ids
    from bepo_jax.agent.train.config import EVAL_SEED_OFFSET

    env = make_host_env(cfg.env, cfg, None, eval_seed_offset=EVAL_SEED_OFFSET, held_out=prov["held_out_pools"])
    held, train = task_ids(env, env.held_out(cfg.eval_tasks)), task_ids(env, env.train_tasks[:cfg.eval_tasks])
    assert [e["iteration"] for e in prov["evaluated_games"]] == record["held_out"]["evaluated_at"]
    for e in prov["evaluated_games"]:
        assert e["held_out"] == held and e["training"] == train, e["iteration"]
    assert record["held_out"]["games"] == cfg.eval_tasks == len(held)


def test_a_changed_textworld_pool_changes_its_digest(tmp_path):
    pytest.importorskip("textworld")
    cfg = recipe("llm_textworld_wide").replace(task_pool=2, eval_tasks=2)
    base = pool_digests(cfg, cache_dir=tmp_path)
    assert pool_digests(cfg, cache_dir=tmp_path) == base
    other = pool_digests(cfg.replace(seed=1), cache_dir=tmp_path)
    assert base["train"] != other["train"] and base["held_out"] != other["held_out"]
    assert pool_digests(cfg.replace(eval_tasks=3), cache_dir=tmp_path)["train"] == base["train"]
