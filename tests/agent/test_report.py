"""bepo_jax.agent.train.report: the interval helpers every results table goes through."""

import numpy as np
import pytest
from scipy import stats

from bepo_jax.agent.train.report import mean_ci, paired_combination


def test_mean_ci_is_the_student_t_half_width():
    x = np.array([0.1, 0.4, 0.35, 0.2])
    m, h = mean_ci(x)
    assert m == pytest.approx(x.mean())
    assert h == pytest.approx(stats.t.ppf(0.975, 3) * x.std(ddof=1) / 2)
    assert np.isnan(mean_ci([0.5])[1]) and np.isnan(mean_ci([])[0])


def test_paired_combination_pairs_seed_by_seed_over_the_shared_seeds():
    a = [{"v": 0.5}, {"v": 0.25}, {"v": 1.0}]
    b = [{"v": 0.25}, {"v": 0.5}]  # one seed fewer: only the seeds both arms have are combined
    c = [{"v": 0.0}, {"v": 0.75}, {"v": 0.5}]
    assert paired_combination([(a, 1.0), (b, -1.0)], lambda x: x["v"]) == [0.25, -0.25]
    # a difference of differences, (a - b) - (c - b) = a - c, seed by seed
    got = paired_combination([(a, 1.0), (b, -1.0), (c, -1.0), (b, 1.0)], lambda x: x["v"])
    assert got == [0.5, -0.5]


def test_an_evaluation_of_one_task_has_no_interval_not_a_zero_one():
    from bepo_jax.agent.train.setup import evaluation

    success = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    reward = np.zeros(success.shape + (5,))
    ev = evaluation(success, reward)
    per_task = success.mean(1)  # 0.75, 0.25, 0
    assert ev["success_rate"] == pytest.approx(1 / 3) and ev["tasks"] == 3
    assert ev["ci95"] == pytest.approx(stats.t.ppf(0.975, 2) * per_task.std(ddof=1) / np.sqrt(3))
    one = evaluation(success[:1], reward[:1])
    assert one["ci95"] is None and one["success_rate"] == 0.75
