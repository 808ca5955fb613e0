"""Is a faster tabular learning curve better credit, or a larger step? (the confound of tabular_learning)

``experiments/tabular_learning.py`` trains every estimator at one learning rate (0.3 on the logits)
with its credit as it comes. Credit scales differ: GRPO and Gated-BEPO standardise by the group's
spread, GiGPO's default only centres, and Sokoban pays 10 on success, so a centred estimator there
steps about ten times further. Three settings, each a full tabular study (the same estimators,
iterations, groups and sampling keys as tabular_learning):

- ``sokoban_r10``: Sokoban 6x6 as recorded (reward 10), credit as it comes, on 32 generated levels
  x 25 seeds (bands over the levels);
- ``sokoban_r1``: the same 32 levels with reward 1 (the only change: the step of an unscaled
  estimator shrinks tenfold; a standardised one is unchanged);
- ``unit_rms``: every diagnostic world (200 seeds) and Sokoban with reward 1 (32 levels x 25 seeds)
  with each estimator's credit divided by its root mean square over the seed's records every
  iteration (``LearningConfig.credit_scale="unit_rms"``): one step size for all, only the credit's
  direction differs.

Writes experiments/results/tabular_step_size.{json,md} (each setting's tables, and the rankings of
the areas under the curve side by side with tabular_learning's). ~15 minutes on 2 CPU cores; each
study's curves are kept in tabular_step_size.parts/ as it finishes, so a stopped run resumes.

    python -m experiments.tabular_step_size
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bepo_jax.lab.learning import LearningConfig
from bepo_jax.lab.learning_report import compact, markdown, run, summarize
from experiments.common import ROOT, command, parser, write_json, write_text
from experiments.tabular_learning import ESTIMATORS, WORLDS

LEVELS = 32
LEVEL_SEEDS = 25
REWARD_1 = "experiments.tabular_step_size:sokoban_reward_1"
DIAGNOSTIC = tuple(w for w in WORLDS if w != "sokoban")


def sokoban_reward_1(cfg):
    """Sokoban 6x6 with 1..boxes boxes as the runs build it, paying 1 (not 10) on success."""
    from bepo_jax.agent.envs.sokoban import SokobanConfig, SokobanEnv

    return SokobanEnv(SokobanConfig(max_steps=cfg.max_steps or 10, num_boxes=(1, cfg.boxes), success_reward=1.0))


def settings(quick: bool) -> dict:
    """name -> list of (worlds, LearningConfig, levels) studies run one after the other."""
    seeds = 20 if quick else 200
    level_seeds = 5 if quick else LEVEL_SEEDS
    levels = 4 if quick else LEVELS
    its = 10 if quick else LearningConfig().iterations
    lv = lambda **kw: LearningConfig(seeds=level_seeds, iterations=its, **kw)
    return {"sokoban_r10": [(("sokoban",), lv(), levels)],
            "sokoban_r1": [((REWARD_1,), lv(), levels)],
            "unit_rms": [(DIAGNOSTIC[:2] if quick else DIAGNOSTIC,
                          LearningConfig(seeds=seeds, iterations=its, credit_scale="unit_rms"), 1),
                         ((REWARD_1,), lv(credit_scale="unit_rms"), levels)]}


def ranking(summary: dict) -> dict:
    """Per (world / start): the estimators by their area under the curve, largest first."""
    return {tag: sorted(rows, key=lambda k: -rows[k]["auc"][0]) for tag, rows in summary.items()}


def comparison(results: dict, recorded: dict) -> list[str]:
    """The AUC ranking of every world / start in each setting beside tabular_learning's."""
    lines = ["## Rankings by area under the curve (largest first)", "",
             "| world / start | tabular_learning (lr 0.3, credit as it comes) | " +
             " | ".join(results) + " |", "|---|---|" + "---|" * len(results)]
    tags = sorted({t.replace(REWARD_1, "sokoban (reward 1)") for r in results.values() for t in r["ranking"]} |
                  set(recorded))
    for tag in tags:
        cells = [", ".join(recorded.get(tag, [])) or "-"]
        for r in results.values():
            rk = {t.replace(REWARD_1, "sokoban (reward 1)"): v for t, v in r["ranking"].items()}
            cells.append(", ".join(rk.get(tag, [])) or "-")
        lines.append(f"| {tag} | " + " | ".join(cells) + " |")
    return lines + [""]


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--quick", action="store_true", help="2 diagnostic worlds, 4 levels, few seeds, 10 iterations")
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "tabular_step_size_quick" if args.quick else "tabular_step_size"
    ests = ("grpo", "gigpo", "gated_bepo") if args.quick else ESTIMATORS
    cmd = command("tabular_step_size", argv)
    results, md = {}, []
    t_all = time.perf_counter()
    parts = out / f"{name}.parts"  # each study's curves, kept as it finishes: a stopped run resumes
    parts.mkdir(exist_ok=True)
    for label, studies in settings(args.quick).items():
        res = {"curves": {}, "starts": {}}
        wall = 0.0
        for i, (worlds, cfg, levels) in enumerate(studies):
            path = parts / f"{label}_{i}.json"
            if path.exists():
                part = json.loads(path.read_text())
            else:
                t0 = time.perf_counter()
                part = run(worlds, ests, cfg, levels=levels)
                part["wall_s"] = time.perf_counter() - t0
                write_json(path, part, indent=None)
            wall += part["wall_s"]
            res["curves"].update(part["curves"])
            res["starts"].update(part["starts"])
            res.setdefault("mass", {}).update(part.get("mass", {}))
            res.setdefault("configs", []).append(part["config"])
            res["config"], res["estimators"] = part["config"], part["estimators"]
        summary = summarize(res)
        results[label] = {"configs": res["configs"], "summary": summary, "ranking": ranking(summary),
                          "per_seed": compact(res)["per_seed"], "starts": res["starts"], "wall_s": wall}
        text = markdown(res, summary, cmd, wall).replace(REWARD_1, "sokoban (reward 1)")
        md += [f"# Setting `{label}`", ""] + text.split("\n")[2:]
    recorded_path = out / "tabular_learning.json"
    recorded = ranking(json.loads(recorded_path.read_text())["summary"]) if recorded_path.exists() else {}
    spent = sum(r["wall_s"] for r in results.values())
    head = ["# Tabular learning: credit or step size?", "", f"Command: `{cmd}`; {spent / 60:.1f} min of runs in all "
            f"({(time.perf_counter() - t_all) / 60:.1f} in this call). Settings: " + ", ".join(f"`{k}`" for k in results) + " (the program's docstring says what "
            "each changes).", ""]
    write_json(out / f"{name}.json", {"command": cmd, "settings": results}, indent=None)
    write_text(out / f"{name}.md", "\n".join(head + comparison(results, recorded) + md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
