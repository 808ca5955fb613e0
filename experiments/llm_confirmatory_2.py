"""Does step credit help a pretrained LLM agent that learns? The second LLM test, fixed in advance in
docs/llm-confirmatory-2.md (read it first: the arms, seeds, endpoint, decision rule and budget are there,
and changing them after a run started is a deviation that the report must name).

    nice python -m experiments.llm_confirmatory_2 run      # every (seed, arm) run in the fixed order, each in a fresh process; resumable
    python -m experiments.llm_confirmatory_2 report        # the numbers and the decision once every run finished (before: which runs finished)
    python -m experiments.llm_confirmatory_2 status        # which runs finished, which started
    python -m experiments.llm_confirmatory_2 note --text "..."   # a dated note in the log (a correction)
    nice python -m experiments.llm_confirmatory_2 run --no-start-after "2026-12-07 18:50"   # leave no run half done at a stop
    python -m experiments.llm_confirmatory_2 power         # the seeds the protocol needs, from the pilot (training games)
    python -m experiments.llm_confirmatory_2 end --text "..."   # the 30 h cap ends the test (refused while the next seed's runs fit)

The harness (run directories runs/llm_confirmatory_2/ARM_sSEED, the log, the kept records in
experiments/results/llm_confirmatory_2/runs/, the report) is ``experiments/llm_test.py``'s ``LLMTest``;
the constants below are the protocol's. ``power`` computes the protocol's number of seeds from the pilot
(``experiments/llm_pilot.py``, training games only) and writes ``experiments/results/llm_confirmatory_2/
power.{json,md}``.
"""

from __future__ import annotations

import math

import numpy as np

from .llm_test import POWER, LLMTest, smallest_effect, t_power

NAME = "llm_confirmatory_2"
# -- the protocol (docs/llm-confirmatory-2.md); fixed before the first run -----------------------------------
ARMS = ("grpo", "gigpo", "gated_bepo", "bepo_nogate")
PRIMARY = (("gated_bepo", "grpo"), ("gated_bepo", "gigpo"))
SECONDARY = (("gigpo", "grpo"), ("bepo_nogate", "grpo"), ("gated_bepo", "bepo_nogate"))
# the recipe's evaluation of 48 held-out games x 4 episodes at iterations 0 and 30; no training-game
# evaluation (it does not change what trains, and costs about 8 minutes a run); one checkpoint kept
OVERRIDES = dict(eval_train=False, checkpoint_every=2, keep_checkpoints=1)
EFFECT = 7.0  # points of held-out success the test is sized to see (the character policy's +7.3)
ALPHA = 0.05  # two-sided; Holm over the two primary contrasts: the first rejection is at ALPHA / 2
CAP_HOURS = 30.0  # wall time on the 2-core machine, all runs, every start and rerun included
RESERVE_SEEDS = 1  # of the seeds the cap pays for, one seed's runs kept back for reruns (stops, crashes)
TOY = {("gated_bepo", "grpo"): "+7.3 +- 2.7 (confirmed)", ("gated_bepo", "gigpo"): "+1.0 +- 2.9 (not confirmed)"}
PAPER = {("gated_bepo", "grpo"): 13.4, ("gated_bepo", "gigpo"): None, ("gigpo", "grpo"): 9.8}
SEEDS: tuple = tuple(range(500, 508))  # fixed by the protocol from ``power``'s computation (docs/llm-confirmatory-2.md)


def seeds_for(effect: float, sd: float, *, power: float = POWER, alpha: float = ALPHA, most: int = 10_000) -> int:
    """The smallest number of seeds n >= 2 whose ``t_power`` reaches ``power``."""
    for n in range(2, most + 1):
        if t_power(n, effect, sd, alpha) >= power:
            return n
    raise ValueError(f"seeds_for: more than {most} seeds for an effect of {effect} at SD {sd}.")


def evaluation_sd(per_game_a: list[float], per_game_b: list[float], episodes: int) -> float:
    """The SD (points) that evaluation noise alone gives a difference of two runs' success on the same
    games: each run's mean over G games of K episodes has variance sum_g p_g (1 - p_g) / (K - 1) / G^2
    (p_g the game's observed success; unbiased per game), and the two runs' noises are independent."""
    var = lambda p: float(np.sum(np.asarray(p) * (1 - np.asarray(p)) / (episodes - 1))) / len(p) ** 2
    return 100 * math.sqrt(var(per_game_a) + var(per_game_b))


def plan(diffs: list[float], floor: float, hours_per_run: float, *, arms: int = len(ARMS), effect: float = EFFECT,
         cap_hours: float = CAP_HOURS, power: float = POWER, alpha: float = ALPHA) -> dict:
    """The protocol's number of seeds: the SD is the larger of the pilot's paired SD over seeds (``diffs``,
    points) and the evaluation-noise ``floor``; ``seeds_needed`` for ``power`` at ``effect`` with the first
    Holm rejection's level alpha / 2; the cap pays for ``cap_hours`` / (``arms`` x ``hours_per_run``)
    seeds. The test runs every seed the cap pays for less ``RESERVE_SEEDS`` (kept for reruns), and more
    only where the seeds needed are more (up to the cap): a pilot of two seeds gives its SD one degree of
    freedom, so the seeds it asks for are a floor, not a target. Also the smallest effect the chosen n
    sees with that power."""
    sd_pilot = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else float("nan")
    sd = max(floor, sd_pilot) if not math.isnan(sd_pilot) else floor
    level = alpha / 2
    needed = seeds_for(effect, sd, power=power, alpha=level)
    cap = int(cap_hours // (arms * hours_per_run))
    n = min(cap, max(needed, cap - RESERVE_SEEDS))
    return {"pilot_diffs": list(diffs), "pilot_sd": sd_pilot, "evaluation_sd_floor": floor, "sd": sd,
            "effect": effect, "power": power, "alpha_first_holm_step": level, "seeds_needed": needed,
            "hours_per_run": hours_per_run, "arms": arms, "cap_hours": cap_hours, "seeds_the_cap_pays_for": cap,
            "reserve_seeds": RESERVE_SEEDS, "seeds": n, "power_at_effect": t_power(n, effect, sd, level),
            "smallest_effect_at_power": smallest_effect(n, sd, power=power, alpha=level)}


def test() -> LLMTest:
    if not SEEDS:
        raise SystemExit("llm_confirmatory_2: the protocol's seeds are not fixed yet (docs/llm-confirmatory-2.md); "
                         "run the pilot (python -m experiments.llm_pilot run) and `power` first.")
    return LLMTest(name=NAME, protocol="docs/llm-confirmatory-2.md", base="llm_textworld_wide", overrides=OVERRIDES,
                   arms=ARMS, seeds=SEEDS, primary=PRIMARY, secondary=SECONDARY, toy=TOY, paper=PAPER,
                   title="The second LLM confirmatory test", cap_hours=CAP_HOURS, planned_sd=planned_sd())


def planned_sd() -> float:
    """The per-seed SD (points) the protocol sized its seeds with: ``power``'s record (the pilot's paired SD or
    the evaluation-noise floor, the larger)."""
    import json

    from .common import RESULTS

    return float(json.loads((RESULTS / NAME / "power.json").read_text())["sd"])


def power(argv=None) -> dict:
    """``power``: the protocol's seeds from the pilot's records (training games only)."""
    from .common import RESULTS, command, write_report
    from .llm_pilot import TEST as PILOT
    from .llm_test import wall_hours

    p = PILOT.report()  # the training games' endpoint: no held-out number is read
    diffs = p["contrasts"]["gated_bepo - grpo"]["per_seed"]
    finals = {(a, s): PILOT.final(PILOT.source(a, s)) for a in PILOT.arms for s in p["seeds_complete"]}
    K = PILOT.config("grpo", 0).episodes_per_evaluation
    floors = [evaluation_sd(finals["gated_bepo", s]["per_game"], finals["grpo", s]["per_game"], K)
              for s in p["seeds_complete"]]
    w = wall_hours(p["events"])
    finished = sum(e["event"] == "finish" for e in p["events"])
    res = plan(diffs, float(np.mean(floors)), w["finished_segments_hours"] / max(finished, 1))
    gated = p["gated_curves"]["gated_bepo"]
    res.update({"command": command(NAME, ["power"]), "pilot_seeds": p["seeds_complete"], "pilot_endpoint": p["endpoint"],
                "pilot_gated_share": {"per_iteration_range": [float(np.nanmin(gated)), float(np.nanmax(gated))],
                                      "mean": float(np.nanmean(gated))},
                "first_llm_test_paired_sd": first_test_sd()})
    res["seeds_needed_at_first_test_sd"] = {k: seeds_for(EFFECT, v, alpha=ALPHA / 2)
                                            for k, v in res["first_llm_test_paired_sd"].items()}
    res["smallest_effect_at_first_test_sd"] = {k: smallest_effect(res["seeds"], v, alpha=ALPHA / 2)
                                               for k, v in res["first_llm_test_paired_sd"].items()}
    L = ["# The second LLM test's seeds, from its pilot (training games only)", "", f"`{res['command']}`", "",
         f"- pilot: seeds {res['pilot_seeds']}, Gated-BEPO - GRPO on the training games (points): "
         + ", ".join(f"{d:+.1f}" for d in diffs) + f"; paired SD over seeds {res['pilot_sd']:.1f}",
         f"- evaluation noise alone (48 games x {K} episodes, two runs): SD {res['evaluation_sd_floor']:.1f} points",
         f"- SD used: {res['sd']:.1f} points (the larger); effect {EFFECT:.0f} points, power {POWER:.0%}, two-sided "
         f"t-test at {res['alpha_first_holm_step']:.3f} (Holm's first step over the two primary contrasts)",
         f"- seeds needed: {res['seeds_needed']}; a run takes {res['hours_per_run']:.2f} h (the pilot's finished runs), "
         f"{len(ARMS)} arms: the {CAP_HOURS:.0f} h cap pays for {res['seeds_the_cap_pays_for']} seeds",
         f"- **seeds: {res['seeds']}** (every seed the cap pays for less {RESERVE_SEEDS} kept for reruns, and at least "
         f"the seeds needed); power at {EFFECT:.0f} points {res['power_at_effect']:.2f}; the smallest effect "
         f"seen with {POWER:.0%} power {res['smallest_effect_at_power']:.1f} points",
         f"- at the first LLM test's paired SDs ({', '.join(f'{k} {v:.1f}' for k, v in res['first_llm_test_paired_sd'].items())}) the "
         "seeds needed would be " + ", ".join(f"{v}" for v in res["seeds_needed_at_first_test_sd"].values())
         + f"; with {res['seeds']} seeds the smallest effects seen with {POWER:.0%} power would be "
         + ", ".join(f"{v:.1f}" for v in res["smallest_effect_at_first_test_sd"].values()) + " points",
         f"- the gate's share in the pilot's Gated-BEPO runs: {res['pilot_gated_share']['mean']:.2f} on average, "
         f"{res['pilot_gated_share']['per_iteration_range'][0]:.2f}-{res['pilot_gated_share']['per_iteration_range'][1]:.2f} "
         "per iteration"]
    write_report(RESULTS / NAME / "power.json", res, "\n".join(L) + "\n")
    return res


def first_test_sd() -> dict:
    """The first LLM test's paired SDs over its 6 seeds (points), from its summary's per-seed differences: a
    finished, published result, shown beside the pilot's for scale."""
    import json

    from .common import RESULTS

    s = json.loads((RESULTS / "llm_confirmatory" / "summary.json").read_text())
    return {k: float(np.std(s["contrasts"][k]["per_seed"], ddof=1)) for k in ("gated_bepo - grpo", "gated_bepo - gigpo")}


def main(argv=None) -> int:
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["power"]:
        power(args[1:])
        return 0
    return test().main(args, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
