"""Tabular learning curves over worlds, starts and estimators: run, summarize, report (``bepo-jax learn``,
``experiments/tabular_learning.py``). The curves themselves: ``lab.learning``."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import jax
import numpy as np

from ..agent.train.report import mean_ci
from .learning import LearningConfig, boltzmann_start, iterations_to, learning_curves
from .quality import parse_spec
from .report import lab_models

SOKOBAN_LEVELS = 4  # generated levels of a JAX environment (each its own model); diagnostic worlds have one
LEVEL = 0.9  # the success level of "iterations to"


def run(worlds, estimators, cfg: LearningConfig, starts=("uniform", "peaked"), *, quiet: bool = False,
        levels: int = SOKOBAN_LEVELS) -> dict:
    """Curves [seeds, iterations + 1] per (world / start, estimator); a JAX environment's ``levels``
    generated levels are its seeds' blocks (level-major; ``starts[tag]["levels"]`` says how many).
    The peaked start is skipped (and recorded) where no Boltzmann policy over Q* succeeds half the time."""
    specs = [parse_spec(e) for e in estimators]
    res = {"config": dict(iterations=cfg.iterations, num_groups=cfg.num_groups, group_size=cfg.group_size,
                          learning_rate=cfg.learning_rate, seeds=cfg.seeds, seed=cfg.seed,
                          credit_scale=cfg.credit_scale),
           "estimators": [s.label for s in specs], "curves": {}, "starts": {}}
    for world in worlds:
        models = lab_models(world, levels, None, 0)
        for start in starts:
            tag = f"{world} / {start}"
            used, inits, temps, skipped = [], [], [], []
            for m in models:
                if start == "uniform":
                    lg, t = np.zeros((m.num_states, m.num_actions)), None
                else:
                    try:
                        lg, t = boltzmann_start(m, 0.5)
                    except ValueError as e:  # no Boltzmann policy over Q* succeeds half the time here
                        skipped.append(str(e))
                        continue
                used.append(m)
                inits.append(lg)
                temps.append(t)
            res["starts"][tag] = {"temperatures": temps, "states": [m.num_states for m in used], "skipped": skipped,
                                  "levels": len(used)}
            if not used:
                if not quiet:
                    print(f"{tag:>24}: skipped ({skipped[0]})", flush=True)
                continue
            for s in specs:
                t0 = time.perf_counter()
                # levels as seeds of one arm: every level its seeds, concatenated (level-major)
                parts = [learning_curves(m, s, lg, cfg, with_mass=True) for m, lg in zip(used, inits)]
                c = np.concatenate([x for x, _ in parts])
                res["curves"].setdefault(tag, {})[s.label] = c.tolist()
                res.setdefault("mass", {}).setdefault(tag, {})[s.label] = np.concatenate([y for _, y in parts]).tolist()
                if len(used) > 1:  # a program per level size and estimator: free them (with hundreds kept, one
                    jax.clear_caches()  # process's LLVM failed "Cannot allocate memory" with RAM to spare)
                if not quiet:
                    print(f"{tag:>24} {s.label:>16}: success {c[:, 0].mean():.3f} -> {c[:, -1].mean():.3f} "
                          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return res


def by_level(x: np.ndarray, levels: int) -> np.ndarray:
    """Per-unit numbers (level-major blocks of equal size) as per-level means; unchanged for one level."""
    x = np.asarray(x, np.float64)
    return x if levels <= 1 else x.reshape(levels, -1, *x.shape[1:]).mean(1)


def summarize(res: dict) -> dict:
    """Per (world / start, estimator): success after 0, 5, 10 and all steps, the area under the curve, the
    iterations to ``LEVEL``, and the area's paired difference from GRPO. Mean +- 95% t over seeds for one
    task; over levels (each level's mean over its seeds first) where a world has several, so the band is
    the levels' spread, not the pooled units'."""
    out = {}
    for tag, arms in res["curves"].items():
        L = res["starts"].get(tag, {}).get("levels", 1)
        grpo = np.asarray(arms["grpo"]) if "grpo" in arms else None
        rows = {}
        for label, c in arms.items():
            c = np.asarray(c)
            n = c.shape[1] - 1
            auc = c[:, 1:].mean(1)
            hit = iterations_to(c, LEVEL)
            lv = by_level(c, L)
            row = {"at": {str(i): mean_ci(lv[:, i]) for i in (0, min(5, n), min(10, n), n)},
                   "auc": mean_ci(by_level(auc, L)),
                   "median_iterations_to_level": float(np.median(hit[hit >= 0])) if (hit >= 0).any() else None,
                   "share_reaching_level": float((hit >= 0).mean()), "seeds": int(c.shape[0]) // max(L, 1),
                   "levels": L}
            mass = res.get("mass", {}).get(tag, {}).get(label)
            if mass is not None:  # the effective sample size beside the curve (every arm takes as many steps)
                row["credit_mass"] = mean_ci(by_level(np.asarray(mass).mean(1), L))
                row["updates"] = n
            if grpo is not None and label != "grpo":
                d = by_level(auc - grpo[:, 1:].mean(1), L)
                row["auc_minus_grpo"] = mean_ci(d)
                row["auc_minus_grpo_above_0"] = int((d > 0).sum())
            rows[label] = row
        out[tag] = rows
    return out


def _pts(mh, d=1) -> str:
    m, h = mh
    return f"{100 * m:.{d}f}" + ("" if np.isnan(h) else f" +- {100 * h:.{d}f}")


def markdown(res: dict, summary: dict, command: str, wall: float) -> str:
    c = res["config"]
    many = sorted({v.get("levels", 1) for v in res["starts"].values() if v.get("levels", 1) > 1})
    levels = (f" (a generated environment: {'/'.join(map(str, many))} levels x {c['seeds']} seeds each)"
              if many else "")
    scale = ("Each estimator's advantages are used as they come, at its registry defaults: their scale is part of the "
             "estimator (GRPO and Gated-BEPO standardise by the group's spread, GiGPO's default centres only), so a "
             "faster curve can come from a larger step as well as from better credit."
             if c.get("credit_scale", "none") == "none" else
             "Each estimator's advantages are divided by their root mean square over the seed's records every "
             "iteration (credit_scale unit_rms): every estimator steps with the same size, only the credit's "
             "direction differs.")
    lines = ["# Exact tabular learning curves", "", f"Command: `{command}`  ",
             f"Machine: {platform.platform()}, JAX {jax.__version__}; {wall / 60:.1f} min.  ",
             f"A tabular softmax policy, {c['iterations']} policy-gradient steps (learning rate {c['learning_rate']} on "
             f"the logits) of {c['num_groups']} groups x {c['group_size']} trajectories each, {c['seeds']} seeds per "
             f"world{levels}; success is exact (the model's success probability within its time limit). Every "
             "number: points of success, mean +- the 95% Student-t half-width over seeds (a world of several levels: "
             "over levels, each level's mean over its seeds first; 'n > 0' then counts levels); 'AUC - GRPO' is "
             f"paired (same sampling keys). 'To {LEVEL:.0%}': the median iteration reaching it among the seeds that "
             f"do, and their share. 'Credit mass': the share of sampled records whose credit is not 0, mean over the "
             f"{c['iterations']} updates (every arm takes as many: the effective sample size of the comparison). "
             f"{scale}", ""]
    skipped = [f"{tag}: {v['skipped'][0]}" for tag, v in res["starts"].items() if v["skipped"] and tag not in summary]
    partly = [f"{tag}: {len(v['skipped'])} of {len(v['skipped']) + len(v['states'])} levels have no such start"
              for tag, v in res["starts"].items() if v["skipped"] and tag in summary]
    if skipped or partly:
        lines += ["Peaked starts that do not exist (no Boltzmann policy over Q* succeeds half the time; every action "
                  "is as good under Q* there):", ""] + [f"- {x}" for x in skipped + partly] + [""]
    for tag, rows in summary.items():
        n = max(int(k) for k in next(iter(rows.values()))["at"])
        lines += [f"## {tag}", "", f"| estimator | start | after {min(5, n)} | after {min(10, n)} | after {n} | AUC | AUC - GRPO "
                  f"(n > 0) | to {LEVEL:.0%} | credit mass |", "|---|---|---|---|---|---|---|---|---|"]
        for label, r in rows.items():
            at = r["at"]
            diff = (f"{_pts(r['auc_minus_grpo'])} ({r['auc_minus_grpo_above_0']}/{r['levels'] if r['levels'] > 1 else r['seeds']})"
                    if "auc_minus_grpo" in r else "")
            reach = ("never" if r["median_iterations_to_level"] is None else
                     f"{r['median_iterations_to_level']:.0f} ({r['share_reaching_level']:.0%})")
            lines.append(f"| {label} | {_pts(at['0'])} | {_pts(at[str(min(5, n))])} | {_pts(at[str(min(10, n))])} | "
                         f"{_pts(at[str(n)])} | {_pts(r['auc'])} | {diff} | {reach} | "
                         f"{_pts(r['credit_mass']) if 'credit_mass' in r else '-'} |")
        lines.append("")
    return "\n".join(lines)


def compact(res: dict) -> dict:
    """``res`` without the full curves: per (world / start, estimator) the mean curve and its 95% band
    (for the plot) and, per seed, what every table number is computed from (the success at 0, 5, 10 and
    all steps, the area under the curve, the iteration reaching ``LEVEL``)."""
    out = {k: v for k, v in res.items() if k != "curves"}
    out["mean_curves"], out["per_seed"] = {}, {}
    for tag, arms in res["curves"].items():
        L = res["starts"].get(tag, {}).get("levels", 1)
        for label, c in arms.items():
            c = np.asarray(c)
            n = c.shape[1] - 1
            lv = by_level(c, L)  # the band over levels where there are several (as the tables' intervals)
            half = 1.96 * lv.std(0, ddof=1) / np.sqrt(lv.shape[0]) if lv.shape[0] > 1 else np.zeros(c.shape[1])
            out["mean_curves"].setdefault(tag, {})[label] = {"mean": np.round(c.mean(0), 6).tolist(),
                                                             "half": np.round(half, 6).tolist()}
            out["per_seed"].setdefault(tag, {})[label] = {
                "at": {str(i): np.round(c[:, i], 6).tolist() for i in sorted({0, min(5, n), min(10, n), n})},
                "auc": np.round(c[:, 1:].mean(1), 6).tolist(), "to_level": iterations_to(c, LEVEL).tolist()}
    return out


def plot(res: dict, path: Path) -> None:
    """Mean exact success against steps per estimator, a panel per (world / start); ``res`` as ``compact``
    writes it (or with full ``curves``)."""
    curves = compact(res)["mean_curves"] if "curves" in res else res["mean_curves"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = list(curves)
    cols = 4
    rows = (len(tags) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, tag in zip(axes.ravel(), tags):
        for label, c in curves[tag].items():
            m, h = np.asarray(c["mean"]), np.asarray(c["half"])
            ax.plot(m, label=label, lw=1)
            ax.fill_between(np.arange(len(m)), m - h, m + h, alpha=0.15)
        ax.set_title(tag, fontsize=9)
        ax.set_ylim(0, 1)
    for ax in axes.ravel()[len(tags):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=6)
    fig.supxlabel("policy-gradient step")
    fig.supylabel("exact success")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


