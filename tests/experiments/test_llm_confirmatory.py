"""The LLM confirmatory test's report on made-up run directories: paired per seed, Holm over the primary
family only when every seed is complete, the protocol's config per (arm, seed)."""

import json

import numpy as np
import pytest
from scipy import stats

import dataclasses

import experiments.llm_confirmatory as lc
import experiments.llm_test as lt


def _test(tmp_path):
    """The first LLM test's protocol with its results written under ``tmp_path``."""
    return dataclasses.replace(lc.TEST, results_dir=tmp_path / "results")


def _write(d, initial, final, iterations):
    d.mkdir(parents=True)
    rows = [{"iteration": 0, "eval/success_rate": initial, "eval/per_task": [initial]}]
    rows += [{"iteration": i, "success_rate": 0.5, "invalid_rate": 0.2, "step_time": 60.0} for i in
             range(1, iterations + 1)]
    rows[-1].update({"eval/success_rate": final, "eval/per_task": [final]})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_report_pairs_seeds_and_decides_only_when_complete(tmp_path, monkeypatch):
    t = _test(tmp_path)
    assert t.report(tmp_path / "runs")["seeds_complete"] == []  # before any run finished: a report, no numbers
    n = lc.OVERRIDES["iterations"]
    rng = np.random.default_rng(0)
    finals = {a: {s: float(rng.uniform(0.2, 0.6)) for s in lc.SEEDS} for a in lc.ARMS}
    for s in lc.SEEDS:
        finals["gated_bepo"][s] = finals["grpo"][s] + 0.2  # a clear gain over GRPO on every seed
    for a in lc.ARMS:
        for s in lc.SEEDS[:-1]:
            _write(t.run_dir(a, s, tmp_path / "runs"), 0.3, finals[a][s], n)
    part = t.report(tmp_path / "runs")  # fixed in advance: sealed until the last run, no number in it
    assert not part["family_complete"] and part["sealed"] and "contrasts" not in part and "arms_summary" not in part
    assert part["runs_finished_count"] == len(lc.ARMS) * (len(lc.SEEDS) - 1) and part["runs_total"] == 18
    assert part["runs_finished"]["gigpo"] == list(lc.SEEDS[:-1])
    summary = (tmp_path / "results" / "summary.json").read_text()
    md = (tmp_path / "results" / "report.md").read_text()
    for a in lc.ARMS:
        for s in lc.SEEDS[:-1]:
            assert repr(finals[a][s]) not in summary and f"{finals[a][s]:.3f}" not in md
    assert "| gigpo | " + ", ".join(map(str, lc.SEEDS[:-1])) + " |" in md
    assert not (tmp_path / "results" / "curves.png").exists()
    for a in lc.ARMS:
        _write(t.run_dir(a, lc.SEEDS[-1], tmp_path / "runs"), 0.3, finals[a][lc.SEEDS[-1]], n)
    res = t.report(tmp_path / "runs")
    c = res["contrasts"]["gated_bepo - gigpo"]
    want = [100 * (finals["gated_bepo"][s] - finals["gigpo"][s]) for s in lc.SEEDS]
    np.testing.assert_allclose(c["per_seed"], want)
    assert abs(c["test"]["p"] - stats.ttest_1samp(want, 0.0).pvalue) < 1e-12
    # what the seeds could see at the SD observed: 80% power at Holm's first level (0.05 / 2 primaries)
    assert abs(c["sd"] - np.std(want, ddof=1)) < 1e-9
    assert abs(lt.t_power(6, c["smallest_effect_at_power"], c["sd"], 0.025) - 0.8) < 1e-6
    assert f"SD was {res['contrasts']['gated_bepo - grpo']['sd']:.1f} points (gated_bepo - grpo), {c['sd']:.1f} " \
        f"points (gated_bepo - gigpo)" in (tmp_path / "results" / "report.md").read_text()
    g = res["contrasts"]["gated_bepo - grpo"]
    assert g["holm"]["decision"] == "confirmed" and "holm" not in res["contrasts"]["gigpo - grpo"]
    assert "**confirmed**" in (tmp_path / "results" / "report.md").read_text()
    assert (tmp_path / "results" / "curves.png").stat().st_size > 10_000
    np.testing.assert_allclose(res["invalid_curves"]["grpo"], 0.2)
    # the per-seed table: each arm's before -> after and each contrast's difference, from the inputs above
    md = (tmp_path / "results" / "report.md").read_text().splitlines()
    s = lc.SEEDS[2]
    row = next(line for line in md if line.startswith(f"| {s} |")).strip("| ").split(" | ")
    assert row[1:4] == [f"0.300 -> {finals[a][s]:.3f}" for a in lc.ARMS]
    assert row[4] == f"{100 * (finals['gated_bepo'][s] - finals['grpo'][s]):+.1f}"
    assert row[6] == f"{100 * (finals['gigpo'][s] - finals['grpo'][s]):+.1f}"
    # how each arm moved: held-out change over seeds; training success and invalid rate at the run's two ends
    change = [100 * (finals["gigpo"][s] - 0.3) for s in lc.SEEDS]
    m, h = res["arms_summary"]["gigpo"]["held_out_change"]
    assert abs(m - np.mean(change)) < 1e-9
    assert abs(h - stats.t.ppf(0.975, 5) * np.std(change, ddof=1) / np.sqrt(6)) < 1e-9
    assert res["arms_summary"]["gigpo"]["train_success_first_last"] == [0.5, 0.5]
    gigpo_row = next(line for line in md if line.startswith("| gigpo | ") and "->" in line)
    assert gigpo_row == f"| gigpo | {m:+.1f} +- {h:.1f} | 0.500 -> 0.500 | 0.200 -> 0.200 |"
    assert next(line for line in md if line.startswith("| grpo | 0.")).split(" | ")[4] == "-"  # no gated share


def test_wall_hours_count_finished_segments_and_name_the_stopped_ones():
    ev = [{"time": "2026-12-04 10:00:00", "event": "start", "arm": "grpo", "seed": 300},
          {"time": "2026-12-04 10:30:00", "event": "note", "text": "a note is not an end"},
          {"time": "2026-12-04 11:00:00", "event": "finish", "arm": "grpo", "seed": 300},  # 1 h
          {"time": "2026-12-04 11:00:00", "event": "start", "arm": "gigpo", "seed": 300},  # stopped
          {"time": "2026-12-04 20:00:00", "event": "start", "arm": "gigpo", "seed": 300},
          {"time": "2026-12-04 20:45:00", "event": "finish", "arm": "gigpo", "seed": 300},  # 0.75 h
          {"time": "2026-12-04 20:45:00", "event": "start", "arm": "gated_bepo", "seed": 300}]  # running
    assert lt.wall_hours(ev) == {"finished_segments_hours": 1.75, "stopped_segments": 1, "finished_then_lost": 0,
                                 "lost_finished_segments_hours": 0.0}
    # the machine lost grpo s300's record; it runs again from the start (0.5 h) and counts as lost once
    ev += [{"time": "2026-12-05 12:00:00", "event": "note", "text": "new machine"},
           {"time": "2026-12-05 12:00:00", "event": "start", "arm": "grpo", "seed": 300},
           {"time": "2026-12-05 12:30:00", "event": "finish", "arm": "grpo", "seed": 300}]
    # the lost finish is grpo's first (1 h), not its second, nor gigpo's
    assert lt.wall_hours(ev) == {"finished_segments_hours": 2.25, "stopped_segments": 2, "finished_then_lost": 1,
                                 "lost_finished_segments_hours": 1.0}


def test_every_run_is_the_recipe_with_the_protocols_overrides():
    cfg = lc.TEST.config("gigpo", lc.SEEDS[0])
    base = lt.recipe("llm_textworld")
    assert cfg.estimator == "gigpo" and cfg.seed == lc.SEEDS[0] and cfg.model == base.model
    assert {k: getattr(cfg, k) for k in lc.OVERRIDES} == lc.OVERRIDES


def test_run_starts_one_process_per_pending_run_and_stops_on_a_failure(tmp_path, monkeypatch):
    """``run`` hands each pending run to a fresh process (``run --one``) until none is left; a process that
    fails, or one that leaves its run unfinished, stops the loop with a message instead of spinning."""
    import subprocess

    t = _test(tmp_path)
    left = [("grpo", 300), ("gigpo", 300)]
    calls = []

    def fake(cmd, **kw):
        calls.append(cmd)
        left.pop(0)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(t, "pending", lambda out: list(left))
    monkeypatch.setattr(subprocess, "run", fake)
    t.run_each_in_a_process(tmp_path)
    assert len(calls) == 2 and all(c[-5:] == ["experiments.llm_confirmatory", "run", "--one", "--out", str(tmp_path)] for c in calls)
    left[:] = [("grpo", 301)]
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0))
    with pytest.raises(SystemExit, match="did not finish"):
        t.run_each_in_a_process(tmp_path)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 137))
    with pytest.raises(SystemExit, match="exit 137"):
        t.run_each_in_a_process(tmp_path)


def test_the_logged_commit_ignores_the_experiments_own_results(tmp_path, monkeypatch):
    import subprocess

    from experiments import common

    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path,
                                    check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    (tmp_path / "experiments" / "results" / "log.jsonl").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "first")
    monkeypatch.setattr(common, "ROOT", tmp_path)
    head = common.git_commit()
    assert "+" not in head
    (tmp_path / "experiments" / "results" / "log.jsonl").write_text("{}\n{}\n")  # a run appended to its log
    assert common.git_commit() == head
    (tmp_path / "code.py").write_text("x = 2\n")  # code changed: the runs must say so
    assert common.git_commit() == head + "+changes"


def _finished_run(d, arm, seed):
    """A finished run directory of the protocol's (arm, seed): its config.json as ``train`` stores it."""
    _write(d, 0.25, 0.5, lc.OVERRIDES["iterations"])
    (d / "config.json").write_text(json.dumps(lc.TEST.config(arm, seed).to_dict()))
    (d / "held_out.json").write_text(json.dumps({"held_out": "disjoint"}))


def test_a_finished_runs_record_outlives_its_run_directory(tmp_path, monkeypatch):
    """``keep_record`` copies what the report reads into the tracked results; once the ignored run directory
    is gone (a new machine), the run still counts as finished and the report reads the same numbers."""
    import shutil

    t = _test(tmp_path)
    out = tmp_path / "runs"
    with pytest.raises(ValueError, match="no finished run"):
        t.keep_record("grpo", 300, out)
    _finished_run(t.run_dir("grpo", 300, out), "grpo", 300)
    assert t.pending(out)[0] == ("gigpo", 300) and not t.record_dir("grpo", 300).exists()
    rec = t.keep_record("grpo", 300, out)
    for name in lt.RECORD_FILES:
        assert (rec / name).read_bytes() == (t.run_dir("grpo", 300, out) / name).read_bytes()
    shutil.rmtree(out)
    assert t.pending(out)[0] == ("gigpo", 300) and len(t.pending(out)) == len(lc.SEEDS) * len(lc.ARMS) - 1
    assert t.final(t.source("grpo", 300, out))["final"] == 0.5
    # a record of another config is not taken for the protocol's run
    cfg = json.loads((rec / "config.json").read_text())
    (rec / "config.json").write_text(json.dumps({**cfg, "iterations": 3}))
    with pytest.raises(ValueError, match="differs"):
        t.pending(out)


def test_no_run_starts_after_the_given_time(tmp_path, monkeypatch):
    import subprocess

    t = _test(tmp_path)
    monkeypatch.setattr(t, "pending", lambda out: [("grpo", 301)])
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: pytest.fail("a run started after the deadline"))
    t.run_each_in_a_process(tmp_path, no_start_after=lt.local_time("2000-01-01 00:00"))
    note = json.loads((tmp_path / "results" / "log.jsonl").read_text().splitlines()[-1])
    assert note["event"] == "note" and "grpo s301" in note["text"]
    with pytest.raises(SystemExit):
        lc.main(["run", "--no-start-after", "14:20"])


def test_the_kept_records_are_not_ignored_by_git():
    """The records exist to be committed: no .gitignore pattern may hide them (a bare ``runs/`` once did)."""
    import shutil
    import subprocess

    from experiments.common import ROOT

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    t = lc.TEST
    path = (t.record_dir("grpo", 300) / "metrics.jsonl").relative_to(ROOT)
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", str(path)], cwd=ROOT)
    assert ignored.returncode == 1, f"{path} is ignored by git: its record would never be committed"
    run = (t.run_dir("grpo", 300) / "metrics.jsonl").relative_to(ROOT)  # the run directories stay ignored
    assert subprocess.run(["git", "check-ignore", "--no-index", "-q", str(run)], cwd=ROOT).returncode == 0


def test_a_start_says_resumed_only_after_a_logged_iteration(tmp_path, monkeypatch):
    """``run`` logs ``resume_after`` as the last iteration its run directory logged, and ``None`` where it
    begins at iteration 0 (no directory yet, or a config but no iteration: a stop before the first one);
    the report's event list says "resumed" only for the former, also for a 0 logged by the older harness."""
    t = _test(tmp_path)
    monkeypatch.setattr(lt, "git_commit", lambda: "abc1234")
    monkeypatch.setattr(lt, "train", lambda cfg, d, **kw: None)
    monkeypatch.setattr(t, "keep_record", lambda arm, seed, out: None)
    out = tmp_path / "runs"
    stopped_early = t.run_dir("gigpo", 300, out)  # config written, stopped before iteration 1
    stopped_early.mkdir(parents=True)
    (stopped_early / "config.json").write_text("{}")
    (stopped_early / "metrics.jsonl").write_text("")
    stopped_late = t.run_dir("gated_bepo", 300, out)  # stopped after iteration 4
    _write(stopped_late, 0.25, 0.5, 4)
    (stopped_late / "config.json").write_text("{}")
    t.run(out, seeds=(300,))
    starts = [json.loads(line) for line in (tmp_path / "results" / "log.jsonl").read_text().splitlines()]
    starts = {e["arm"]: e for e in starts if e["event"] == "start"}
    assert {a: starts[a]["resume_after"] for a in lc.ARMS} == {"grpo": None, "gigpo": None, "gated_bepo": 4}
    lines = {a: lt.event_line(starts[a]) for a in lc.ARMS}
    assert lines["gated_bepo"].endswith("start gated_bepo s300 (commit abc1234, resumed after iteration 4)")
    assert lines["gigpo"].endswith("start gigpo s300 (commit abc1234)")
    older = {**starts["gigpo"], "resume_after": 0}
    assert "resumed" not in lt.event_line(older)
    note = {"time": "t", "event": "note", "text": "why"}
    assert lt.event_line(note) == "- t: note: why"


def test_a_kept_record_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    t = _test(tmp_path)
    out = tmp_path / "runs"
    _finished_run(t.run_dir("grpo", 300, out), "grpo", 300)
    rec = t.keep_record("grpo", 300, out)
    before = {n: (rec / n).read_bytes() for n in lt.RECORD_FILES if (rec / n).exists()}
    calls = []

    def dies_on_the_second_file(path, text):  # the copy dies after one file of the set
        calls.append(path)
        if len(calls) == 2:
            raise OSError("killed")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "changed")

    monkeypatch.setattr(lt, "write_text", dies_on_the_second_file)
    with pytest.raises(OSError, match="killed"):
        t.keep_record("grpo", 300, out)
    assert {n: (rec / n).read_bytes() for n in before} == before  # the old set, whole
    assert sorted(p.name for p in rec.parent.iterdir()) == [rec.name]  # no half-made folder left


def test_a_cut_last_log_line_is_the_last_event_incomplete(tmp_path):
    from experiments import confirmatory as cf

    cf._log(tmp_path, event="start", arm="grpo", chunk=0)
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"time": "2026-12-06 05:00:00", "event": "fin')  # a crash mid-append
    with pytest.warns(RuntimeWarning, match="the last event is incomplete"):
        events = cf._events(tmp_path)
    assert [e["event"] for e in events] == ["start"]
    (tmp_path / "log.jsonl").write_text('{"event": "st\n' + json.dumps({"event": "finish"}) + "\n")
    with pytest.raises(ValueError, match="line 1 of 2 is not a JSON event"):
        cf._events(tmp_path)


def _timed_log(results, hours, *, resumed=()):
    """A log of whole runs of ``hours`` each, one after another from 2026-12-04 10:00 (the runs of the first
    test's order; the i-th in ``resumed`` is logged as resumed after iteration 4)."""
    from datetime import datetime, timedelta

    at, lines = datetime(2026, 12, 4, 10), []
    runs = [(a, s) for s in lc.SEEDS for a in lc.ARMS]
    for i, h in enumerate(hours):
        arm, seed = runs[i]
        stamp = lambda t: t.strftime(lt.LOG_TIME_FORMAT)
        lines += [{"time": stamp(at), "event": "start", "arm": arm, "seed": seed, "commit": "c",
                   "resume_after": 4 if i in resumed else None},
                  {"time": stamp(at + timedelta(hours=h)), "event": "finish", "arm": arm, "seed": seed, "commit": "c"}]
        at += timedelta(hours=h)
    results.mkdir(parents=True, exist_ok=True)
    (results / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return lines


def test_a_runs_expected_hours_are_the_mean_of_the_last_whole_runs(tmp_path):
    ev = _timed_log(tmp_path, [2.0, 1.0, 0.25, 0.5, 0.75, 1.5], resumed=(4,))
    # whole runs (from iteration 0): 2.0, 1.0, 0.25, 0.5, 1.5; the last four: 1.0, 0.25, 0.5, 1.5
    assert lt.expected_run_hours(ev) == pytest.approx((1.0 + 0.25 + 0.5 + 1.5) / 4)
    assert lt.expected_run_hours(ev, last=1) == pytest.approx(1.5)
    assert lt.expected_run_hours([]) is None


def test_the_cap_ends_a_test_and_the_report_decides_over_its_complete_seeds(tmp_path):
    t = dataclasses.replace(_test(tmp_path), cap_hours=2.5, planned_sd=5.0)
    out = tmp_path / "runs"
    with pytest.raises(ValueError, match="cap_hours"):
        dataclasses.replace(t, cap_hours=-1.0)
    with pytest.raises(SystemExit, match="no compute cap"):
        _test(tmp_path).end("why", out)
    n = lc.OVERRIDES["iterations"]
    rng = np.random.default_rng(3)
    complete, partial = lc.SEEDS[:4], lc.SEEDS[4]
    finals = {a: {s: float(rng.uniform(0.2, 0.6)) for s in complete} for a in lc.ARMS}
    def finished(arm, seed, initial, final):  # a run directory as ``train`` leaves it
        d = t.run_dir(arm, seed, out)
        _write(d, initial, final, n)
        (d / "config.json").write_text(json.dumps(t.config(arm, seed).to_dict()))
        (d / "held_out.json").write_text(json.dumps({"held_out": "disjoint"}))

    for s in complete:
        for a in lc.ARMS:
            finished(a, s, 0.3, finals[a][s])
    finished("grpo", partial, 0.25, 0.45)
    with pytest.raises(SystemExit, match="no run has finished to time it"):
        t.end("the cap", out)
    # the next run, gigpo s304, and the one after it finish seed 304: 1.5 h finished + 2 x 0.5 h = the cap
    _timed_log(t.results_dir, [0.5] * 3)
    with pytest.raises(SystemExit, match="still pays for the runs seed 304 needs"):
        t.end("the cap", out)
    assert t.report(out)["sealed"]  # sealed until the last run or the cap's end
    _timed_log(t.results_dir, [0.5] * 4)  # 2.0 h + 2 x 0.5 h > 2.5 h, though one run (2.5 h) would fit
    cap = t.cap_state(t.pending(out))
    assert not cap["fits"] and cap["seed_runs_left"] == 2
    event = t.end("the machine slowed", out)
    assert event["finished_hours"] == pytest.approx(2.0) and event["expected_run_hours"] == pytest.approx(0.5)
    with pytest.raises(SystemExit, match="already ended"):
        t.end("again", out)
    with pytest.raises(SystemExit, match="ended the test"):
        t.run(out)
    res = t.report(out)
    assert not res.get("sealed") and not res["family_complete"] and res["decided"]
    assert res["seeds_complete"] == list(complete)
    c = res["contrasts"]["gated_bepo - grpo"]
    want = [100 * (finals["gated_bepo"][s] - finals["grpo"][s]) for s in complete]
    np.testing.assert_allclose(c["per_seed"], want)
    assert abs(c["test"]["p"] - stats.ttest_1samp(want, 0.0).pvalue) < 1e-12
    assert "decision" in c["holm"] and "holm" not in res["contrasts"]["gigpo - grpo"]
    # what the complete seeds see at the protocol's SD: 80% power at Holm's first level
    assert lt.t_power(4, c["smallest_effect_at_planned_sd"], 5.0, 0.025) == pytest.approx(0.8, abs=1e-6)
    assert res["incomplete_seeds"] == {partial: {"grpo": [0.25, 0.45]}}
    md = (tmp_path / "results" / "report.md").read_text()
    assert "The compute cap ended the test" in md and "the machine slowed" in md
    assert f"Seed {partial} is left out of the tests" in md and "grpo 0.250 -> 0.450" in md


def test_the_runner_starts_no_run_past_the_cap(tmp_path, monkeypatch):
    import subprocess

    t = dataclasses.replace(_test(tmp_path), cap_hours=2.6)
    _timed_log(t.results_dir, [0.5] * 4)  # 2.0 h finished, 0.5 h a run
    left = [("gigpo", 301), ("gated_bepo", 301), ("grpo", 302)]
    monkeypatch.setattr(t, "pending", lambda out: list(left))
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: pytest.fail("a run started past the cap"))
    t.run_each_in_a_process(tmp_path)  # seed 301 needs 2 runs: 2.0 + 1.0 > 2.6, though one (2.5) would fit
    note = json.loads((t.results_dir / "log.jsonl").read_text().splitlines()[-1])
    assert note["event"] == "note" and "compute cap stops" in note["text"] and "gigpo s301" in note["text"]
    assert "2 x 0.50 h" in note["text"]
    calls = []

    def one_run(cmd, **kw):  # the seed's last run fits (2.0 + 0.5 <= 2.6): it starts
        calls.append(left.pop(0))
        return subprocess.CompletedProcess(cmd, 0)

    left[:] = [("gated_bepo", 301), ("grpo", 302), ("gigpo", 302)]
    monkeypatch.setattr(subprocess, "run", one_run)
    t.run_each_in_a_process(tmp_path)
    assert calls == [("gated_bepo", 301)]  # then seed 302's two runs would not (the log still says 2.0 h)


def test_status_says_whether_the_runs_the_next_seed_needs_fit(tmp_path, monkeypatch, capsys):
    t = dataclasses.replace(_test(tmp_path), cap_hours=2.6)
    _timed_log(t.results_dir, [0.5] * 4)  # 2.0 h finished, 0.5 h a run
    for left, want in (([("gated_bepo", 301), ("grpo", 302)], "needs 1 more run, which fits\n"),
                       ([("gigpo", 301), ("gated_bepo", 301)],
                        "needs 2 more runs, which do not fit: `end` may end the test\n"),
                       ([], "; every run finished: the test ends by itself (run report)\n")):
        monkeypatch.setattr(t, "pending", lambda out, left=left: list(left))
        t.status(tmp_path / "runs")
        lines = capsys.readouterr().out.splitlines(keepends=True)
        assert lines[0].startswith("cap: 2.00 h of finished run segments of 2.6 h; a run is expected to take 0.50 h")
        assert lines[0].endswith(want) and lines[1].startswith(f"seed {lc.SEEDS[0]}: grpo not started")
    # after the cap's end, status says the test ended (no run starts), not whether the seed's runs fit
    monkeypatch.setattr(t, "pending", lambda out: [("gigpo", 301), ("gated_bepo", 301)])
    t.log(event="end", text="the cap")
    t.status(tmp_path / "runs")
    first = capsys.readouterr().out.splitlines()[0]
    assert "; the compute cap ended the test at 20" in first and first.endswith(": no run starts (run report)")
