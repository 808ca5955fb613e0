"""README's main-job table cites experiments/results/main_job.json: the recorded run must still be what
`make train` runs today. The recipe is recomputed from bepo_jax.agent.train.recipes and the pools'
digests from the environment's own task signatures (setup.pool_digests, the current code), and both
are compared with what the record carries (experiments/record_main_job.py wrote it)."""

import json

from bepo_jax.agent.train.config import RunConfig
from bepo_jax.agent.train.recipes import recipe
from bepo_jax.agent.train.setup import pool_digests

from experiments.common import RESULTS


def test_the_recorded_main_job_is_todays_recipe_on_todays_pools():
    record = json.loads((RESULTS / "main_job.json").read_text())
    assert "provenance" in record, "main_job.json has no provenance: re-record it (make train && make record-main-job)"
    cfg = RunConfig.from_stored(record["config"])
    assert cfg.to_dict() == recipe("main_job").to_dict(), \
        "the main_job recipe changed since main_job.json was recorded: make train && make record-main-job"
    assert record["provenance"]["recipe"] == "main_job"
    assert record["provenance"]["pools"] == pool_digests(cfg), \
        "the main job's training or held-out pool changed since it was recorded: make train && make record-main-job"


def test_a_changed_pool_changes_its_digest():
    cfg = recipe("main_job")
    base = pool_digests(cfg.replace(task_pool=64, eval_tasks=8))
    other = pool_digests(cfg.replace(task_pool=64, eval_tasks=8, seed=1))
    assert base["train"] != other["train"] and base["held_out"] != other["held_out"]
    assert pool_digests(cfg.replace(task_pool=64, eval_tasks=8)) == base
