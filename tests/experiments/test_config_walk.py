"""The walk of a run's config through the code (``experiments/config_walk.py``): its counting on a walk
written by hand, and the walk of both policies' runs within the house's goal (at most 10 returns)."""

import pytest

from experiments import config_walk


def test_stays_and_returns_are_counted_as_a_reader_meets_them():
    walk = ["a", "a", "b", "a", "c", "b", "b", "a"]
    out = config_walk.summary(walk)
    assert config_walk.stays(walk) == ["a", "b", "a", "c", "b", "a"]
    assert (out["rooms"], out["stays"], out["returns"]) == (3, 6, 3)
    assert out["returns_by_room"] == {"a": 2, "b": 1}


@pytest.mark.slow
def test_a_runs_config_comes_back_to_at_most_10_rooms_it_left(tmp_path):
    for name, cfg in config_walk.configs(tmp_path).items():
        out = config_walk.summary(config_walk.walk(cfg, tmp_path / name))
        assert out["rooms"] >= 5, (name, out["walk"])  # the walk saw the run: loop, rundir, pieces, setup, ...
        assert out["returns"] <= 10, (name, out["returns_by_room"])
