"""experiments/warm_start.py: the experiment's arms start where they say, and the regime table's numbers
are the seeds' curves averaged (checked against a plain computation)."""

import numpy as np

from bepo_jax.agent.train import RunConfig
from experiments import claims, warm_start


def test_warm_arms_start_from_the_warm_start_and_the_cold_arm_does_not():
    exp = claims.EXPERIMENTS["warm_start"]
    base = RunConfig(**exp.base)
    starts = {a.label: a.config_for(base).init_from for a in exp.arms}
    assert starts.pop("gated_bepo_cold") == ""
    assert set(starts.values()) == {claims.WARM_START_DIR}
    assert list(exp.seed_ids(exp.seeds)) == list(range(200, 208))
    # the warm start is the recipe's policy on its own seed, which no RL seed of the experiment uses
    warm = warm_start.warm_config()
    assert warm.seed not in exp.seed_ids(exp.seeds) and warm.init_from == ""
    assert {f: getattr(warm, f) for f in ("layers", "width", "heads", "prompt_history")} == \
        {f: getattr(base, f) for f in ("layers", "width", "heads", "prompt_history")}


def test_regime_is_the_mean_over_seeds_per_iteration():
    rng = np.random.default_rng(0)
    per_arm = {"a": [{"gated_share": list(rng.random(4)), "out_degree": list(1 + rng.random(4)),
                      "mixed_share": list(rng.random(3))} for _ in range(5)]}
    reg = warm_start.regime(per_arm)["a"]
    for key in ("gated_share", "out_degree", "mixed_share"):
        curves = np.array([s[key] for s in per_arm["a"]])
        n = curves.shape[1]
        assert [int(x[0]) for x in reg[key]] == list(range(1, n + 1))
        np.testing.assert_allclose([x[1] for x in reg[key]], curves.mean(0))
        half = [x[2] for x in reg[key]]
        from scipy import stats
        np.testing.assert_allclose(half, stats.t.ppf(0.975, 4) * curves.std(0, ddof=1) / np.sqrt(5))
    lines = warm_start.regime_lines(warm_start.regime(per_arm), at=(1, 3))
    assert lines[2].startswith("| a | ") and lines[2].count("±") == 6
    assert warm_start.regime({"b": [{}]}) == {"b": {}}  # an arm without graph metrics (GRPO) has no regime rows


def test_the_kept_warm_start_restores_bit_for_bit(tmp_path):
    import jax

    from bepo_jax.agent.train import load_run
    from bepo_jax.agent.train.sft import SFTConfig, sft

    cfg = RunConfig(env="sokoban", layers=1, width=32, heads=2, task_pool=8, eval_tasks=4, prompt_history=0, seed=5)
    sft(cfg, SFTConfig(epochs=1), tmp_path / "warm", progress=False)
    warm_start.save_artifact(tmp_path / "warm", tmp_path / "kept")
    warm_start.restore_artifact(tmp_path / "again", tmp_path / "kept")
    (_, a, _), (_, b, _) = load_run(tmp_path / "warm"), load_run(tmp_path / "again")
    same = jax.tree_util.tree_map(lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a.params, b.params)
    assert all(jax.tree_util.tree_leaves(same))
    import json

    assert json.loads((tmp_path / "again" / "sft.json").read_text()) == \
        json.loads((tmp_path / "warm" / "sft.json").read_text())
