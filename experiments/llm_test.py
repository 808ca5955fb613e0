"""The harness of a test of estimators with a pretrained LLM, fixed in advance: every (seed, arm) run of
one recipe, one fresh process each, resumable, logged, its record kept; then the paired report.

An ``LLMTest`` holds what a protocol fixes (the recipe and its overrides, the arms, the seeds, the
primary and secondary contrasts, the endpoint) and where its runs and results live. Two programs use it:
``experiments/llm_confirmatory.py`` (the first LLM test, docs/llm-confirmatory.md) and
``experiments/llm_confirmatory_2.py`` (its pilot on training games, and the second test,
docs/llm-confirmatory-2.md). Each program's commands:

    nice python -m experiments.PROGRAM run      # every (seed, arm) run in the fixed order, each in a fresh process; resumable
    python -m experiments.PROGRAM report        # the numbers and the decision once every run finished (before: which runs finished)
    python -m experiments.PROGRAM status        # which runs finished, which started
    python -m experiments.PROGRAM note --text "..."   # a dated note in the log (a correction)
    nice python -m experiments.PROGRAM run --no-start-after "2026-12-05 14:20"   # leave no run half done at a stop
    python -m experiments.PROGRAM end --text "..."    # a test with a compute cap: the cap ends it (refused while the next seed's runs fit)

Every run is an ordinary run directory (runs/NAME/ARM_sSEED): a stopped run resumes from its newest
checkpoint when ``run`` is called again. Every start, resume and finish is logged with its commit in
``experiments/results/NAME/log.jsonl``. A finished run's record (config.json, metrics.jsonl,
held_out.json: what the report reads) is copied at once into the tracked
``experiments/results/NAME/runs/ARM_sSEED``; a run with a record there counts as finished, so a machine
that loses the ignored runs/ directory loses at most the run under way (on 2026-12-05 one lost nine
finished runs that had no such copy).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from datetime import datetime
from pathlib import Path
from typing import Optional

import numpy as np

from bepo_jax.agent.train import RunConfig, read_metrics, train
from bepo_jax.agent.train.recipes import recipe
from bepo_jax.agent.train.report import mean_ci, trailing_mean
from bepo_jax.agent.train.rundir import HELD_OUT_FILE, is_finished_run_of

from .common import RESULTS, ROOT, command, git_commit, machine, parser, write_json, write_lines, write_text
from .confirmatory import ALPHA, LOG_TIME_FORMAT, _events, _log, decision, holm, paired_test
from .formatting import count, ended_line, llm_confirmatory_lines, sealed_status, size_verdict

RECORD_FILES = ("config.json", "metrics.jsonl", HELD_OUT_FILE)  # what the report and ``pending`` read
ENDPOINTS = {"eval": "held-out", "eval_train": "training games"}  # a run's evaluations, by their metrics' prefix
EDGE = 5  # iterations averaged at each end of a run's curves (the plot's trailing window)
DEADLINE_FORMAT = "%Y-%m-%d %H:%M"  # --no-start-after, local time
POWER = 0.8  # the power at which a test states the smallest effect it sees
EXPECTED_FROM = 4  # a run's expected hours: the mean of the last this many runs that ran start to finish


@dataclasses.dataclass(kw_only=True)
class LLMTest:
    """What a protocol fixes, and where its runs live.

    name (runs/NAME, experiments/results/NAME and the program ``experiments.NAME``); protocol (its
    document); base (a recipe's name) and overrides (fields set for every run); arms (estimators, run in
    this order per seed); seeds; primary and secondary contrasts ((a, b): a - b, paired per seed, points);
    endpoint ("eval": held-out success at the last evaluation; "eval_train": the training games', for a
    pilot that reads no held-out number); toy and paper (the character policy's result and the paper's
    number per contrast, for the report); title (the report's heading); exploratory (a pilot: its
    intervals are descriptive, no Holm correction and no decision word is given); cap_hours (the
    protocol's compute cap in wall hours of finished run segments, ``wall_hours``: ``end`` may end the test
    once the runs the next run's seed needs no longer fit it, and the report then decides over the
    complete seeds);
    planned_sd (the per-seed SD in points the protocol sized its seeds with: the report states the
    smallest effect its complete seeds see at it)."""

    name: str
    protocol: str
    base: str
    overrides: dict
    arms: tuple
    seeds: tuple
    primary: tuple
    secondary: tuple = ()
    endpoint: str = "eval"
    toy: dict = dataclasses.field(default_factory=dict)
    paper: dict = dataclasses.field(default_factory=dict)
    title: str = ""
    exploratory: bool = False
    cap_hours: Optional[float] = None
    planned_sd: Optional[float] = None
    out: Optional[Path] = None
    results_dir: Optional[Path] = None

    def __post_init__(self):
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"LLMTest.endpoint={self.endpoint!r}: choose one of {', '.join(ENDPOINTS)}.")
        for a, b in self.primary + self.secondary:
            if a not in self.arms or b not in self.arms:
                raise ValueError(f"LLMTest contrast {a} - {b}: both must be arms ({', '.join(self.arms)}).")
        for field in ("cap_hours", "planned_sd"):
            v = getattr(self, field)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"LLMTest.{field}={v!r}: give a positive number of "
                                 f"{'hours' if field == 'cap_hours' else 'points'}, or None for none.")
        self.out = Path(self.out or ROOT / "runs" / self.name)
        self.results_dir = Path(self.results_dir or RESULTS / self.name)

    # -- the runs ------------------------------------------------------------------------------------
    @property
    def iterations(self) -> int:
        """Every run's length (the recipe's, or the protocol's override)."""
        return recipe(self.base).replace(**self.overrides).iterations

    def config(self, arm: str, seed: int) -> RunConfig:
        """The run config of one (arm, seed): the recipe with the protocol's overrides."""
        return recipe(self.base).replace(estimator=arm, seed=seed, **self.overrides)

    def run_dir(self, arm: str, seed: int, out: Optional[Path] = None) -> Path:
        return Path(out or self.out) / f"{arm}_s{seed}"

    def record_dir(self, arm: str, seed: int) -> Path:
        """The tracked copy of a finished run's record (``keep_record``)."""
        return self.results_dir / "runs" / f"{arm}_s{seed}"

    def keep_record(self, arm: str, seed: int, out: Optional[Path] = None) -> Path:
        """Copy the finished run's ``RECORD_FILES`` from its run directory into ``record_dir`` (each file
        written atomically); an unfinished run, or a finished run of another config, raises."""
        import shutil
        import tempfile

        src, dst = self.run_dir(arm, seed, out), self.record_dir(arm, seed)
        if not is_finished_run_of(src, self.config(arm, seed)):
            raise ValueError(f"{src} holds no finished run of ({arm}, {seed}): nothing to keep; run it first.")
        # the set is written into a folder of its own and renamed into place: a crash leaves the old record or
        # the new one, never a mix
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
        try:
            for name in RECORD_FILES:
                if (src / name).exists():
                    write_text(tmp / name, (src / name).read_text())
            old = dst.parent / f".{dst.name}.old" if dst.exists() else None
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
                dst.rename(old)
            tmp.rename(dst)
            if old is not None:
                shutil.rmtree(old)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dst

    def run_finished(self, arm: str, seed: int, out: Optional[Path] = None) -> bool:
        """The protocol's run of (arm, seed) finished: its tracked record or its run directory says so."""
        return any(is_finished_run_of(d, self.config(arm, seed))
                   for d in (self.record_dir(arm, seed), self.run_dir(arm, seed, out)))

    def pending(self, out: Optional[Path] = None, seeds=None, arms=None) -> list[tuple[str, int]]:
        """The (arm, seed) runs not finished yet, in the protocol's order."""
        return [(arm, seed) for seed in (seeds or self.seeds) for arm in (arms or self.arms)
                if not self.run_finished(arm, seed, out)]

    def log(self, **event) -> None:
        _log(self.results_dir, **event)

    def run(self, out: Optional[Path] = None, seeds=None, arms=None, *, limit: Optional[int] = None) -> None:
        """Every (seed, arm) in order, seed by seed (so a stopped test holds whole seeds first); finished
        runs are skipped, a started one resumes; at most ``limit`` runs in this process. Every event logs
        the commit this process imported its code from (read once, at its start: commits made while it
        runs do not change its code)."""
        commit = git_commit()
        ended = ended_by_cap(_events(self.results_dir))
        if ended is not None:
            raise SystemExit(f"{self.name}: the compute cap ended the test at {ended['time']}; no run starts.")
        for arm, seed in self.pending(out, seeds, arms)[:limit]:
            cfg, d = self.config(arm, seed), self.run_dir(arm, seed, out)
            resume = (d / "config.json").exists()
            done = max((r["iteration"] for r in read_metrics(d)), default=0) if resume else 0
            # a run directory with no logged iteration begins at iteration 0: a fresh start, logged as one
            self.log(event="start", arm=arm, seed=seed, commit=commit, resume_after=done or None)
            train(cfg, d, resume=resume, progress=False)
            self.keep_record(arm, seed, out)
            self.log(event="finish", arm=arm, seed=seed, commit=commit)

    def run_each_in_a_process(self, out: Optional[Path] = None, *, no_start_after: Optional[datetime] = None) -> None:
        """``run``, one run per fresh process (``run --one``) until none is pending: one process holding
        run after run grew to 14.8 GB by its fourth and was killed by the kernel's OOM killer. With
        ``no_start_after`` (local time) no run starts after that moment: a session's stop then cuts no
        run in half (a machine change between sessions would lose its checkpoints). Under a compute cap
        (``cap_hours``) no run starts unless the runs its seed still needs are expected to fit under it
        (``cap_state``)."""
        import subprocess
        import sys

        out = Path(out or self.out)
        left = self.pending(out)
        while left:
            nxt = f"{len(left)} runs left, the next {left[0][0]} s{left[0][1]}"
            if no_start_after is not None and datetime.now() > no_start_after:
                self.log(event="note", text=f"No run starts after {no_start_after:{DEADLINE_FORMAT}} "
                         f"(--no-start-after); {nxt}.")
                return
            cap = self.cap_state(left)
            if cap is not None and not cap["fits"]:
                self.log(event="note", text=f"The compute cap stops the runs: {cap['finished_hours']:.2f} h finished + "
                         f"{cap['seed_runs_left']} x {cap['expected_run_hours']:.2f} h expected (the runs seed "
                         f"{left[0][1]} still needs) > {self.cap_hours:.1f} h; {nxt} (`end` ends the test).")
                return
            r = subprocess.run([sys.executable, "-m", f"experiments.{self.name}", "run", "--one", "--out", str(out)])
            if r.returncode:
                raise SystemExit(f"{self.name}: a run's process failed (exit {r.returncode}); run again to resume.")
            now = self.pending(out)
            if now == left:
                raise SystemExit(f"{self.name}: the run {left[0]} did not finish in its process; see its log.")
            left = now

    # -- the report ----------------------------------------------------------------------------------
    def final(self, d: Path) -> Optional[dict]:
        """A finished run's numbers (None before its last evaluation): the endpoint's success at iteration 0
        and the last, per game at the last, and the curves."""
        rows = read_metrics(d) if (d / "metrics.jsonl").exists() else []
        key = f"{self.endpoint}/success_rate"
        evals = [r for r in rows if key in r]
        if len(evals) < 2 or evals[-1]["iteration"] != self.iterations:
            return None
        its = [r for r in rows if r["iteration"] > 0]

        def mean(k: str) -> float:  # nan where no iteration logged it (GRPO logs no gated share)
            values = [r[k] for r in its if k in r]
            return float(np.mean(values)) if values else float("nan")

        return {"initial": evals[0][key], "final": evals[-1][key],
                "per_game": evals[-1][f"{self.endpoint}/per_task"], "train_success": [r["success_rate"] for r in its],
                "invalid_curve": [r.get("invalid_rate", float("nan")) for r in its],
                "gated_curve": [r.get("graph/gated_share", float("nan")) for r in its],
                "invalid_rate": mean("invalid_rate"), "gated_share": mean("graph/gated_share"),
                "seconds": float(sum(r.get("step_time", 0.0) for r in its))}

    def source(self, arm: str, seed: int, out: Optional[Path] = None) -> Path:
        """Where the report reads a run: its tracked record when there is one, else its run directory."""
        rec = self.record_dir(arm, seed)
        return rec if (rec / "metrics.jsonl").exists() else self.run_dir(arm, seed, out)

    @property
    def first_level(self) -> float:
        """The level of Holm's first rejection over the primary contrasts: ALPHA / their number."""
        return ALPHA / max(1, len(self.primary))

    @property
    def sealed_until_complete(self) -> bool:
        """A test fixed in advance reads none of its numbers before every run has finished (its protocol):
        before then its report says only which runs finished and the time they took. A pilot or another
        exploratory comparison reports its numbers along the way."""
        return not self.exploratory

    def report(self, out: Optional[Path] = None) -> dict:
        """The paired report (summary.json, report.md, curves.png); sealed (no number) until every run has
        finished where ``sealed_until_complete``."""
        runs = {arm: {s: self.final(self.source(arm, s, out)) for s in self.seeds} for arm in self.arms}
        complete = [s for s in self.seeds if all(runs[a][s] is not None for a in self.arms)]
        ended = ended_by_cap(_events(self.results_dir))
        if len(complete) < len(self.seeds) and self.sealed_until_complete and ended is None:
            return self._sealed_report({a: [s for s in self.seeds if runs[a][s] is not None] for a in self.arms},
                                       complete)
        contrasts = {}
        for a, b in self.primary + self.secondary:
            diffs = [100 * (runs[a][s]["final"] - runs[b][s]["final"]) for s in complete]
            t = paired_test(diffs) if len(diffs) > 1 else None
            sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else float("nan")
            contrasts[f"{a} - {b}"] = {"primary": (a, b) in self.primary, "per_seed": diffs, "test": t, "sd": sd,
                                       "smallest_effect_at_power": None if self.exploratory or not sd > 0 else
                                       smallest_effect(len(diffs), sd, alpha=self.first_level),
                                       "smallest_effect_at_planned_sd": None if self.planned_sd is None
                                       or len(diffs) < 2 else smallest_effect(len(diffs), self.planned_sd,
                                                                              alpha=self.first_level),
                                       "paper": self.paper.get((a, b)), "toy_policy": self.toy.get((a, b)),
                                       "against_paper": None if t is None else size_verdict(
                                           (t["mean"], t["half_width"]), self.paper.get((a, b)))}
        family_complete = len(complete) == len(self.seeds)
        decided = (family_complete or ended is not None) and not self.exploratory and len(complete) > 1
        if decided:
            prim = {k: c["test"]["p"] for k, c in contrasts.items() if c["primary"]}
            for k, h in holm(prim).items():
                contrasts[k]["holm"] = {**h, "decision": decision(contrasts[k]["test"], h)}
        arms_summary = {a: {"final": [runs[a][s]["final"] for s in complete],
                            "initial": [runs[a][s]["initial"] for s in complete],
                            "invalid_rate": [runs[a][s]["invalid_rate"] for s in complete],
                            "gated_share": [runs[a][s]["gated_share"] for s in complete],
                            "hours": sum(r["seconds"] for r in runs[a].values() if r) / 3600,
                            **change_over_the_run([runs[a][s] for s in complete])} for a in self.arms}
        curves = lambda key: {a: [runs[a][s][key] for s in complete] for a in self.arms}
        partial = {s: {a: [runs[a][s]["initial"], runs[a][s]["final"]] for a in self.arms if runs[a][s] is not None}
                   for s in self.seeds if s not in complete and any(runs[a][s] is not None for a in self.arms)}
        return self._write({"seeds_complete": complete, "family_complete": family_complete, "decided": decided,
                            "ended_by_cap": ended, "incomplete_seeds": partial, "contrasts": contrasts,
                            "arms_summary": arms_summary, "curves": curves("train_success"),
                            "invalid_curves": curves("invalid_curve"), "gated_curves": curves("gated_curve")})

    def _header(self) -> dict:
        """What every summary states first: the command, the protocol and what it fixed."""
        cfg = self.config(self.arms[0], self.seeds[0])
        return {"command": command(self.name), "protocol": self.protocol, "recipe": self.base, "arms": self.arms,
                "seeds": self.seeds, "endpoint": self.endpoint, "overrides": self.overrides,
                "iterations": self.iterations, "edge_iterations": EDGE, "power": POWER, "first_level": self.first_level,
                "cap_hours": self.cap_hours, "planned_sd": self.planned_sd,
                "evaluation": {"games": cfg.eval_tasks, "episodes": cfg.episodes_per_evaluation}}

    def _sealed_report(self, finished: dict, complete: list) -> dict:
        """The report of a test fixed in advance before its last run finished: which runs finished, every
        logged event and the wall time spent (the compute cap's accounting), and no outcome number."""
        return self._write({"sealed": True, "runs_finished": finished,
                            "runs_finished_count": sum(len(v) for v in finished.values()),
                            "runs_total": len(self.arms) * len(self.seeds), "seeds_complete": complete,
                            "family_complete": False})

    def _write(self, body: dict) -> dict:
        """The summary: the header, ``body``, the log's events, their wall hours and the machine; written as
        summary{stem}.json and report{stem}.md (a pilot's training-game report beside the held-out one), with
        curves{stem}.png where a seed is complete (a sealed report removes an earlier one)."""
        events = _events(self.results_dir)
        res = {**self._header(), **body, "events": events, "wall": wall_hours(events), "machine": machine()}
        stem = "" if self.endpoint == "eval" else f"_{self.endpoint}"
        write_json(self.results_dir / f"summary{stem}.json", res)
        write_lines(self.results_dir / f"report{stem}.md", self.markdown(res))
        curves = self.results_dir / f"curves{stem}.png"
        if res.get("sealed"):
            curves.unlink(missing_ok=True)
        elif res["seeds_complete"]:
            plot(res, curves, title=self.title or self.name)
        return res

    def markdown(self, res: dict) -> list[str]:
        lines = [f"# {self.title or self.name} ({self.protocol})", ""]
        if res.get("sealed"):
            lines += [f"`{res['command']}`; {sealed_status(res)}", "", "| arm | seeds finished |", "|---|---|"]
            lines += [f"| {a} | {', '.join(map(str, s)) or 'none'} |" for a, s in res["runs_finished"].items()]
        else:
            ended = res.get("ended_by_cap")
            lines += [f"`{res['command']}`; {len(res['seeds_complete'])} of {len(res['seeds'])} seeds complete"
                      + (". Exploratory: the intervals describe these seeds; no decision is made." if self.exploratory
                         else f". {ended_line(ended, len(res['seeds_complete']))}" if ended else ".")
                      + ("" if self.endpoint == "eval" else f" The endpoint is the {ENDPOINTS[self.endpoint]}' "
                         "success (no held-out number is read here)."), "", *llm_confirmatory_lines(res)]
            for s, arms in (res.get("incomplete_seeds") or {}).items():
                lines += ["", f"Seed {s} is left out of the tests (not every arm finished); its finished runs, "
                          f"{ENDPOINTS[self.endpoint]} success before -> after: "
                          + ", ".join(f"{a} {b:.3f} -> {f:.3f}" for a, (b, f) in arms.items()) + "."]
        w = res["wall"]
        lines += ["", f"Wall time of the run segments that ran to their finish: {w['finished_segments_hours']:.1f} h; "
                  f"{count(w['stopped_segments'], 'segment')} ended before their finish by a session stop or a killed process "
                  "(each resumed from its newest checkpoint, or began again where its checkpoints were lost; the log's "
                  f"notes say which); {w.get('finished_then_lost', 0)} finished runs were lost with their machine and "
                  "run again (counted in the hours above: their finished segments took "
                  f"{w.get('lost_finished_segments_hours', 0):.1f} h). CPU-hours: at most twice these (2 cores).",
                  "", "## Every logged start, finish and note", ""]
        lines += [event_line(e) for e in res["events"]] or ["- none yet"]
        return lines

    def cap_state(self, left: list[tuple[str, int]]) -> Optional[dict]:
        """The compute cap's accounting from the log (None without a cap): the finished hours, a run's expected
        hours (``expected_run_hours``), the runs the next of the pending runs ``left`` (``pending``) still
        needs for its seed, whether they all fit under ``cap_hours`` (finished + runs x expected <= cap): a
        seed the cap cannot complete is not begun, since the tests leave an incomplete seed out; and the log's
        ``end`` event (``ended``), or None."""
        if self.cap_hours is None:
            return None
        events = _events(self.results_dir)
        done, expected = wall_hours(events)["finished_segments_hours"], expected_run_hours(events)
        k = sum(seed == left[0][1] for _, seed in left) if left else 0
        return {"cap_hours": self.cap_hours, "finished_hours": done, "expected_run_hours": expected,
                "seed_runs_left": k, "fits": expected is None or done + k * expected <= self.cap_hours,
                "ended": ended_by_cap(events)}

    def end(self, text: str, out: Optional[Path] = None) -> dict:
        """Log that the compute cap ends the test (an ``end`` event, with the accounting that allows it): the
        report then decides over the complete seeds. Refused without a cap, after an end, once every run
        finished, or while the runs the next run's seed needs still fit under the cap."""
        left = self.pending(out)
        cap = self.cap_state(left)
        if cap is None:
            raise SystemExit(f"{self.name}: this test has no compute cap (LLMTest.cap_hours): nothing can end it "
                             "but its last run.")
        if cap["ended"] is not None:
            raise SystemExit(f"{self.name}: the compute cap already ended the test at {cap['ended']['time']}.")
        if not left:
            raise SystemExit(f"{self.name}: every run finished; the test ends by itself (run report).")
        if cap["fits"]:
            expected = ("no run has finished to time it" if cap["expected_run_hours"] is None else
                        f"{cap['seed_runs_left']} x {cap['expected_run_hours']:.2f} h expected")
            raise SystemExit(f"{self.name}: the cap still pays for the runs seed {left[0][1]} needs (the next: "
                             f"{left[0][0]} s{left[0][1]}): {cap['finished_hours']:.2f} h finished + {expected}, within "
                             f"{self.cap_hours:.1f} h; run them instead of ending the test.")
        event = {"event": "end", "text": text, "runs_left": len(left), **{k: cap[k] for k in
                                                                         ("finished_hours", "expected_run_hours",
                                                                          "seed_runs_left", "cap_hours")}}
        self.log(**event)
        return event

    def status(self, out: Optional[Path] = None) -> None:
        cap = self.cap_state(self.pending(out))
        if cap is not None:
            exp, one = cap["expected_run_hours"], cap["seed_runs_left"] == 1
            fit = (("fits" if one else "fit") if cap["fits"] else
                   ("does" if one else "do") + " not fit: `end` may end the test")
            ended = cap["ended"]
            nxt = (f"the compute cap ended the test at {ended['time']}: no run starts (run report)" if ended else
                   "every run finished: the test ends by itself (run report)" if not cap["seed_runs_left"] else
                   f"the next run's seed needs {count(cap['seed_runs_left'], 'more run')}, which {fit}")
            print(f"cap: {cap['finished_hours']:.2f} h of finished run segments of {cap['cap_hours']:.1f} h; "
                  + ("no run finished yet to time the next" if exp is None else
                     f"a run is expected to take {exp:.2f} h (the last {EXPECTED_FROM} whole runs); {nxt}"))
        for seed in self.seeds:
            row = []
            for arm in self.arms:
                d = self.run_dir(arm, seed, out)
                state = ("finished" if self.run_finished(arm, seed, out) else
                         f"at {max((r['iteration'] for r in read_metrics(d)), default=0)}"
                         if (d / "config.json").exists() else "not started")
                row.append(f"{arm} {state}")
            print(f"seed {seed}: " + ", ".join(row))

    def main(self, argv=None, doc: Optional[str] = None) -> int:
        p = parser(doc or __doc__, full=True)
        p.add_argument("action", choices=("run", "report", "status", "note", "end"))
        p.add_argument("--out", default=str(self.out), help="where the runs live")
        p.add_argument("--one", action="store_true", help="run: the next pending run only, in this process")
        p.add_argument("--no-start-after", metavar="'YYYY-MM-DD HH:MM'", type=local_time,
                       help="run: start no run after this local time (finish the one under way, then stop)")
        p.add_argument("--text", help="note: a dated note appended to the log (a correction, an event outside the "
                       "runs); end: why the cap ends the test")
        p.add_argument("--endpoint", choices=tuple(ENDPOINTS), default=self.endpoint,
                       help=f"report: the evaluation reported (default {self.endpoint}: {ENDPOINTS[self.endpoint]})")
        args = p.parse_args(argv)
        if args.action in ("note", "end") and not (args.text or "").strip():
            p.error(f"{args.action} needs --text 'what happened'")
        out = Path(args.out)
        {"run": lambda: (self.run(out, limit=1) if args.one
                         else self.run_each_in_a_process(out, no_start_after=args.no_start_after)),
         "report": lambda: dataclasses.replace(self, endpoint=args.endpoint).report(out),
         "status": lambda: self.status(out),
         "note": lambda: self.log(event="note", text=args.text.strip()),
         "end": lambda: self.end(args.text.strip(), out)}[args.action]()
        return 0


def t_power(n: int, effect: float, sd: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided one-sample t-test at level ``alpha`` with ``n`` paired differences of mean
    ``effect`` and standard deviation ``sd``: P(|T| > t_{1 - alpha/2, n-1}) with T noncentral t of n - 1
    degrees of freedom and noncentrality effect / (sd / sqrt(n))."""
    from scipy import stats

    if n < 2:
        return float("nan")
    df, nc = n - 1, effect / (sd / math.sqrt(n))
    crit = stats.t.ppf(1 - alpha / 2, df)
    lower = stats.nct.sf(crit, df, -nc)  # = P(T < -crit); the cdf form returns NaN at some large nc
    return float(stats.nct.sf(crit, df, nc) + (0.0 if math.isnan(lower) else lower))


def smallest_effect(n: int, sd: float, *, power: float = POWER, alpha: float = ALPHA) -> float:
    """The effect that ``n`` seeds see with probability ``power`` (``t_power`` solved for the effect)."""
    from scipy.optimize import brentq

    hi = sd
    while t_power(n, hi, sd, alpha) < power:  # an upper end where the power is reached
        hi *= 2
    return float(brentq(lambda d: t_power(n, d, sd, alpha) - power, 1e-9 * sd, hi))


def local_time(text: str) -> datetime:
    """``--no-start-after``'s value: a local time written as ``DEADLINE_FORMAT``."""
    try:
        return datetime.strptime(text, DEADLINE_FORMAT)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write the local time as 'YYYY-MM-DD HH:MM'") from None


def change_over_the_run(runs: list[dict]) -> dict:
    """How an arm moved over its runs (descriptive, not a tested contrast): the endpoint's change after -
    before in points with its 95% t half-width over seeds, and the training success and invalid-command
    rate averaged over the first and the last ``EDGE`` iterations (mean over seeds)."""
    if not runs:
        return {}
    edges = lambda key: [float(np.mean([r[key][:EDGE] for r in runs])), float(np.mean([r[key][-EDGE:] for r in runs]))]
    return {"held_out_change": mean_ci([100 * (r["final"] - r["initial"]) for r in runs]),
            "train_success_first_last": edges("train_success"), "invalid_rate_first_last": edges("invalid_curve")}


def wall_hours(events: list[dict]) -> dict:
    """Wall-clock hours of the runs from the log: a segment is a logged start and the next logged event;
    it counts as ``finished`` when that event is the same run's finish, else as ``stopped`` (a session
    stop or a killed process ended it: its end is not logged, and the time to the next event includes
    the pause until the restart, so only the number of such segments is reported). ``finished_then_lost``
    counts the finishes of a run that was later run again because its record was lost (their hours are
    in ``finished_segments_hours``, compute spent, and apart in ``lost_finished_segments_hours``).
    CPU-hours are at most twice the wall hours on the 2-core machine."""
    segments, stopped, finishes = _segments(events)
    later_again = lambda run, i: run in finishes[i + 1:]  # finished, then run again: its record was lost
    lost = [run for i, run in enumerate(finishes) if later_again(run, i)]
    return {"finished_segments_hours": sum(h for _, h, _, _ in segments), "stopped_segments": stopped,
            "finished_then_lost": len(lost),
            "lost_finished_segments_hours": sum(h for run, h, i, _ in segments if later_again(run, i))}


def _segments(events: list[dict]) -> tuple[list, int, list]:
    """The log's run segments (``wall_hours``): the finished ones as (run, hours, the index of its finish among
    the finishes, whether it began at iteration 0), the number stopped, and every finish's run in order."""
    at = lambda e: datetime.strptime(e["time"], LOG_TIME_FORMAT)
    acts = [e for e in events if e["event"] in ("start", "finish")]
    segments, stopped = [], 0
    finishes = [(e["arm"], e["seed"]) for e in acts if e["event"] == "finish"]
    done = 0  # finishes before the current event
    for e, nxt in zip(acts, acts[1:] + [None]):
        if e["event"] == "finish":
            done += 1
            continue
        if nxt is not None and nxt["event"] == "finish" and (nxt["arm"], nxt["seed"]) == (e["arm"], e["seed"]):
            segments.append(((e["arm"], e["seed"]), (at(nxt) - at(e)).total_seconds() / 3600, done,
                             not e.get("resume_after")))
        elif nxt is not None:
            stopped += 1
    return segments, stopped, finishes


def expected_run_hours(events: list[dict], last: int = EXPECTED_FROM) -> Optional[float]:
    """A run's expected wall hours: the mean over the last ``last`` runs that ran from iteration 0 to their
    finish in one segment (a resumed segment is part of a run); None before any did."""
    whole = [h for _, h, _, fresh in _segments(events)[0] if fresh][-last:]
    return float(np.mean(whole)) if whole else None


def ended_by_cap(events: list[dict]) -> Optional[dict]:
    """The log's ``end`` event (``LLMTest.end``: the compute cap ended the test), or None."""
    return next((e for e in events if e["event"] == "end"), None)


def plot(res: dict, path: Path, *, title: str, window: int = EDGE) -> None:
    """Training success and invalid-command rate per iteration (trailing mean over ``window``
    iterations; mean over the complete seeds with its 95% t band over seeds), and the endpoint's success
    before and after per seed (thin lines) and its mean over seeds (thick)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.8))
    axes = fig.subplots(1, 3)
    for i, arm in enumerate(res["arms"]):
        color = f"C{i}"
        for ax, key in zip(axes[:2], ("curves", "invalid_curves")):
            c = np.array([trailing_mean(x, window) for x in res[key][arm]])
            ci = np.array([mean_ci(c[:, j]) for j in range(c.shape[1])])
            x = np.arange(1, c.shape[1] + 1)
            ax.plot(x, ci[:, 0], color=color, label=arm)
            ax.fill_between(x, ci[:, 0] - np.nan_to_num(ci[:, 1]), ci[:, 0] + np.nan_to_num(ci[:, 1]), color=color,
                            alpha=0.12)
        s = res["arms_summary"][arm]
        for before, after in zip(s["initial"], s["final"]):
            axes[2].plot([i - 0.15, i + 0.15], [before, after], color=color, alpha=0.35, lw=0.8)
        axes[2].plot([i - 0.15, i + 0.15], [np.mean(s["initial"]), np.mean(s["final"])], color=color, lw=2.5,
                     marker="o")
    axes[0].set(xlabel="iteration", ylabel=f"training success (trailing mean of {window})")
    axes[1].set(xlabel="iteration", ylabel=f"invalid-command rate (trailing mean of {window})")
    axes[2].set_xticks(range(len(res["arms"])), [f"{a}\nbefore -> after" for a in res["arms"]], fontsize=7)
    axes[2].set_ylabel(f"{ENDPOINTS[res.get('endpoint', 'eval')]} success")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title}: {len(res['seeds_complete'])} of {len(res['seeds'])} seeds complete; bands: 95% t over seeds",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def event_line(e: dict) -> str:
    """One logged event as the report's list item. A start logged with ``resume_after: 0`` (older harness:
    a run directory with a config but no iteration) began at iteration 0, so it reads as a fresh start."""
    where = f" {e['arm']} s{e['seed']}" if "arm" in e else ""
    resumed = f", resumed after iteration {e['resume_after']}" if e.get("resume_after") else ""
    commit = f" (commit {e['commit']}{resumed})" if e.get("commit") else ""
    return f"- {e['time']}: {e['event']}{where}{commit}" + (f": {e['text']}" if e.get("text") else "")
