"""The confirmatory test of the paper's claims, as fixed in docs/confirmatory.md before its first run.

Three steps, each resumable (finished runs and finished evaluations are read, not repeated):

    python experiments/confirmatory.py run        # train the six arms x 16 seeds (claims.py confirmatory_runs)
    python experiments/confirmatory.py rescore    # every final policy on its seed's 128 + 512 fresh held-out levels
    python experiments/confirmatory.py report     # experiments/results/confirmatory.{json,md,png}

``run`` trains the arms in the protocol's order (the primary family's four arms first), each
arm's 16 seeds as one program, and appends every start and finish to ``--out``/log.jsonl;
``report`` lists them. Nothing of the protocol is a flag: the arms, seeds, setting,
endpoint, statistic and family-wise rule live in ``claims.EXPERIMENTS["confirmatory_runs"]``
and in this file's constants. ``--arms`` only chooses which of them ``run`` works on now
(to spread the compute); ``--smoke`` is a two-iteration end-to-end check of the machinery on
other seeds and another output (never part of the results).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bepo_jax.train import mean_ci, read_metrics  # noqa: E402
from experiments import claims, rescore  # noqa: E402
from experiments.readme_tables import CLAIMS, chance_line, points, size_verdict  # noqa: E402

EXPERIMENT = "confirmatory_runs"
RESCORE_NAME = "confirmatory_rescore"
RESCORE_TASKS = 640  # the recipe's 128 held-out levels, then 512 fresh ones
ALPHA = 0.05
# The paper's number (points) and its source for each contrast, from readme_tables.CLAIMS where it has the
# pair; the no-gate rung's contrast is the ladder's last two steps together (+7.4 + 2.1, 66.4 -> 75.9).
PAPER = {(a, b): (value, source) for _, _, value, source, a, b in CLAIMS}
PAPER[("gated_bepo", "ladder_fp_added")] = (9.5, "Gated-BEPO paper, ablation ladder, the gate and mixing steps "
                                                 "together (66.4 -> 75.9; benchmark and model not named in the "
                                                 "text we hold)")
PAPER.setdefault(("hgpo", "grpo"), (None, "no number in the text we hold"))


def experiment():
    return claims.EXPERIMENTS[EXPERIMENT]


def _log(out: Path, **event) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log.jsonl", "a") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), **event}) + "\n")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(arms: list[str], out: Path, results: Path, extra: list[str]) -> None:
    for arm in arms:
        _log(out / EXPERIMENT, event="start", arm=arm, commit=_commit(), argv=extra)
        claims.main(["--experiment", EXPERIMENT, "--arms", arm, "--out", str(out), "--results", str(results),
                     "--quiet", *extra])
        _log(out / EXPERIMENT, event="finish", arm=arm)


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
    p_(i) <= alpha / (m - i); the adjusted p-value is the running max of (m - i) p_(i), capped at 1."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, rejecting, out = len(order), 0.0, True, {}
    for i, name in enumerate(order):
        p = pvalues[name]
        running = max(running, min(1.0, (m - i) * p))
        rejecting = rejecting and p <= alpha / (m - i)
        out[name] = {"holm_p": running, "rejected": bool(rejecting)}
    return out


def decision(test: dict, h: dict) -> str:
    if not h["rejected"]:
        return "not confirmed"
    return "confirmed" if test["mean"] > 0 else "contradicted"


# -- report ----------------------------------------------------------------------------
def _fresh_scores(rescored: dict, arm: str, seeds) -> Optional[list[float]]:
    runs = rescored.get("runs", {})
    keys = [rescore.run_key(EXPERIMENT, arm, s) for s in seeds]
    return [runs[k]["fresh"] for k in keys] if all(k in runs for k in keys) else None


def _curves(out: Path, arm: str, seeds) -> dict:
    """Per seed, per iteration: training success and the gated share of records (graph/gated_share)."""
    exp = experiment()
    res = {}
    for s, d in exp.run_dirs(out / EXPERIMENT, arm, len(seeds)).items():
        rows = read_metrics(d) if (d / "metrics.jsonl").exists() else []
        res[s] = {"iteration": [r["iteration"] for r in rows if "success_rate" in r],
                  "success": [r["success_rate"] for r in rows if "success_rate" in r],
                  # the iterations' batches (iteration 0 is an evaluation only; GRPO builds no graph)
                  "gated_iteration": [r["iteration"] for r in rows if "graph/gated_share" in r],
                  "gated_share": [r["graph/gated_share"] for r in rows if "graph/gated_share" in r]}
    return res


def report(out: Path, results: Path) -> dict:
    exp = experiment()
    runs_file = results / f"{EXPERIMENT}.json"
    if not runs_file.exists():
        raise SystemExit(f"{runs_file} is missing: run `python experiments/confirmatory.py run` first.")
    runs = json.loads(runs_file.read_text())
    rescored_file = results / f"{RESCORE_NAME}.json"
    rescored = json.loads(rescored_file.read_text()) if rescored_file.exists() else {}
    per_seed = runs["per_seed"]
    seeds = list(exp.seed_ids(int(runs["seeds"])))
    fresh = {a.label: _fresh_scores(rescored, a.label, seeds) for a in exp.arms if a.label in per_seed}
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
    curves = {a: _curves(out, a, seeds) for a in per_seed}
    log_file = out / EXPERIMENT / "log.jsonl"
    events = [json.loads(x) for x in log_file.read_text().splitlines()] if log_file.exists() else []
    summary = dict(command="python experiments/confirmatory.py report", machine=platform.platform(),
                   protocol="docs/confirmatory.md", seeds=seeds, arms=[a.label for a in exp.arms],
                   arms_done=sorted(per_seed), rescored=sorted(k for k, v in fresh.items() if v is not None),
                   family_complete=family_complete, alpha=ALPHA, contrasts=table, events=events,
                   gated_share=_gated_summary(curves), curves=curves,
                   per_seed={a: [{k: x[k] for k in ("held_out_before", "held_out_after", "train_before",
                                                     "train_after")} for x in per_seed[a]] for a in per_seed},
                   per_task_scores=f"experiments/results/{RESCORE_NAME}.json (runs/<run>/per_task)")
    results.mkdir(parents=True, exist_ok=True)
    (results / "confirmatory.json").write_text(json.dumps(summary, indent=1))
    (results / "confirmatory.md").write_text(_markdown(summary, primary))
    _plot(curves, results / "confirmatory.png")
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


def _cell(t: Optional[dict]) -> str:
    if t is None:
        return "not yet"
    p = "n/a" if np.isnan(t["p"]) else f"{t['p']:.3f}"
    return f"{points((t['mean'] / 100, t['half_width'] / 100))} (p {p}, {t['seeds_above_0']}/{t['seeds']} seeds > 0)"


def _markdown(s: dict, primary: list[str]) -> str:
    lines = ["# The confirmatory test (protocol: docs/confirmatory.md)", "",
             f"Command: `{s['command']}` (after `run` and `rescore`).  ",
             f"Arms done: {', '.join(s['arms_done']) or 'none'} of {', '.join(s['arms'])}; rescored on 512 fresh "
             f"levels: {', '.join(s['rescored']) or 'none'}. Seeds {s['seeds'][0]}-{s['seeds'][-1]}.", "",
             "Every number: points of success, the mean over seeds of the per-seed paired difference +- the 95% "
             "Student-t half-width over seeds; p: the two-sided paired t-test. The primary endpoint is the final "
             "policy's success on the seed's 512 fresh held-out levels; decisions are Holm's over the four primary "
             f"contrasts at family-wise alpha {s['alpha']}.", "",
             "## Primary family", "",
             "| contrast | 512 fresh levels (primary) | Holm-adjusted p | decision | paper (source) | against the "
             "paper's number | 128 held-out levels | training tasks |", "|---|---|---|---|---|---|---|---|"]
    for name in primary:
        r = s["contrasts"].get(name)
        if r is None:
            lines.append(f"| {name} | arms not run yet | | | | | | |")
            continue
        h = r.get("holm")
        fresh = r.get("fresh_512")
        value, source = r["paper"]
        lines.append(f"| {name} | {_cell(fresh)} | {h['holm_p']:.3f} | **{h['decision']}** | "
                     f"{'none' if value is None else f'{value:+.1f}'} ({source}) | "
                     f"{fresh['size_verdict'] if fresh else ''} | {_cell(r.get('held_out_128'))} | "
                     f"{_cell(r.get('train'))} |" if h else
                     f"| {name} | {_cell(fresh)} | family incomplete | | {value} ({source}) | | "
                     f"{_cell(r.get('held_out_128'))} | {_cell(r.get('train'))} |")
    if not s["family_complete"]:
        lines += ["", "The family is not complete yet (arms or rescoring missing): no decision is made."]
    lines += ["", "## Secondary contrasts (reported, no family-wise decision)", "",
              "| contrast | 512 fresh levels | paper | against the paper's number | 128 held-out levels |",
              "|---|---|---|---|---|"]
    n = 0
    for name, r in s["contrasts"].items():
        if name in primary:
            continue
        n += 1
        value, source = r["paper"]
        fresh = r.get("fresh_512")
        lines.append(f"| {name} | {_cell(fresh)} | {'none' if value is None else f'{value:+.1f}'} ({source}) | "
                     f"{fresh['size_verdict'] if fresh else ''} | {_cell(r.get('held_out_128'))} |")
    lines += ["", chance_line(n), "", "## The gate's regime: share of records the gate admitted", "",
              "| arm | first iteration | middle | last |", "|---|---|---|---|"]
    for arm, g in s["gated_share"].items():
        lines.append(f"| {arm} | {g['first']:.2f} | {g['middle']:.2f} | {g['last']:.2f} |")
    lines += ["", "## Every run started", ""]
    lines += [f"- {e['time']}: {e['event']} {e['arm']}" + (f" (commit {e['commit']})" if e.get("commit") else "")
              for e in s["events"]] or ["- none yet"]
    return "\n".join(lines) + "\n"


def _plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, per in curves.items():
        series = [c for c in per.values() if c["success"]]
        if not series:
            continue
        n = min(len(c["success"]) for c in series)
        its = series[0]["iteration"][:n]
        axes[0].plot(its, np.mean([c["success"][:n] for c in series], axis=0), label=arm)
        g = [c for c in series if c["gated_share"]]
        if g:
            m = min(len(c["gated_share"]) for c in g)
            axes[1].plot(g[0]["gated_iteration"][:m], np.mean([c["gated_share"][:m] for c in g], axis=0), label=arm)
    axes[0].set(xlabel="iteration", ylabel="training success (mean over seeds)")
    axes[1].set(xlabel="iteration", ylabel="gated share of records (mean over seeds)")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=("run", "rescore", "report"))
    p.add_argument("--arms", default="", help="run / rescore: which of the protocol's arms to work on now "
                                               "(default: all, in the protocol's order)")
    p.add_argument("--out", default=str(ROOT / "runs" / "claims"))
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    p.add_argument("--smoke", action="store_true", help="2 iterations, 2 seeds, 4 groups, 16 held-out levels, into "
                                                        "--out and --results you give (a check, not the test)")
    args = p.parse_args(argv)
    exp = experiment()
    labels = [a.label for a in exp.arms]
    arms = [x for x in args.arms.split(",") if x] or labels
    bad = [x for x in arms if x not in labels]
    if bad:
        raise SystemExit(f"--arms: {bad} are not arms of the protocol ({', '.join(labels)}).")
    out, results = Path(args.out), Path(args.results)
    smoke = ["--seeds", "2", "--iterations", "2", "--groups", "4", "--eval-tasks", "16"] if args.smoke else []
    if args.smoke and (out == ROOT / "runs" / "claims" or results == ROOT / "experiments" / "results"):
        raise SystemExit("--smoke writes elsewhere: give --out and --results of a scratch directory.")
    if args.step == "run":
        run([a for a in labels if a in arms], out, results, smoke)
    elif args.step == "rescore":
        rescore.main(["--experiment", EXPERIMENT, "--tasks", str(32 if args.smoke else RESCORE_TASKS),
                      "--name", RESCORE_NAME, "--out", str(out), "--results", str(results),
                      *(["--arms", ",".join(a for a in labels if a in arms)] if args.arms else []), *smoke])
    else:
        report(out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
