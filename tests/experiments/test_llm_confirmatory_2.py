"""The second LLM test's sizing: the t-test's power against a simulation of the test itself, the seeds and
the smallest effect it implies, the evaluation-noise floor against simulated evaluations, the cap; and the
pilot's report reading the training games only."""

import json

import numpy as np
import pytest
from scipy import stats

import experiments.llm_confirmatory_2 as c2
import experiments.llm_pilot as pilot


@pytest.mark.parametrize("n,effect,sd", [(6, 7.0, 9.0), (10, 5.0, 6.0)])
def test_t_power_is_the_simulated_rejection_rate(n, effect, sd):
    rng = np.random.default_rng(0)
    x = rng.normal(effect, sd, size=(40_000, n))
    rejected = stats.ttest_1samp(x, 0.0, axis=1).pvalue < 0.025
    assert c2.t_power(n, effect, sd, alpha=0.025) == pytest.approx(rejected.mean(), abs=0.01)


def test_seeds_for_is_the_first_n_with_the_power_and_smallest_effect_inverts_it():
    n = c2.seeds_for(7.0, 8.0, alpha=0.025)
    assert c2.t_power(n, 7.0, 8.0, 0.025) >= 0.8 > c2.t_power(n - 1, 7.0, 8.0, 0.025)
    d = c2.smallest_effect(n, 8.0, alpha=0.025)
    assert d <= 7.0 and c2.t_power(n, d, 8.0, 0.025) == pytest.approx(0.8, abs=1e-6)


def test_the_evaluation_floor_is_the_sd_of_simulated_evaluations():
    rng = np.random.default_rng(1)
    pa, pb, K = rng.uniform(0, 1, 48), rng.uniform(0, 1, 48), 4
    # many evaluations of the same two runs: K episodes per game, success with the game's probability
    runs = lambda p: rng.binomial(K, p, size=(20_000, len(p))).mean(1) / K
    simulated = 100 * np.std(runs(pa) - runs(pb))
    # the floor reads the observed per-game success; at the true p it is unbiased up to K / (K - 1)
    floor = c2.evaluation_sd(list(pa), list(pb), K) * np.sqrt((K - 1) / K)
    assert floor == pytest.approx(simulated, rel=0.03)


def test_the_plan_takes_the_larger_sd_and_the_cap():
    p = c2.plan([1.0, 1.5], 6.0, 0.8)  # the pilot's SD (0.35) is below the floor: the floor is used
    assert p["sd"] == 6.0 and p["seeds_needed"] == c2.seeds_for(7.0, 6.0, alpha=0.025)
    capped = c2.plan([-10.0, 12.0], 2.0, 2.0)  # SD 15.6: many seeds, but 30 h / (4 arms x 2 h) pays for 3
    assert capped["seeds_the_cap_pays_for"] == 3 and capped["seeds"] == 3
    assert capped["smallest_effect_at_power"] > 7.0
    # few seeds needed (SD 2.0 from two seeds), 30 h / (4 x 0.8 h) pays for 9: every seed but the reserve
    loose = c2.plan([1.0, 3.83], 2.0, 0.8)
    assert loose["seeds_needed"] < 8 and loose["seeds_the_cap_pays_for"] == 9
    assert loose["seeds"] == 9 - c2.RESERVE_SEEDS
    assert loose["power_at_effect"] > c2.t_power(loose["seeds_needed"], 7.0, loose["sd"], 0.025)


def _write(d, cfg, train, held, iterations):
    d.mkdir(parents=True)
    rows = [{"iteration": 0, "eval/success_rate": held[0], "eval/per_task": [held[0]],
             "eval_train/success_rate": train[0], "eval_train/per_task": [train[0]]}]
    rows += [{"iteration": i, "success_rate": 0.5, "invalid_rate": 0.2, "graph/gated_share": 0.9, "step_time": 60.0}
             for i in range(1, iterations + 1)]
    rows[-1].update({"eval/success_rate": held[1], "eval/per_task": [held[1]],
                     "eval_train/success_rate": train[1], "eval_train/per_task": [train[1]]})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "config.json").write_text(json.dumps(cfg.to_dict()))
    (d / "held_out.json").write_text(json.dumps({"held_out": "structural"}))


def test_the_pilot_reports_the_training_games_and_not_the_held_out_ones(tmp_path):
    import dataclasses

    t = dataclasses.replace(pilot.TEST, results_dir=tmp_path / "results", out=tmp_path / "runs")
    n = t.config("grpo", 0).iterations
    for s in t.seeds:
        _write(t.run_dir("grpo", s), t.config("grpo", s), (0.1, 0.2), (0.3, 0.9), n)
        _write(t.run_dir("gated_bepo", s), t.config("gated_bepo", s), (0.1, 0.3 + 0.1 * s), (0.3, 0.1), n)
    res = t.report()
    assert res["contrasts"]["gated_bepo - grpo"]["per_seed"] == pytest.approx([10.0, 20.0])  # training games
    # every seed in, yet a pilot decides nothing: no Holm step, no decision word, the report says why
    assert res["family_complete"] and "holm" not in res["contrasts"]["gated_bepo - grpo"]
    report = (tmp_path / "results" / "report_eval_train.md").read_text()
    assert "Exploratory" in report and "confirmed" not in report
    assert "| contrast | training-game success" in report
    assert (tmp_path / "results" / "summary_eval_train.json").exists()
    assert not (tmp_path / "results" / "summary.json").exists()  # the held-out report is not written
    held = dataclasses.replace(t, endpoint="eval").report()
    assert held["contrasts"]["gated_bepo - grpo"]["per_seed"] == pytest.approx([-80.0, -80.0])
    assert res["gated_curves"]["gated_bepo"] == [[0.9] * n] * 2
    with pytest.raises(ValueError, match="endpoint"):
        dataclasses.replace(t, endpoint="held_out")


def test_the_second_test_refuses_to_run_before_its_seeds_are_fixed(monkeypatch):
    monkeypatch.setattr(c2, "SEEDS", ())
    with pytest.raises(SystemExit, match="not fixed yet"):
        c2.main(["status"])


def test_the_pilot_adopts_make_train_llms_run_only_when_it_is_the_pilots_config(tmp_path, monkeypatch):
    import dataclasses

    t = dataclasses.replace(pilot.TEST, results_dir=tmp_path / "results", out=tmp_path / "runs")
    monkeypatch.setattr(pilot, "TEST", t)
    n = t.config("gated_bepo", 0).iterations
    other = tmp_path / "other_run"
    _write(other, t.config("gated_bepo", 0).replace(learning_rate=1e-4), (0.1, 0.2), (0.3, 0.4), n)
    with pytest.raises(SystemExit, match="not the pilot's .gated_bepo, 0. run: .*learning_rate"):
        pilot.adopt(other)
    unfinished = tmp_path / "unfinished"
    _write(unfinished, t.config("gated_bepo", 0), (0.1, 0.2), (0.3, 0.4), n - 1)
    with pytest.raises(SystemExit, match="no finished run of the pilot"):
        pilot.adopt(unfinished)
    src = tmp_path / "llm_textworld_wide"
    _write(src, t.config("gated_bepo", 0), (0.1, 0.2), (0.3, 0.4), n)
    pilot.adopt(src)
    assert t.run_finished("gated_bepo", 0) and t.pending()[0] == ("grpo", 0)
    kept = t.record_dir("gated_bepo", 0) / "metrics.jsonl"
    assert kept.read_text() == (src / "metrics.jsonl").read_text()
    log = [json.loads(x) for x in (tmp_path / "results" / "log.jsonl").read_text().splitlines()]
    assert log[-1]["event"] == "note" and "make train-llm" in log[-1]["text"]
