"""The confirmatory test of the paper's claims, as fixed in docs/confirmatory.md before its first run.

Two steps, resumable (finished runs and finished evaluations are read, not repeated):

    nice python -m experiments.confirmatory run   # each (arm, chunk of 4 seeds): train, then rescore on 128 + 512 levels
    python -m experiments.confirmatory report     # experiments/results/confirmatory.{json,md,png}

``replay --chunk C --iterations K`` trains chunk C's first K iterations again at the current
commit and compares them with what the chunk recorded when it ran (the units ran over many
commits and sessions: this says whether they computed the same thing).

``run`` works through the protocol's arms in order (the primary family's four arms first),
each arm's 16 seeds in four chunks of 4 (seeds 100-103, 104-107, ...: a chunk trains as one
program in ~35 min on 2 cores, then its final policies are rescored at once, so that every
finished chunk is kept in the results files: run directories do not outlive a session).
Every start and finish is appended to ``--results``/confirmatory/log.jsonl; ``report``
lists them. Nothing of the protocol is a flag: the arms, seeds, setting,
endpoint, statistic and family-wise rule live in ``claims.EXPERIMENTS["confirmatory_runs"]``
and in this file's constants. ``--arms`` only chooses which of them ``run`` works on now
(to spread the compute); ``--smoke`` is a two-iteration end-to-end check of the machinery on
other seeds and another output (never part of the results).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from bepo_jax.agent.train import mean_ci
from experiments import claims, rescore
from experiments.common import ROOT, command, git_commit, parser, write_json
from experiments.formatting import (
    CLAIMS,
    chance_line,
    confirmatory_primary,
    paired_cell,
    paper_cell,
    size_verdict,
    size_of,
)

EXPERIMENT = "confirmatory_runs"
CHUNK = 4  # seeds per chunk: the unit that trains, is rescored and is kept
RESCORE_TASKS = 640  # the recipe's 128 held-out levels, then 512 fresh ones
ALPHA = 0.05
# The paper's number (points) and its source for each contrast, from formatting.CLAIMS where it has the
# pair; the no-gate rung's contrast is the ladder's last two steps together (+7.4 + 2.1, 66.4 -> 75.9).
PAPER = {(a, b): (value, source) for _, _, value, source, a, b in CLAIMS}
PAPER[("gated_bepo", "ladder_fp_added")] = (9.5, "Gated-BEPO paper, ablation ladder, the gate and mixing steps "
                                                 "together (66.4 -> 75.9; benchmark and model not named in the "
                                                 "text we hold)")
PAPER.setdefault(("hgpo", "grpo"), (None, "no number in the text we hold"))


def experiment():
    return claims.EXPERIMENTS[EXPERIMENT]


def chunk_name(c: int) -> str:
    return f"{EXPERIMENT}_{c}"


def _register_chunks() -> int:
    """claims experiments ``confirmatory_runs_<c>``: the protocol's experiment on seeds
    first_seed + CHUNK c, ..., + CHUNK - 1 (the same config, arms and contrasts)."""
    exp = experiment()
    n = exp.seeds // CHUNK
    for c in range(n):
        claims.EXPERIMENTS[chunk_name(c)] = dataclasses.replace(
            exp, title=f"{exp.title}: seeds {exp.first_seed + CHUNK * c}-{exp.first_seed + CHUNK * c + CHUNK - 1}",
            seeds=CHUNK, first_seed=exp.first_seed + CHUNK * c)
    return n


CHUNKS = _register_chunks()


LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # each log.jsonl event's "time", local


def _log(results: Path, **event) -> None:
    """Append one event to log.jsonl, flushed to disk before returning (a crash loses at most the line
    being written, which ``_events`` then reads as incomplete)."""
    import os

    results.mkdir(parents=True, exist_ok=True)
    with open(results / "log.jsonl", "a") as f:
        f.write(json.dumps({"time": time.strftime(LOG_TIME_FORMAT), **event}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _events(results: Path) -> list[dict]:
    """The log's events in order (``_log`` appends them); none before the first run. A last line cut by
    a crash is the last event, incomplete: it is left out, with a warning that says so and quotes it
    (a cut line before the last is a damaged log and raises, naming its line)."""
    import warnings

    log_file = results / "log.jsonl"
    lines = log_file.read_text().splitlines() if log_file.exists() else []
    events = []
    for i, x in enumerate(lines):
        try:
            events.append(json.loads(x))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise ValueError(f"{log_file}: line {i + 1} of {len(lines)} is not a JSON event ({x[:60]!r}); the "
                                 "log is damaged before its end: restore it from git.") from None
            warnings.warn(f"{log_file}: the last event is incomplete (cut by a crash: {x[:60]!r}); it is left out.",
                          RuntimeWarning, stacklevel=2)
    return events


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def chunk_seeds(results: Path, c: int) -> range:
    """The seed numbers of chunk ``c`` as its results file ran them (CHUNK of them; fewer in a smoke run)."""
    info = _json(results / f"{chunk_name(c)}.json")
    return claims.EXPERIMENTS[chunk_name(c)].seed_ids(int(info.get("seeds", CHUNK)))


def chunk_done(results: Path, c: int, arm: str) -> bool:
    """Chunk ``c`` of ``arm`` is trained (its per-seed numbers in the chunk's results file) and
    rescored (each seed's final policy in the chunk's rescore file)."""
    trained = arm in _json(results / f"{chunk_name(c)}.json").get("per_seed", {})
    runs = _json(results / f"{chunk_name(c)}_rescore.json").get("runs", {})
    return trained and all(rescore.run_key(chunk_name(c), arm, s) in runs for s in chunk_seeds(results, c))


def run(arms: list[str], out: Path, results: Path, extra: list[str], chunks: int) -> None:
    """Train and rescore every (arm, chunk) not yet done, arm by arm in the protocol's order."""
    order = [a.label for a in experiment().arms]
    for arm in arms:
        for c in range(chunks):
            if chunk_done(results, c, arm):
                continue
            _log(results, event="start", arm=arm, chunk=c, commit=git_commit(), argv=extra)
            claims.main(["--experiment", chunk_name(c), "--arms", arm, "--out", str(out), "--results", str(results),
                         "--quiet", *extra])
            trained = [a for a in order if a in _json(results / f"{chunk_name(c)}.json").get("per_seed", {})]
            rescore.main(["--experiment", chunk_name(c), "--arms", ",".join(trained), "--tasks",
                          str(32 if extra else RESCORE_TASKS), "--name", f"{chunk_name(c)}_rescore", "--out",
                          str(out), "--results", str(results), *extra])
            _log(results, event="finish", arm=arm, chunk=c)


REPLAYED = ("action_entropy", "top_action_share", "gated_share")  # per-iteration series a chunk's results keep
REPLAY_COLUMNS = ("held_out_before", "train_before", *REPLAYED)  # what a replay compares, in the report's order


def unit_commits(events: list[dict]) -> dict[tuple[str, int], str]:
    """(arm, chunk) -> the commit of the start whose unit finished (the run the results hold)."""
    started, out = {}, {}
    for e in events:
        key = (e["arm"], e["chunk"])
        if e["event"] == "start":
            started[key] = e.get("commit", "unknown")
        elif e["event"] == "finish" and key in started:
            out[key] = started[key]
    return out


def replay(results: Path, c: int, arms: list[str], iterations: int, scratch: Path, extra: list[str]) -> dict:
    """Train chunk ``c`` of each arm again at this commit for its first ``iterations`` iterations (into a
    scratch directory) and compare with what the chunk's results file recorded when the unit ran, perhaps
    on another commit and machine: the initial policy's success (held-out and training levels) and, per
    seed and iteration, the action entropy, the largest action share and the gated share of records.
    Each gets the largest absolute difference over seeds and iterations; 0 means the same computation bit
    for bit. Writes ``<results>/replay_<c>.json`` (the protocol's decisions never read it)."""
    stored = _json(results / f"{chunk_name(c)}.json").get("per_seed", {})
    commits = unit_commits(_events(results))
    missing = [a for a in arms if a not in stored]
    if missing:
        raise SystemExit(f"--arms: chunk {c} of {missing} is not trained yet: nothing to replay.")
    short = [a for a in arms if min(len(x["action_entropy"]) for x in stored[a]) < iterations]
    if short:
        raise SystemExit(f"--iterations: chunk {c} of {short} recorded fewer than {iterations} iterations; "
                         "replay at most as many as it ran.")
    rows = {}
    for arm in arms:
        claims.main(["--experiment", chunk_name(c), "--arms", arm, "--out", str(scratch / "runs"), "--results",
                     str(scratch / "results"), "--quiet", "--iterations", str(iterations), *extra])
        again = _json(scratch / "results" / f"{chunk_name(c)}.json")["per_seed"][arm]
        if len(again) != len(stored[arm]):
            raise SystemExit(f"chunk {c} of {arm} recorded {len(stored[arm])} seeds and the replay trained "
                             f"{len(again)}: replay a smoke run's chunk with --smoke.")
        diffs = {k: max(abs(a[k] - b[k]) for a, b in zip(stored[arm], again))
                 for k in REPLAY_COLUMNS[:2]}
        for k in REPLAYED:
            pairs = [(np.asarray(a[k][:iterations], np.float64), np.asarray(b[k][:iterations], np.float64))
                     for a, b in zip(stored[arm], again) if a.get(k) and b.get(k)]
            if pairs:
                diffs[k] = max(float(np.abs(x - y).max()) for x, y in pairs)
        rows[arm] = {"stored_commit": commits.get((arm, c), "unknown"), "seeds": len(again),
                     "max_abs_difference": diffs}
    out = {"command": command("confirmatory", ["replay", "--chunk", str(c), "--iterations", str(iterations)]),
           "commit": git_commit(), "machine": platform.platform(), "chunk": c, "iterations": iterations, "arms": rows}
    write_json(results / f"replay_{c}.json", out, indent=1)
    return out


# -- statistics ------------------------------------------------------------------------
def paired_test(diffs) -> dict:
    """Mean, 95% Student-t half-width and the two-sided paired t-test's p-value of per-seed differences."""
    from scipy import stats

    x = np.asarray(diffs, np.float64)
    m, h = mean_ci(x)
    p = float(stats.ttest_1samp(x, 0.0).pvalue) if len(x) > 1 and x.std() > 0 else float("nan")
    return {"mean": m, "half_width": h, "p": p, "seeds": len(x), "seeds_above_0": int((x > 0).sum())}


def holm(pvalues: dict[str, float], alpha: float = ALPHA) -> dict[str, dict]:
    """Holm's step-down rule over the family: sort the p-values, reject the i-th smallest (0-based) while
    p_(i) <= alpha / (m - i); the adjusted p-value is the running max of (m - i) p_(i), capped at 1. A NaN
    p-value (a contrast that could not be tested) sorts last, is never rejected and stops the step-down
    for none before it."""
    nan = lambda k: pvalues[k] != pvalues[k]
    order = sorted(pvalues, key=lambda k: (nan(k), 0.0 if nan(k) else pvalues[k]))
    m, running, rejecting, out = len(order), 0.0, True, {}
    for i, name in enumerate(order):
        p = pvalues[name]
        if nan(name):
            out[name] = {"holm_p": float("nan"), "rejected": False}
            continue
        running = max(running, min(1.0, (m - i) * p))
        rejecting = rejecting and p <= alpha / (m - i)
        out[name] = {"holm_p": running, "rejected": bool(rejecting)}
    return out


def decision(test: dict, h: dict) -> str:
    if not h["rejected"]:
        return "not confirmed"
    return "confirmed" if test["mean"] > 0 else "contradicted"


# -- report ----------------------------------------------------------------------------
def _merged(results: Path, chunks: int) -> tuple[dict, dict, list[int]]:
    """The chunks' per-seed numbers and rescored runs, per arm over the chunks in order, for the arms
    every chunk holds (an arm with a chunk missing is not complete)."""
    per_seed, fresh, seeds = {}, {}, []
    files = [(_json(results / f"{chunk_name(c)}.json"), _json(results / f"{chunk_name(c)}_rescore.json"))
             for c in range(chunks)]
    for a in experiment().arms:
        if not all(a.label in f.get("per_seed", {}) for f, _ in files):
            continue
        per_seed[a.label] = [x for f, _ in files for x in f["per_seed"][a.label]]
        keys = [(r.get("runs", {}), rescore.run_key(chunk_name(c), a.label, s)) for c, (_, r) in enumerate(files)
                for s in chunk_seeds(results, c)]
        fresh[a.label] = [runs[k]["fresh"] for runs, k in keys] if all(k in runs for runs, k in keys) else None
    seeds = [s for c in range(chunks) for s in chunk_seeds(results, c)]
    return per_seed, fresh, seeds


def _curves(per_seed: list[dict], seeds: list[int]) -> dict:
    """Per seed, per iteration: training success and the gated share of records (from the runs'
    metrics as the chunk results keep them: ``curve`` and ``gated_share``)."""
    return {s: {"iteration": [c[0] for c in x["curve"]], "held_out": [c[2] for c in x["curve"]],
                "gated_share": x.get("gated_share", [])} for s, x in zip(seeds, per_seed)}


def report(results: Path, chunks: int, out_results: Path) -> dict:
    exp = experiment()
    per_seed, fresh, seeds = _merged(results, chunks)
    primary = [c.name for c in claims.CONFIRMATORY_PRIMARY]

    def contrast(c) -> Optional[dict]:
        a, b = c.terms[0][0], c.terms[1][0]
        if a not in per_seed or b not in per_seed:
            return None
        row = {"terms": [a, b], "paper": PAPER.get((a, b), (None, "no number in the text we hold"))}
        for key, getter in (("fresh_512", lambda arm: fresh[arm]),
                            ("held_out_128", lambda arm: [x["held_out_after"] for x in per_seed[arm]]),
                            ("train", lambda arm: [x["train_after"] for x in per_seed[arm]])):
            xa, xb = getter(a), getter(b)
            if xa is None or xb is None:
                continue
            t = paired_test(100 * (np.asarray(xa) - np.asarray(xb)))
            t["size_verdict"] = size_verdict((t["mean"], t["half_width"]), row["paper"][0])
            row[key] = t
        return row

    table = {c.name: contrast(c) for c in exp.contrasts}
    table = {k: v for k, v in table.items() if v is not None}
    endpoint = {k: v["fresh_512"]["p"] for k, v in table.items() if k in primary and "fresh_512" in v}
    family_complete = len(endpoint) == len(primary)
    adjusted = holm(endpoint) if family_complete else {}
    for k, h in adjusted.items():
        table[k]["holm"] = {**h, "decision": decision(table[k]["fresh_512"], h)}
    curves = {a: _curves(per_seed[a], seeds) for a in per_seed}
    events = _events(results)
    summary = dict(command=command("confirmatory", ["report"]), machine=platform.platform(),
                   protocol="docs/confirmatory.md", seeds=seeds, arms=[a.label for a in exp.arms],
                   arms_done=[a for a in per_seed], rescored=[k for k, v in fresh.items() if v is not None],
                   primary=primary, family_complete=family_complete, alpha=ALPHA, contrasts=table, events=events,
                   gated_share=_gated_summary(curves), curves=curves,
                   replays=[r for c in range(chunks) if (r := _json(results / f"replay_{c}.json"))],
                   per_seed={a: [{k: x[k] for k in ("held_out_before", "held_out_after", "train_before",
                                                     "train_after")} for x in per_seed[a]] for a in per_seed},
                   chunks=chunks, per_task_scores="experiments/results/confirmatory/confirmatory_runs_<c>_rescore.json "
                                                 "(runs/<run>/per_task)")
    out_results.mkdir(parents=True, exist_ok=True)
    write_json(out_results / "confirmatory.json", summary, indent=1)
    (out_results / "confirmatory.md").write_text(_markdown(summary))
    _plot(curves, out_results / "confirmatory.png")
    return summary


def _gated_summary(curves: dict) -> dict:
    """Per arm: the mean over seeds of the gated share at the first, middle and last iteration."""
    out = {}
    for arm, per in curves.items():
        series = [c["gated_share"] for c in per.values() if c["gated_share"]]
        if not series:
            continue
        n = min(len(x) for x in series)
        arr = np.asarray([x[:n] for x in series], np.float64)
        out[arm] = {"first": float(arr[:, 0].mean()), "middle": float(arr[:, n // 2].mean()),
                    "last": float(arr[:, -1].mean()), "iterations": n}
    return out


def _markdown(s: dict) -> str:
    lines = ["# The confirmatory test (protocol: docs/confirmatory.md)", "",
             f"Command: `{s['command']}` (after `run` and `rescore`).  ",
             f"Arms with every seed trained: {', '.join(s['arms_done']) or 'none'} ({len(s['arms_done'])} of the "
             f"{len(s['arms'])} arms: {', '.join(s['arms'])}); rescored on 512 fresh levels: "
             f"{', '.join(s['rescored']) or 'none'}. Seeds {s['seeds'][0]}-{s['seeds'][-1]}.", "",
             "Every number: points of success, the mean over seeds of the per-seed paired difference +- the 95% "
             "Student-t half-width over seeds; p: the two-sided paired t-test. The primary endpoint is the final "
             "policy's success on the seed's 512 fresh held-out levels; decisions are Holm's over the four primary "
             f"contrasts at family-wise alpha {s['alpha']}.", "",
             "## Primary family", "", confirmatory_primary(s)]
    lines += ["", "## Secondary contrasts (reported, no family-wise decision)", "",
              "| contrast | 512 fresh levels | paper | against the paper's number | 128 held-out levels |",
              "|---|---|---|---|---|"]
    n = 0
    for name, r in s["contrasts"].items():
        if name in s["primary"]:
            continue
        n += 1
        fresh = r.get("fresh_512")
        lines.append(f"| {name} | {paired_cell(fresh)} | {paper_cell(r)} | "
                     f"{size_of(fresh, r)} | {paired_cell(r.get('held_out_128'))} |")
    lines += ["", chance_line(n), "", "## The gate's regime: share of records the gate admitted", "",
              "| arm | first iteration | middle | last |", "|---|---|---|---|"]
    for arm, g in s["gated_share"].items():
        lines.append(f"| {arm} | {g['first']:.2f} | {g['middle']:.2f} | {g['last']:.2f} |")
    if s.get("replays"):
        lines += ["", "## Replays: a chunk's first iterations trained again at a later commit", "",
                  "`python -m experiments.confirmatory replay --chunk C --iterations K`: the largest absolute "
                  "difference from what the chunk recorded, over its seeds and first K iterations (0: bit for bit).",
                  "", "| chunk | arm | recorded at | replayed at | K | " + " | ".join(REPLAY_COLUMNS) + " |",
                  "|---" * (5 + len(REPLAY_COLUMNS)) + "|"]
        for r in s["replays"]:
            for arm, x in r["arms"].items():
                d = x["max_abs_difference"]
                lines.append(f"| {r['chunk']} | {arm} | {x['stored_commit']} | {r['commit']} | {r['iterations']} | " +
                             " | ".join(f"{d[k]:.2g}" if k in d else "n/a" for k in REPLAY_COLUMNS) + " |")
    lines += ["", "## Every run started", ""]
    lines += [f"- {e['time']}: {e['event']} {e['arm']}, chunk {e.get('chunk')}" +
              (f" (commit {e['commit']})" if e.get("commit") else "") + (f": {e['reason']}" if e.get("reason") else "")
              for e in s["events"]] or ["- none yet"]
    return "\n".join(lines) + "\n"


def _plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (arm, per) in enumerate(curves.items()):
        color = f"C{i % 10}"  # one color per arm in both panels
        series = [c for c in per.values() if c["held_out"]]
        if not series:
            continue
        n = min(len(c["held_out"]) for c in series)
        axes[0].plot(series[0]["iteration"][:n], np.mean([c["held_out"][:n] for c in series], axis=0), "o-",
                     color=color, label=arm)
        g = [c["gated_share"] for c in series if c["gated_share"]]
        if g:
            m = min(len(x) for x in g)
            axes[1].plot(np.arange(1, m + 1), np.mean([x[:m] for x in g], axis=0), color=color, label=arm)
    axes[0].set(xlabel="iteration", ylabel="held-out success, 128 levels (mean over seeds)")
    axes[1].set(xlabel="iteration", ylabel="gated share of records (mean over seeds)")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    p = parser(__doc__)
    p.add_argument("step", choices=("run", "report", "replay"))
    p.add_argument("--arms", default="", help="run: which of the protocol's arms to work on now "
                                               "(default: all, in the protocol's order)")
    p.add_argument("--out", default=str(ROOT / "runs" / "claims"))
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"),
                   help="the chunks' files go to <results>/confirmatory/, the report to <results>/")
    p.add_argument("--smoke", action="store_true", help="the first chunk only, 2 iterations, 2 seeds, claims.py's "
                                                        "smoke scale, into --out and --results you give "
                                                        "(a check of the machinery, not the test)")
    p.add_argument("--chunk", type=int, default=0, help="replay: which chunk (0-3)")
    p.add_argument("--iterations", type=int, default=3, help="replay: how many of its first iterations")
    args = p.parse_args(argv)
    exp = experiment()
    labels = [a.label for a in exp.arms]
    arms = [x for x in args.arms.split(",") if x] or labels
    bad = [x for x in arms if x not in labels]
    if bad:
        raise SystemExit(f"--arms: {bad} are not arms of the protocol ({', '.join(labels)}).")
    out, results = Path(args.out), Path(args.results)
    smoke = ["--seeds", "2", "--iterations", "2", "--scale", "smoke"] if args.smoke else []
    if args.smoke and (out == ROOT / "runs" / "claims" or results == ROOT / "experiments" / "results"):
        raise SystemExit("--smoke writes elsewhere: give --out and --results of a scratch directory.")
    chunks = 1 if args.smoke else CHUNKS
    if args.step == "run":
        run([a for a in labels if a in arms], out, results / "confirmatory", smoke, chunks)
    elif args.step == "replay":
        if not 0 <= args.chunk < chunks or not 1 <= args.iterations <= exp.iterations:
            raise SystemExit(f"--chunk must be in 0..{chunks - 1} and --iterations in 1..{exp.iterations}.")
        with tempfile.TemporaryDirectory() as scratch:
            replay(results / "confirmatory", args.chunk, [a for a in labels if a in arms], args.iterations,
                   Path(scratch), ["--seeds", "2", "--scale", "smoke"] if args.smoke else [])
    else:
        report(results / "confirmatory", chunks, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
