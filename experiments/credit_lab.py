"""The credit-lab experiments: every estimator against the exact advantage on every lab
environment, and Gated-BEPO's open knobs one at a time.

Two sweeps per environment (each a ``bepo-jax credit`` run, resumable):

* ``suite``: the registry's estimators (GRPO, GiGPO, GraphGPO, HGPO, GAGPO, G2PO, Gated-BEPO and its
  ablations) at K = 2, 4, 8, 16, 32 under the uniform policy (Sokoban also under a
  Boltzmann policy over Q*, temperature 0.25 of the success reward, and at time limits
  6 and 10);
* ``knobs``: Gated-BEPO with one field changed from the default — lam, eta_gated, w,
  min_successors, history — at K = 4 and 8, uniform policy.

Then ``summary.{md,json}`` ranks the knob values by correlation with A^pi (mean over the
environments of each environment's mean over batches) and answers the three questions:
does the gate help, does the fixed point beat the Monte-Carlo values, which knob values
give the best credit.

    python -m experiments.credit_lab                 # ~20 min on 2 CPU cores (measured: 17 min)
    python -m experiments.credit_lab --scale small   # ~4 min (fewer batches and groups)
    python -m experiments.credit_lab --only key_door,bump --out /tmp/lab
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from bepo_jax.lab.quality import DEFAULT_SUITE, paired_difference
from bepo_jax.lab.report import LAB_ENVS, SweepConfig, run_sweep, write_outputs

PROTOCOL_ENVS = ("decisions",)  # swept by experiments/credit_protocol.py, not part of this study's averages
from experiments.common import ROOT, command, parser, write_json, write_text

KNOBS = {
    "lam": [0.0, 0.25, 0.5, 0.75, 0.95, 1.0],
    "eta_gated": [0.0, 0.25, 0.5, 1.0],
    "w": [0.25, 0.5, 1.0, 2.0],
    "min_successors": [2, 3],
    "history": [0, 1, 2],
}
DEFAULTS = {"lam": 0.5, "eta_gated": 0.5, "w": 1.0, "min_successors": 2, "history": 0}
SCALES = {"full": dict(groups=32, batches=8, tasks=8), "small": dict(groups=16, batches=4, tasks=4)}


def knob_specs() -> list[str]:
    out = ["default=gated_bepo", "grpo"]
    for knob, values in KNOBS.items():
        out += [f"{knob}_{v}=gated_bepo:{knob}={v}" for v in values if v != DEFAULTS[knob]]
    return out


def sweeps(env: str, scale: dict, seed: int) -> dict[str, SweepConfig]:
    temps = ("inf", 0.25) if env == "sokoban" else ("inf",)
    horizons = (6, 10) if env == "sokoban" else ()
    suite = SweepConfig(env=env, estimators=tuple(s.label for s in DEFAULT_SUITE), group_sizes=(2, 4, 8, 16, 32),
                        temperatures=temps, horizons=horizons, seed=seed, **scale)
    knobs = SweepConfig(env=env, estimators=tuple(knob_specs()), group_sizes=(4, 8), seed=seed, **scale)
    return {"suite": suite, "knobs": knobs}


G2PO_VS = ("gated_bepo", "gigpo", "gagpo")  # G2PO's nearest relatives: fixed point + gate, step groups, MC + GAE
# each later estimator against its nearest relatives, paired per batch: G2PO (the authors' version and the one
# reconstructed from the abstract) as above; ProxMO against the gate, its own step groups' estimator and the
# ungated fixed point (its soft kernel is an implicit gate); ECPO (from the equations its summaries give, and the
# earlier reconstruction from its abstract) the same way (its variance gate against Gated-BEPO's successor gate);
# PGPO (a one-step TD residual on Monte-Carlo state means) against the ladder's rungs it sits between: the MC rung
# with the gate, GAE on the same residuals (GAGPO) and the ungated fixed point
GATE_VS = ("gated_bepo", "gigpo", "bepo_nogate")
LADDER_VS = ("bepo_mc", "gagpo", "bepo_nogate")
# Gated-BEPO itself against the outcome baseline and the step-group estimators it is said to beat (docs/results.md)
BASELINES_VS = ("grpo", "gigpo", "hgpo")
RIVALS = {"gated_bepo": BASELINES_VS, "g2po": G2PO_VS, "g2po_abstract": G2PO_VS, "proxmo": GATE_VS, "ecpo": GATE_VS, "ecpo_abstract": GATE_VS,
          "pgpo": LADDER_VS}


def _tag(env: str, r: dict) -> str:
    return f"{env} H={r['horizon']} T={r['temperature']} K={r['group_size']}"


def summarize(results: dict[str, dict[str, dict]]) -> dict:
    """results[env][sweep] -> the decision tables (module docstring). Every knob is
    compared with the default on the same batches: paired differences."""
    summary = {"knobs": {}, "gate": {}, "values": {}, "suite": {}, "rivals": {name: {} for name in RIVALS}}
    for k in (4, 8):
        rows = {}
        for env, res in results.items():
            row = next((r for r in res["knobs"]["rows"] if r["group_size"] == k), None)
            if row is None:
                continue
            for lab in row["estimators"]:
                for m in ("pearson", "grad_cos", "affine_err", "sign_acc"):
                    rows.setdefault(lab, {}).setdefault(m, {})[env] = row["estimators"][lab][m]["mean"]
                    if lab not in ("default", "oracle"):
                        d = paired_difference(row, lab, "default", m)
                        rows[lab].setdefault(f"{m}_vs_default", {})[env] = d
        summary["knobs"][k] = rows
    for env, res in results.items():
        for r in res["suite"]["rows"]:
            tag = _tag(env, r)
            e = r["estimators"]
            summary["suite"][tag] = {lab: {m: {"mean": e[lab][m]["mean"], "ci95": e[lab][m]["ci95"]}
                                           for m in ("pearson", "grad_cos", "affine_err")} for lab in e}
            summary["gate"][tag] = {
                "gated_share": r["gated_share"]["mean"],
                "gated_bepo": e["gated_bepo"]["pearson"], "bepo_nogate": e["bepo_nogate"]["pearson"],
                "gate_minus_nogate": paired_difference(r, "gated_bepo", "bepo_nogate"),
                "gate_minus_nogate_grad_cos": paired_difference(r, "gated_bepo", "bepo_nogate", "grad_cos"),
                "gated_bepo_on_ungated": e["gated_bepo"]["pearson_ungated"],
                "nogate_on_ungated": e["bepo_nogate"]["pearson_ungated"]}
            for name, relatives in RIVALS.items():  # the later estimators against their nearest relatives
                if name in e:
                    summary["rivals"][name][tag] = {f"{m}_minus_{other}": paired_difference(r, name, other, m)
                                                    for other in relatives if other in e
                                                    for m in ("pearson", "grad_cos")}
            summary["values"][tag] = {"rmse_mc": r["values"]["rmse_mc"], "rmse_fp": r["values"]["rmse_fp"],
                                      "fp_minus_mc": r["values"]["fp_minus_mc"],
                                      "credit_fp_minus_mc": paired_difference(r, "gated_bepo", "bepo_mc")}
    return summary


def _f(c, d=3, signed=False):
    if isinstance(c, dict):
        m, h = c["mean"], c["ci95"]
        if m is None or m != m:
            return "n/a"
        v = f"{m:+.{d}f}" if signed else f"{m:.{d}f}"
        return f"{v} ± {h:.{d}f}" if h == h else v
    return "n/a" if c is None or c != c else f"{c:.{d}f}"


def _sep(c: dict, marks=("+", "-", "~"), lower_is_better=False) -> str:
    """marks[0] / marks[1] when the paired 95% interval lies above / below 0 (reversed when
    ``lower_is_better``), marks[2] when it contains 0."""
    m, h = c["mean"], c["ci95"]
    if m != m or h != h:
        return "?"
    above, below = m - h > 0, m + h < 0
    if lower_is_better:
        above, below = below, above
    return marks[0] if above else marks[1] if below else marks[2]


def summary_markdown(summary: dict, envs: list[str], command: str) -> str:
    L = ["# Credit lab: summary", "", f"Command: `{command}`", "",
         "Every number compares an estimator's per-record advantage with the exact advantage A^pi_t(s_t, a_t) "
         "of the sampling policy (bepo_jax.lab, docs/credit-lab.md). Within one sweep every config runs on the "
         "same batches, so differences are paired: mean over batches ± the 95% Student-t half-width of the "
         "per-batch difference. Per-environment tables (every metric, every K) are in `<env>/suite/credit.md` "
         "and `<env>/knobs/credit.md`.", ""]
    for k, rows in summary["knobs"].items():
        if not rows:
            continue
        for metric in ("pearson", "grad_cos"):
            L += [f"## Gated-BEPO knobs one at a time, K = {k}: {metric} minus the default's (paired)", "",
                  "Mark: + better than the default (interval excludes 0), - worse, ~ not separated. "
                  f"Last column: the default's {metric}, mean over environments, plus the change.", "",
                  "| config | " + " | ".join(envs) + " | better / worse / ~ | mean over envs |",
                  "|---|" + "---|" * (len(envs) + 2)]
            base = np.nanmean([rows["default"][metric].get(e, np.nan) for e in envs])
            order = sorted((lab for lab in rows if lab not in ("default", "oracle")),
                           key=lambda lab: -np.nanmean([rows[lab][metric].get(e, np.nan) for e in envs]))
            L.append("| default (lam 0.5, eta_gated 0.5, w 1, min_successors 2, history 0) | "
                     + " | ".join(_f(rows["default"][metric].get(e)) for e in envs) + f" | | {base:.3f} |")
            for lab in order:
                d = rows[lab][f"{metric}_vs_default"]
                marks = [_sep(d[e]) for e in envs if e in d]
                tally = f"{marks.count('+')} / {marks.count('-')} / {marks.count('~')}"
                mean = np.nanmean([rows[lab][metric].get(e, np.nan) for e in envs])
                L.append(f"| {lab} | " + " | ".join(f"{_f(d[e], signed=True)} {_sep(d[e])}" if e in d else "n/a"
                                                    for e in envs)
                         + f" | {tally} | {mean:.3f} ({mean - base:+.3f}) |")
            L.append("")
    L += ["## The gate: Gated-BEPO minus the same credit without the gate (bepo_nogate), paired", "",
          "| setting | gated share | Pearson: gated_bepo | Pearson difference | grad_cos difference | "
          "Pearson on ungated records: gated_bepo | bepo_nogate |", "|---|---|---|---|---|---|---|"]
    for tag, g in summary["gate"].items():
        L.append(f"| {tag} | {g['gated_share']:.2f} | {_f(g['gated_bepo'])} | {_f(g['gate_minus_nogate'], signed=True)} "
                 f"{_sep(g['gate_minus_nogate'])} | {_f(g['gate_minus_nogate_grad_cos'], signed=True)} "
                 f"{_sep(g['gate_minus_nogate_grad_cos'])} | {_f(g['gated_bepo_on_ungated'])} | "
                 f"{_f(g['nogate_on_ungated'])} |")
    L += ["", "## Values: Monte-Carlo state means vs the fixed point", "",
          "RMSE against the exact V^pi (gamma 0.95, at the record's time step); `fp - mc` paired per batch "
          "(negative = the fixed point is closer; mark fp / mc = that one is closer, ~ = not separated); last "
          "column: Pearson of gated_bepo minus bepo_mc (the same credit with Monte-Carlo values), paired "
          "(+ = the fixed point's credit correlates better).", "",
          "| setting | MC RMSE | fixed-point RMSE | fp - mc | credit Pearson: fp - mc |", "|---|---|---|---|---|"]
    for tag, v in summary["values"].items():
        L.append(f"| {tag} | {_f(v['rmse_mc'])} | {_f(v['rmse_fp'])} | {_f(v['fp_minus_mc'], signed=True)} "
                 f"{_sep(v['fp_minus_mc'], ('fp', 'mc', '~'), lower_is_better=True)} "
                 f"| {_f(v['credit_fp_minus_mc'], signed=True)} {_sep(v['credit_fp_minus_mc'])} |")
    what = {"gated_bepo": "Gated-BEPO", "g2po": "G2PO (its authors' code)", "g2po_abstract": "G2PO as reconstructed from its abstract",
            "proxmo": "ProxMO (its authors' code; here without texts: each distinct observation a word of its own)",
            "ecpo": "ECPO (the equations its summaries give; the sampled action ids as action keys)",
            "ecpo_abstract": "ECPO as reconstructed from its abstract (the sampled action ids as action keys)",
            "pgpo": "PGPO (as its summary states it: one-step TD residuals on Monte-Carlo state means)"}
    for name, per in summary.get("rivals", {}).items():
        if not per:
            continue
        rel = RIVALS[name]
        against = "GRPO, GiGPO and HGPO" if name == "gated_bepo" else "its nearest relatives"
        L += ["", f"## {what[name]} minus {against}, paired per batch", "",
              f"Pearson, then grad_cos, of `{name}` minus " + ", ".join(f"`{o}`" for o in rel) +
              "; mark + / - / ~ as above.", "",
              "| setting | " + " | ".join(f"{m}: minus {o}" for m in ("pearson", "grad_cos") for o in rel) + " |",
              "|---|" + "---|" * (2 * len(rel))]
        for tag, g in per.items():
            L.append(f"| {tag} | " + " | ".join(
                f"{_f(g[f'{m}_minus_{o}'], signed=True)} {_sep(g[f'{m}_minus_{o}'])}" if f"{m}_minus_{o}" in g else "n/a"
                for m in ("pearson", "grad_cos") for o in rel) + " |")
    labs = list(next(iter(summary["suite"].values())).keys()) if summary["suite"] else []
    for metric in ("pearson", "grad_cos"):
        L += ["", f"## Every estimator: {metric} (mean over batches; best non-oracle in bold)", "",
              "| setting | " + " | ".join(labs) + " |", "|---|" + "---|" * len(labs)]
        for tag, row in summary["suite"].items():
            best = max((row[lab][metric]["mean"] for lab in labs if lab != "oracle"), default=0)
            L.append(f"| {tag} | " + " | ".join(
                (f"**{row[lab][metric]['mean']:.3f}**" if row[lab][metric]["mean"] == best
                 else f"{row[lab][metric]['mean']:.3f}") for lab in labs) + " |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = parser(__doc__, full=True)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "credit_lab"))
    ap.add_argument("--scale", choices=list(SCALES), default="full")
    ap.add_argument("--only", default=",".join(e for e in LAB_ENVS if e not in PROTOCOL_ENVS),
                    help="comma-separated lab environments")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    envs = [e for e in args.only.split(",") if e]
    out = Path(args.out)
    cmd = command("credit_lab", argv)
    results = {}
    for env in envs:
        results[env] = {}
        for name, cfg in sweeps(env, SCALES[args.scale], args.seed).items():
            d = out / env / name
            res = run_sweep(cfg, d, progress=not args.quiet)
            write_outputs(res, d, command=cmd + f"  (sweep {env}/{name})")
            results[env][name] = res
    summary = summarize(results)
    write_json(out / "summary.json", {"command": cmd, "envs": envs, **summary}, indent=1)
    write_text(out / "summary.md", summary_markdown(summary, envs, cmd))
    print(f"wrote {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
