"""The paper's claims, tested: every estimator and the ablation ladder, seeds in one program.

Experiments (``--experiment``):

* ``e1``       Sokoban 6x6, 1-2 boxes, 10 steps (the library's default room).
* ``e1_hard``  Sokoban 7x7, 1-2 boxes scrambled by 50 backward moves, 20 steps: longer
               solutions and room for detours, where step credit should matter more.
* ``e1_hard_uniform``  E1-hard from a near-uniform initial policy (the policy head's
               init x 0.01, ~log 4 nats of action entropy at the start): same seeds and
               tasks as e1_hard, so each arm pairs with its e1_hard runs per seed.
* ``e2``       TextWorld (host loop, seeds one after another): 3 rooms, a 2-step quest.
               The update runs over 64 x 8 sequences of 653 tokens; scoring from the
               prompt (``TrainConfig.score_from``) brought an iteration on 2 cores from
               ~65-75 s to ~7 s (mostly the rollout): ~15 min per arm of 5 seeds.
* ``e2_confirm`` E2's two claims whose intervals excluded 0 (Gated-BEPO - HGPO held-out,
               GraphGPO - GiGPO on training games), tested again on fresh seeds 5-9 (new
               games, new initial policies) with the four arms they need.
* ``sweep``    Gated-BEPO's knobs on E1: lam, eta_gated, w and history at the settings
               the credit lab ranks best and worst (``experiments/credit_lab.py``).
* ``pool``     the earlier main job (Gated-BEPO, 60 iterations, a 1-layer width-64 policy)
               on its fixed pool of 32 training levels against 4096 generated levels
               (nearly fresh ones), and training recipes on fresh levels (initial policy,
               updates per batch).
* ``main_recipe`` the main job's recipe (``make train``: fresh levels, 16 groups, a 2-layer
               width-128 policy, 4 epochs of 4 minibatches per batch, 60 iterations, 128
               held-out levels) against the earlier main job on the same levels;
               ``main_recipe_1epoch`` the recipe with one update per batch (100 iterations).
* ``e1_recipe`` E1's nine arms at the main job's recipe (8 seeds, 60 iterations, 128 held-out
               levels per seed): the comparison where the policy learns.
* ``confirmatory_runs`` the runs of the confirmatory test (docs/confirmatory.md): six arms at the recipe on
               16 fresh seeds (100-115); ``experiments/confirmatory.py`` runs, rescores and reports them.
* ``rivals_recipe`` ECPO and ProxMO (the gate's nearest rivals) beside GiGPO, Gated-BEPO and GRPO at the
               main job's recipe (exploratory: 8 fresh seeds, 400-407).
* ``recipe_ablation`` GRPO and Gated-BEPO at the recipe and under each of its changes from the
               earlier main job reverted alone (a fixed pool of 32 levels, 8 groups, the small
               policy, the LeCun head): which change lets step credit separate from outcome credit.

Arms of e1/e1_hard/e2 (label: estimator and config): every estimator of the registry
(grpo, gigpo, graphgpo, gagpo, hgpo, gated_bepo) and the ablation ladder the paper climbs
-- outcome only (grpo) -> + fixed-point credit everywhere, added (``ladder_fp_added``:
bepo_nogate, eta_gated = 1) -> + the gate (bepo_additive) -> + complementary mixing
(gated_bepo) -- plus the Monte-Carlo-values ablation (bepo_mc).

Every (arm, seed) is an ordinary run directory under ``--out/<experiment>/<arm>/seed<s>``
(interrupted experiments resume; finished runs are read, not re-run). The seeds of an arm
run as one program (``train_seeds``). Arms share their seeds' tasks (a run's training pool
and held-out tasks depend only on its seed), so differences between arms are paired per
seed. Reported per arm: held-out success (the headline) and training-task success at the
end, the paired change from the start, and the paired difference from the reference arm
(gated_bepo, or the default in a sweep) -- each a mean over seeds +- the 95% Student-t
half-width over seeds -- and success against environment steps as a plot; an experiment's
contrasts (``Contrast``: each arm minus GRPO in e1_recipe, the gap per setting and its change
in recipe_ablation) are paired per-seed combinations of arms, in the report's third table. Results:
``experiments/results/<experiment>.{json,md,png}``, rewritten after every arm: the report
holds every arm known -- run now, finished under ``--out``, or read from the results file's
earlier version when that was written for the same config, seeds and scale (``runs/`` is not
versioned) -- and lists the arms not yet run as such. So ``--arms`` adds arms to a report.

``--scale`` moves an experiment without code changes: ``cpu`` (the defaults below, ~1 h
on 2 CPU cores for e1), ``gpu`` (4x the groups, a 2-layer 128-wide policy, the run axis
vmapped), ``pod`` (16x the groups, a 4-layer 256-wide policy, the run axis sharded over
every device of every host: ``--distributed`` joins the multi-host runtime first,
launch the same command on every host; ``--seeds`` a multiple of the devices). Only
``cpu`` has been run by us.

    python -m experiments.claims --experiment e1                   # 9 arms x 8 seeds
    python -m experiments.claims --experiment e1 --arms grpo,gated_bepo --seeds 2 --iterations 2   # smoke
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Optional

import numpy as np

from bepo_jax.agent.envs.registry import is_host_env
from bepo_jax.agent.train import RunConfig, mean_ci, paired_combination, read_metrics
from bepo_jax.agent.train import arms as runner
from bepo_jax.agent.train.arms import COLLAPSE, Arm, action_curves
from bepo_jax.agent.train.recipes import recipe_fields
from bepo_jax.agent.train.rundir import is_finished_run_of
from experiments.common import ROOT, command, machine, parser, write_json
from experiments.formatting import collapsed_seeds, contrast_lines, points

ESTIMATOR_ARMS = (
    Arm("grpo", "grpo"), Arm("gigpo", "gigpo"), Arm("graphgpo", "graphgpo"), Arm("gagpo", "gagpo"),
    Arm("hgpo", "hgpo"),
    Arm("ladder_fp_added", "bepo_nogate", {"eta_gated": 1.0}),
    Arm("bepo_additive", "bepo_additive"), Arm("bepo_mc", "bepo_mc"), Arm("gated_bepo", "gated_bepo"))
LADDER = (("outcome only", "grpo"), ("+ fixed point everywhere, added", "ladder_fp_added"),
          ("+ the gate", "bepo_additive"), ("+ complementary mixing", "gated_bepo"))
# The credit lab's ranking on Sokoban (pearson with the exact advantage, K = 4 and 8):
# best lam 0 / 0.25, eta_gated 0, w 2; worst lam 1, eta_gated 1, w 0.25, history 2.
SWEEP_ARMS = (
    Arm("default", "gated_bepo"),
    Arm("lam_0", "gated_bepo", {"lam": 0.0}), Arm("lam_1", "gated_bepo", {"lam": 1.0}),
    Arm("eta_gated_0", "gated_bepo", {"eta_gated": 0.0}), Arm("eta_gated_1", "gated_bepo", {"eta_gated": 1.0}),
    Arm("w_2", "gated_bepo", {"w": 2.0}), Arm("w_0.25", "gated_bepo", {"w": 0.25}),
    Arm("history_2", "gated_bepo", {"history": 2}))
# The main job (make train) on its fixed pool of 32 training levels against (nearly) fresh
# levels: 4096 generated levels, so 60 iterations x 8 groups rarely draw one twice.
# Then recipes on fresh levels: a near-uniform initial policy (head_init_scale 0.01: the
# default head starts at ~1.05 nats of action entropy, and some seeds collapse onto one
# action within two iterations -- experiments/results/learning_rate.md), and more updates
# per batch (4 epochs x 4 minibatches at a third of the learning rate).
FRESH = {"task_pool": 4096}
POOL_ARMS = (Arm("pool_32", "gated_bepo", run={"task_pool": 32}),
             Arm("pool_4096", "gated_bepo", run=FRESH),
             Arm("fresh_uniform", "gated_bepo", run={**FRESH, "head_init_scale": 0.01}),
             Arm("fresh_uniform_ppo4", "gated_bepo",
                 run={**FRESH, "head_init_scale": 0.01, "ppo_epochs": 4, "num_minibatches": 4, "learning_rate": 1e-3}))
# The main job's recipe (``bepo_jax.agent.train.recipes``; ``make train`` runs ``--recipe main_job``): fresh levels, 16 groups per iteration, a 2-layer
# width-128 policy that sees only the current grid (prompt history 0), a near-uniform head,
# learning rate 1e-3 with 4 epochs of 4 minibatches per batch, 60 iterations, and 128 held-out
# levels (a run's interval over levels narrow enough to see a rise of a few points). Its arms:
# the recipe, and the earlier main job (a fixed pool of 32 levels, 8 groups, a 1-layer width-64
# policy with 2 steps of history, the LeCun head, lr 3e-3, one update per batch) on the same
# 128 held-out levels, so the difference is paired per seed. ``main_recipe_1epoch``: the recipe
# with one update per batch at 100 iterations, the first version tried (its held-out success
# barely moved).
MAIN_JOB = {"env": "sokoban", **recipe_fields("main_job")}  # bepo_jax.agent.train.recipes, the one place it is written
EARLIER_MAIN_JOB = dict(task_pool=0, groups=8, layers=1, width=64, prompt_history=2, head_init_scale=1.0,
                        learning_rate=3e-3, ppo_epochs=1, num_minibatches=1)
MAIN_JOB_ARMS = (Arm("recipe", "gated_bepo"), Arm("earlier_main_job", "gated_bepo", run=EARLIER_MAIN_JOB))
# Which of the recipe's changes let step credit separate from outcome credit (e1_recipe: gated_bepo - grpo
# +6.2 +- 2.1 points held-out; at E1's default config no arm moved): GRPO and Gated-BEPO at the recipe, and
# under each change reverted alone to the earlier main job's setting -- a fixed pool of 32 levels, 8 groups,
# the small policy (1 layer, width 64, 2 steps of prompt history), the LeCun head (init scale 1). The updates
# per batch are not reverted here: at one update per batch the recipe does not learn (main_recipe_1epoch).
# The recipe arms are e1_recipe's grpo and gated_bepo (same config and seeds: copy their run directories).
RECIPE_REVERTS = {"pool_32": {"task_pool": 0}, "groups_8": {"groups": 8},
                  "small_policy": {"layers": 1, "width": 64, "prompt_history": 2}, "lecun_head": {"head_init_scale": 1.0}}
RECIPE_ABLATION_ARMS = (Arm("grpo", "grpo"), Arm("gated_bepo", "gated_bepo"),
                        *(Arm(f"{est}_{name}", est, run=run) for name, run in RECIPE_REVERTS.items()
                          for est in ("grpo", "gated_bepo")))


@dataclasses.dataclass(frozen=True)
class Experiment:
    title: str
    base: dict
    arms: tuple
    reference: str
    seeds: int
    iterations: int
    eval_every: int
    contrasts: tuple = ()  # Contrast, reported in the third table when all its arms are known
    first_seed: int = 0  # an arm's seeds are first_seed, ..., first_seed + seeds - 1 (fresh seeds: a later start)

    def __post_init__(self):
        if self.first_seed < 0:
            raise ValueError(f"Experiment {self.title!r}: first_seed={self.first_seed} must be >= 0.")
        labels = {a.label for a in self.arms}
        for c in self.contrasts:
            unknown = [label for label, _ in c.terms if label not in labels]
            if unknown:
                raise ValueError(f"Experiment {self.title!r}: contrast {c.name!r} names arm(s) {unknown} that are "
                                 f"not among its arms ({', '.join(sorted(labels))}); fix the contrast's terms.")

    def seed_ids(self, seeds: int) -> range:
        """The seed numbers of an arm with ``seeds`` seeds."""
        return range(self.first_seed, self.first_seed + seeds)

    def run_dirs(self, out: Path, label: str, seeds: int) -> dict[int, Path]:
        """Seed number -> run directory (``out/<arm label>/seed<number>``) of one arm."""
        return {s: Path(out) / label / f"seed{s}" for s in self.seed_ids(seeds)}


@dataclasses.dataclass(frozen=True)
class Contrast:
    """A paired per-seed combination of arms: per seed, the sum over ``terms`` of weight x the arm's
    number (``a - b`` is ``((a, 1), (b, -1))``), then its mean +- 95% t over seeds."""

    name: str
    terms: tuple  # ((arm label, weight), ...)

    @classmethod
    def minus(cls, a: str, b: str) -> "Contrast":
        return cls(f"{a} - {b}", ((a, 1.0), (b, -1.0)))


# recipe_ablation's contrasts: the gap Gated-BEPO - GRPO at the recipe and under each revert, each revert's
# change of that gap, ((gated_bepo_X - grpo_X) - (gated_bepo - grpo)) per seed, and what each revert does to
# each estimator (grpo_X - grpo, gated_bepo_X - gated_bepo)
RECIPE_GAPS = (Contrast.minus("gated_bepo", "grpo"),
               *(Contrast.minus(f"gated_bepo_{name}", f"grpo_{name}") for name in RECIPE_REVERTS),
               *(Contrast(f"gap change, {name}", ((f"gated_bepo_{name}", 1.0), (f"grpo_{name}", -1.0),
                                                   ("gated_bepo", -1.0), ("grpo", 1.0))) for name in RECIPE_REVERTS),
               *(Contrast.minus(f"{est}_{name}", est) for name in RECIPE_REVERTS for est in ("grpo", "gated_bepo")))
HARD = dict(env="sokoban_hard", boxes=2)  # E1-hard's room, shared by its variants
# E2's games, shared with its confirmation on fresh seeds: 8 training and 8 held-out games per seed (before
# RunConfig.eval_tasks reached TextWorld, its held-out games stopped at 8 whatever eval_tasks said; E2 ran so)
E2 = dict(env="textworld", rooms=3, quest_length=2, eval_tasks=8)
E2_CONFIRMED = (Contrast.minus("gated_bepo", "hgpo"), Contrast.minus("graphgpo", "gigpo"))
EXPERIMENTS = {
    "e1": Experiment("E1 Sokoban 6x6, 1-2 boxes", dict(env="sokoban", boxes=2), ESTIMATOR_ARMS, "gated_bepo",
                     seeds=8, iterations=30, eval_every=10),
    "e1_hard": Experiment("E1-hard Sokoban 7x7, 1-2 boxes, 20 steps", HARD, ESTIMATOR_ARMS, "gated_bepo",
                          seeds=8, iterations=30, eval_every=10),
    # E1-hard from a near-uniform initial policy (the policy head's init x 0.01): does an arm's
    # deficit on E1-hard come from a collapse onto one action that it never leaves?
    "e1_hard_uniform": Experiment("E1-hard from a near-uniform initial policy (head_init_scale 0.01)",
                                  {**HARD, "head_init_scale": 0.01}, ESTIMATOR_ARMS, "gated_bepo",
                                  seeds=8, iterations=30, eval_every=10),
    "e2": Experiment("E2 TextWorld, 3 rooms, 2-step quest", E2, ESTIMATOR_ARMS, "gated_bepo", seeds=5,
                     iterations=20, eval_every=10),
    # E2's two claims whose intervals excluded 0 (of sixteen), tested again on five fresh seeds (new games, new
    # initial policies): a test chosen after seeing E2's numbers needs seeds E2 did not use
    "e2_confirm": Experiment("E2 on seeds E2 did not use: the two E2 claims whose intervals excluded 0",
                             E2, tuple(a for a in ESTIMATOR_ARMS if a.label in ("gigpo", "graphgpo", "hgpo",
                                                                                 "gated_bepo")),
                             "gated_bepo", seeds=5, iterations=20, eval_every=10, first_seed=5,
                             contrasts=E2_CONFIRMED),
    "sweep": Experiment("Gated-BEPO's knobs on E1", dict(env="sokoban", boxes=2), SWEEP_ARMS, "default",
                        seeds=8, iterations=30, eval_every=10),
    "pool": Experiment("The main job: a fixed pool of 32 levels vs fresh levels", dict(env="sokoban"), POOL_ARMS,
                           "pool_32", seeds=4, iterations=60, eval_every=20),
    "main_recipe": Experiment("The main job's recipe against the earlier main job, 128 held-out levels",
                              MAIN_JOB, MAIN_JOB_ARMS, "recipe", seeds=8, iterations=60, eval_every=30),
    # E1's estimators at the main job's recipe, where the policy learns (main_recipe: +13 points held-out in 60
    # iterations; at e1's default config no arm moves more than 5). Its gated_bepo arm is the same config and
    # seeds as main_recipe's ``recipe`` arm: copying runs/claims/main_recipe/recipe to
    # runs/claims/e1_recipe/gated_bepo reads those runs instead of training them again.
    "e1_recipe": Experiment("E1 at the main job's recipe (fresh 6x6 levels, 2-layer policy, 4x4 updates)",
                            MAIN_JOB, ESTIMATOR_ARMS, "gated_bepo", seeds=8, iterations=60, eval_every=30,
                            contrasts=tuple(Contrast.minus(a.label, "grpo") for a in ESTIMATOR_ARMS
                                            if a.label != "grpo")),
    "recipe_ablation": Experiment("The main job's recipe with one change reverted at a time: GRPO and Gated-BEPO",
                                  MAIN_JOB, RECIPE_ABLATION_ARMS, "gated_bepo", seeds=8, iterations=60,
                                  eval_every=30, contrasts=RECIPE_GAPS),
    "main_recipe_1epoch": Experiment("The main job's recipe with one update per batch, 100 iterations",
                                     {**MAIN_JOB, "ppo_epochs": 1, "num_minibatches": 1},
                                     (Arm("recipe_1epoch", "gated_bepo"),), "recipe_1epoch", seeds=8,
                                     iterations=100, eval_every=50),
}
# The confirmatory test (docs/confirmatory.md, experiments/confirmatory.py), fixed before its first run: the
# recipe as it is, six arms (the four of the primary family first), 16 seeds never used before (100-115).
CONFIRMATORY_ARM_ORDER = ("gated_bepo", "grpo", "gigpo", "ladder_fp_added", "hgpo", "bepo_additive")
CONFIRMATORY_PRIMARY = tuple(Contrast.minus("gated_bepo", b) for b in ("gigpo", "ladder_fp_added", "grpo", "hgpo"))
CONFIRMATORY_SECONDARY = (Contrast.minus("bepo_additive", "ladder_fp_added"), Contrast.minus("gated_bepo", "bepo_additive"),
                          Contrast.minus("ladder_fp_added", "grpo"), Contrast.minus("gigpo", "grpo"),
                          Contrast.minus("hgpo", "grpo"))
EXPERIMENTS["confirmatory_runs"] = Experiment(
    "Confirmatory test at the main job's recipe, 16 fresh seeds (100-115), fixed in advance",
    MAIN_JOB, tuple(next(a for a in ESTIMATOR_ARMS if a.label == label) for label in CONFIRMATORY_ARM_ORDER),
    "gated_bepo", seeds=16, iterations=60, eval_every=30, first_seed=100,
    contrasts=CONFIRMATORY_PRIMARY + CONFIRMATORY_SECONDARY)
# RL after a supervised warm start (experiments/warm_start.py, which trains the warm start first): the recipe
# started from a cloned noisy expert instead of a near-uniform policy -- the regime of a competent, peaked policy
# where the gate can close. The ladder's arms and HGPO/GiGPO on 8 seeds never used before (200-207), 30
# iterations, and Gated-BEPO from the cold start on the same seeds (what the warm start changed). The learning
# rate is 3e-4, not the recipe's 1e-3: at 1e-3 three iterations took the warm start from 0.558 to 0.304 held-out
# (a probe on seed 1, before any arm ran; warm_start.PROBES), as RL on LLMs runs far below the supervised rate.
WARM_START_DIR = "runs/warm_start/sft"  # relative to the repository root (warm_start.py runs from there)
WARM_ARM_ORDER = ("gated_bepo", "grpo", "ladder_fp_added", "bepo_additive", "gigpo", "hgpo")
WARM_ARMS = (*(next(a for a in ESTIMATOR_ARMS if a.label == label) for label in WARM_ARM_ORDER),
             Arm("gated_bepo_cold", "gated_bepo", run={"init_from": ""}))
EXPERIMENTS["warm_start"] = Experiment(
    "RL after a supervised warm start at the main job's recipe (8 fresh seeds, 200-207)",
    {**MAIN_JOB, "init_from": WARM_START_DIR, "learning_rate": 3e-4}, WARM_ARMS, "gated_bepo", seeds=8,
    iterations=30, eval_every=15,
    first_seed=200,
    contrasts=(*(Contrast.minus("gated_bepo", b) for b in ("grpo", "gigpo", "hgpo", "ladder_fp_added")),
               Contrast.minus("bepo_additive", "ladder_fp_added"), Contrast.minus("gated_bepo", "bepo_additive"),
               Contrast.minus("ladder_fp_added", "grpo"), Contrast.minus("gigpo", "grpo"),
               Contrast.minus("gated_bepo", "gated_bepo_cold")))
# The gate's nearest rivals at the main job's recipe (issue: estimators held to their sources), exploratory, fixed
# before any of its runs: ECPO (reconstructed from its abstract, ``ecpo_abstract``; the rollouts' action keys) and ProxMO (its
# authors' code; hashed observations, so its soft grouping is GiGPO's step groups) beside GiGPO and Gated-BEPO,
# and GRPO last, on 8 seeds never used before (400-407), 60 iterations. Its held-out levels are disjoint from
# training by content (setup.held_out_pool), unlike e1_recipe's, so its arms are not paired with e1_recipe's.
RIVAL_ARM_ORDER = ("ecpo", "proxmo", "gigpo", "gated_bepo", "grpo")
# The arm labelled "ecpo" ran (and reruns) the reconstruction from ECPO's abstract, now ``ecpo_abstract``: the label
# stays, so its stored per-seed records and directories still match it.
RIVAL_ESTIMATOR = {"ecpo": "ecpo_abstract"}
RIVAL_ARMS = tuple(next(a for a in ESTIMATOR_ARMS if a.label == label) if label in {a.label for a in ESTIMATOR_ARMS}
                   else Arm(label, RIVAL_ESTIMATOR.get(label, label)) for label in RIVAL_ARM_ORDER)
EXPERIMENTS["rivals_recipe"] = Experiment(
    "The gate's rivals at the main job's recipe: ECPO and ProxMO beside GiGPO and Gated-BEPO (8 fresh seeds, 400-407)",
    MAIN_JOB, RIVAL_ARMS, "gated_bepo", seeds=8, iterations=60, eval_every=30, first_seed=400,
    contrasts=(Contrast.minus("ecpo", "gigpo"), Contrast.minus("proxmo", "gigpo"),
               Contrast.minus("gated_bepo", "ecpo"), Contrast.minus("gated_bepo", "proxmo"),
               Contrast.minus("gated_bepo", "gigpo"), *(Contrast.minus(a, "grpo") for a in RIVAL_ARM_ORDER[:4])))
# "smoke": a check of the machinery end to end (the tests' and ``confirmatory.py --smoke``'s), never a result:
# a 1-layer width-32 policy on 4 groups from 256 levels, scored on 16 held-out levels.
SCALES = {"cpu": {}, "gpu": dict(groups=32, layers=2, width=128, eval_tasks=64),
          "pod": dict(groups=128, layers=4, width=256, eval_tasks=128),
          "smoke": dict(groups=4, layers=1, width=32, task_pool=256, eval_tasks=16)}


# -- statistics ------------------------------------------------------------------------
def seed_numbers(rows: list[dict]) -> dict:
    """One run's numbers: success at the start and the end (held-out and training tasks),
    the evaluation curve against cumulative environment steps, and per iteration the
    action entropy and the largest action share (``bepo_jax.agent.train.arms.action_curves``), the
    share of records the gate admitted and the distinct successors per state (graph estimators),
    and the share of groups with mixed outcomes (runs that record them)."""
    steps = np.cumsum([r.get("env_steps", 0.0) for r in rows])
    ev = [(int(r["iteration"]), float(s), r["eval/success_rate"], r["eval_train/success_rate"])
          for r, s in zip(rows, steps) if "eval/success_rate" in r]
    _, entropy, top = action_curves(rows)
    tasks = [r["eval/tasks"] for r in rows if "eval/tasks" in r]
    return {"held_out_before": ev[0][2], "held_out_after": ev[-1][2], "train_before": ev[0][3],
            "train_after": ev[-1][3], "curve": ev, "held_out_tasks": int(tasks[-1]) if tasks else None,
            "gated_share": [r["graph/gated_share"] for r in rows if "graph/gated_share" in r],
            "out_degree": [r["graph/out_degree"] for r in rows if "graph/out_degree" in r],
            "mixed_share": [r["groups/mixed_share"] for r in rows if "groups/mixed_share" in r],
            "iteration_seconds": float(sum(r.get("step_time", 0.0) for r in rows)),
            "action_entropy": entropy, "top_action_share": top}


def verdict(mh: tuple[float, float]) -> str:
    m, h = mh
    if np.isnan(h):
        return "one seed"
    return "not separated" if abs(m) <= h else ("higher" if m > 0 else "lower")


def paired_by_eval(terms: list[tuple[list[dict], float]], col: int) -> list[list]:
    """``[iteration, mean, half-width]`` of the paired per-seed combination (``paired_combination``) at every
    evaluation all arms recorded (``col`` 2: held-out success, 3: training tasks; the columns of
    ``seed_numbers``'s curve). Iteration 0 is the shared initial policy, so a difference is 0 there where arms
    are paired."""
    by_it = lambda x: {int(c[0]): c[col] for c in x["curve"]}
    its = sorted(set.intersection(*(set(by_it(x)) for seeds, _ in terms for x in seeds)))
    return [[it, *mean_ci(paired_combination(terms, lambda x: by_it(x)[it]))] for it in its]


def contrast_summary(per_arm: dict[str, list[dict]], contrasts: tuple) -> dict:
    """Each contrast whose arms are all known: held-out and training-task success after training and
    at every evaluation, mean +- 95% t over seeds with a verdict, and the seeds where it is above 0."""
    out = {}
    for c in contrasts:
        if any(label not in per_arm for label, _ in c.terms):
            continue
        terms = [(per_arm[label], w) for label, w in c.terms]
        s = dict(terms=[list(t) for t in c.terms])
        for k, col in (("held_out", 2), ("train", 3)):
            xs = paired_combination(terms, lambda x: x[f"{k}_after"])
            s[k] = mean_ci(xs)
            s[f"{k}_verdict"] = verdict(s[k])
            s[f"{k}_seeds_above_0"] = int(sum(x > 0 for x in xs))
            s[f"{k}_by_eval"] = paired_by_eval(terms, col)
        s["seeds"] = len(xs)
        out[c.name] = s
    return out


def summarize(per_arm: dict[str, list[dict]], reference: str) -> dict:
    """Per arm: means +- 95% t over seeds, paired differences from ``reference`` (same
    seeds), and how many seeds collapsed (one action above ``COLLAPSE`` of the sampled
    steps of some iteration, as in ``experiments/learning_rate.py``)."""
    out = {}
    ref = per_arm.get(reference)
    for label, seeds in per_arm.items():
        s = {k: mean_ci([x[k] for x in seeds]) for k in ("held_out_after", "train_after")}
        s["held_out_change"] = mean_ci([x["held_out_after"] - x["held_out_before"] for x in seeds])
        s["train_change"] = mean_ci([x["train_after"] - x["train_before"] for x in seeds])
        if ref is not None and label != reference:
            terms = [(seeds, 1.0), (ref, -1.0)]
            for k in ("held_out_after", "train_after"):
                d = mean_ci(paired_combination(terms, lambda x: x[k]))
                s[f"{k}_minus_{reference}"] = d
                s[f"{k}_verdict"] = verdict(d)
            for k, col in (("held_out", 2), ("train", 3)):
                s[f"{k}_minus_{reference}_by_eval"] = paired_by_eval(terms, col)
        # host environments (TextWorld) record no action shares: collapse is not measured there
        s["collapsed"] = (sum(max(x["top_action_share"], default=0.0) > COLLAPSE for x in seeds)
                          if any(x["top_action_share"] for x in seeds) else None)
        s["seeds"] = len(seeds)
        out[label] = s
    return out


# -- running -------------------------------------------------------------------------
def scale_fields(scale: str, groups: Optional[int] = None, eval_tasks: Optional[int] = None) -> dict:
    """The RunConfig fields of a scale (``SCALES``), with ``--groups`` / ``--eval-tasks`` over them."""
    return {**SCALES[scale], **{k: v for k, v in (("groups", groups), ("eval_tasks", eval_tasks)) if v is not None}}


def base_config(exp: Experiment, scale: dict, iterations: int) -> RunConfig:
    """An experiment's config before its arms: its base, the scale's fields over it, evaluation every
    ``exp.eval_every`` iterations (at most ``iterations``) and a checkpoint every 10."""
    return RunConfig(**{**exp.base, **scale}, iterations=iterations, eval_every=min(exp.eval_every, iterations),
                     checkpoint_every=min(10, iterations))


def arm_config(base: RunConfig, arm: Arm) -> RunConfig:
    """One arm's config (every seed's, but for ``seed``)."""
    return arm.config_for(base)


def finished_run(run_dir: Path, cfg: RunConfig) -> bool:
    """``rundir.is_finished_run_of``, with a finished run of another config refused as an ``--out`` error."""
    try:
        return is_finished_run_of(run_dir, cfg)
    except ValueError as e:
        raise SystemExit(f"--out: {e}") from None


def run_arm(exp: Experiment, arm: Arm, base: RunConfig, seeds: int, out: Path, *, progress: bool, mesh=None
            ) -> list[dict]:
    """The library's runner (``bepo_jax.agent.train.arms.run_arm``) on the experiment's seeds; each seed's numbers."""
    try:
        rows = runner.run_arm(base, arm, list(exp.seed_ids(seeds)), out, progress=progress, mesh=mesh)
    except ValueError as e:
        raise SystemExit(f"--out: {e}") from None
    return [seed_numbers(r) for r in rows]


def fmt(mh, d: int = 3) -> str:
    m, h = mh
    return "n/a" if np.isnan(m) else f"{m:+.{d}f}".lstrip("+") + ("" if np.isnan(h) else f" +- {h:.{d}f}")


def plot(exp: Experiment, per_arm: dict, path: Path) -> None:
    """Held-out and training-task success against environment steps (mean over seeds,
    95% t band over seeds), and the ablation ladder (final held-out success)."""
    from matplotlib.figure import Figure

    ladder = [(name, lab) for name, lab in LADDER if lab in per_arm] if exp.arms is ESTIMATOR_ARMS else []
    fig = Figure(figsize=(13 if ladder else 9, 3.8))
    axes = fig.subplots(1, 3 if ladder else 2)
    for i, (label, seeds) in enumerate(per_arm.items()):
        n = min(len(s["curve"]) for s in seeds)
        c = np.array([s["curve"][:n] for s in seeds])  # [seeds, evals, 4]
        x = c[:, :, 1].mean(0)
        for ax, col in zip(axes[:2], (2, 3)):
            m = c[:, :, col].mean(0)
            h = np.array([mean_ci(c[:, j, col])[1] for j in range(n)]) if len(seeds) > 1 else np.zeros(n)
            ax.plot(x, m, marker="o", ms=3, color=f"C{i % 10}", ls="-" if i < 10 else "--", label=label)
            ax.fill_between(x, m - h, m + h, color=f"C{i % 10}", alpha=0.12)
    for ax, what in zip(axes[:2], ("held-out tasks", "training tasks")):
        ax.set_xlabel("environment steps (per run)")
        ax.set_ylabel(f"success, {what}")
    axes[0].legend(fontsize=7, ncol=2)
    if ladder:
        ax = axes[2]
        ms = [mean_ci([s["held_out_after"] for s in per_arm[lab]]) for _, lab in ladder]
        ax.bar(range(len(ladder)), [m for m, _ in ms], yerr=[0 if np.isnan(h) else h for _, h in ms], capsize=4,
               color="C0")
        ax.set_xticks(range(len(ladder)), [name for name, _ in ladder], rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("held-out success at the end")
        ax.set_title("the ablation ladder", fontsize=9)
    fig.suptitle(exp.title + " (mean, 95% t band over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def arm_record(a: Arm) -> dict:
    """An arm's definition as its results file records it."""
    return {k: v for k, v in a.to_dict().items() if k != "label"}


def earlier_arms(path: Path, exp: Experiment, base: RunConfig, seeds: int, scale: str) -> dict[str, list[dict]]:
    """Per-seed numbers of the arms an earlier invocation wrote to its results file ``path``, kept only where
    they measure the same thing: the same base config (iterations, room, policy, ...), seeds and scale,
    and the arm's definition unchanged. So a run of some arms adds them to the report instead of replacing
    it, and a checkout without the earlier run directories (``runs/`` is not versioned) still reports them."""
    if not path.exists():
        return {}
    info = json.loads(path.read_text())
    same = lambda x: json.loads(json.dumps(x))  # compare as the file stores it (tuples become lists)
    stored = same(RunConfig.from_stored(info["config"]).to_dict()) if "config" in info else None
    if (stored != same(base.to_dict()) or info.get("seeds") != seeds
            or info.get("first_seed", 0) != exp.first_seed or info.get("scale") != scale):
        return {}
    recorded = info.get("arms", {})
    return {a.label: info["per_seed"][a.label] for a in exp.arms
            if a.label in info.get("per_seed", {}) and recorded.get(a.label) == same(arm_record(a))}


def by_eval_lines(summary: dict, ref: str) -> list[str]:
    """The report's second table: every arm's paired difference from ``ref`` at every evaluation
    (held-out, then training tasks; points), so a claim read at the end can be seen along the run."""
    key = lambda k: f"{k}_minus_{ref}_by_eval"
    rows = {label: s for label, s in summary.items() if key("held_out") in s}
    if not rows:
        return []
    its = [it for it, *_ in next(iter(rows.values()))[key("held_out")]]
    head = " | ".join(f"{what} at {it}" for what in ("held-out", "training") for it in its)
    lines = ["", f"Paired difference from {ref} at every evaluation (points, mean +- 95% t over seeds; the "
             f"table above reads the last one):", "", f"| arm | {head} |", "|---|" + "---|" * (2 * len(its))]
    for label, s in rows.items():
        cells = [points(mh) for k in ("held_out", "train") for _, *mh in s[key(k)]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def write(name: str, exp: Experiment, base: RunConfig, args, per_arm: dict, pending: list[str], wall: float,
          results: Path, *, earlier: tuple = ()) -> str:
    
    summary = summarize(per_arm, exp.reference)
    contrasts = contrast_summary(per_arm, exp.contrasts)
    waiting = [c.name for c in exp.contrasts if c.name not in contrasts]
    # the seeds of an arm run as one program (each seed's rows carry that program's iteration
    # time), except in host environments, where they run one after another
    train_s = sum(sum(x["iteration_seconds"] for x in seeds) if is_host_env(base.env) else seeds[0]["iteration_seconds"]
                  for seeds in per_arm.values())
    held = {x.get("held_out_tasks") for seeds in per_arm.values() for x in seeds} - {None}
    cmd = command("claims")
    results.mkdir(parents=True, exist_ok=True)
    info = dict(experiment=name, title=exp.title, command=cmd, machine=machine(), scale=args.scale,
                config=base.to_dict(), seeds=args.seeds, first_seed=exp.first_seed, reference=exp.reference,
                wall_s=wall, iteration_seconds=train_s, pending=pending,
                arms={a.label: arm_record(a) for a in exp.arms}, read_from_earlier_results=list(earlier),
                summary=summary, contrasts=contrasts, pending_contrasts=waiting, per_seed=per_arm)
    write_json(results / f"{name}.json", info, indent=2)
    ref = exp.reference
    runs_cmd = " ".join(w for w in cmd.split() if w not in ("--report-only", "--quiet"))
    shown = f"`{runs_cmd}` (this report: `{cmd}`)" if args.report_only else f"`{cmd}`"
    ids = exp.seed_ids(args.seeds)
    seed_range = f"seeds {ids[0]}-{ids[-1]}, " if exp.first_seed else ""
    lines = [f"# {exp.title}", "", f"Command: {shown}  ",
             f"{base.iterations} iterations of {base.groups} groups x {base.group_size} trajectories, {args.seeds} "
             f"seeds per arm ({seed_range}"
             f"{'one after another' if is_host_env(base.env) else 'one program per arm'}), scale "
             f"{args.scale}; held-out: {'/'.join(map(str, sorted(held))) or base.eval_tasks} tasks never "
             f"trained on, {base.group_size} samples each. Every number: mean over seeds +- the 95% Student-t "
             f"half-width over seeds; 'minus {ref}' is the paired per-seed difference (arms share each seed's "
             f"tasks). Collapsed seeds: runs where one action took more than {COLLAPSE:.0%} of an iteration's sampled "
             f"steps at some iteration. Every arm started is in the table. Training iterations took {train_s / 60:.0f} min (summed from "
             f"the run directories: every iteration, the first one's compilation included, evaluations not); this "
             f"invocation's wall time "
             f"{wall / 60:.0f} min (finished runs are read, not re-run)."
             + (f" Read from this file's earlier version (same config, seeds and scale; their run directories are "
                f"not in this checkout): {', '.join(earlier)}." if earlier else ""), "",
             f"| arm | estimator (config) | held-out after | change from start | minus {ref} | training tasks "
             f"after | change from start | minus {ref} | collapsed seeds |", "|---|---|---|---|---|---|---|---|---|"]
    arm_of = {a.label: a for a in exp.arms}
    for label, s in summary.items():
        est = arm_of[label].describe()
        diff = lambda k: ("reference" if label == ref else f"{fmt(s[k + '_minus_' + ref])} ({s[k + '_verdict']})"
                          if k + "_minus_" + ref in s else f"n/a ({ref} not run yet)")
        lines.append(f"| {label} | {est} | {fmt(s['held_out_after'])} | {fmt(s['held_out_change'])} | "
                     f"{diff('held_out_after')} | {fmt(s['train_after'])} | {fmt(s['train_change'])} | "
                     f"{diff('train_after')} | {collapsed_seeds(s)} |")
    for label in pending:
        lines.append(f"| {label} | {arm_of[label].describe()} | not run yet | | | | | | |")
    lines += by_eval_lines(summary, ref)
    lines += contrast_lines(contrasts, waiting)
    if per_arm:
        plot(exp, per_arm, results / f"{name}.png")
        lines += ["", f"![{exp.title}]({name}.png)"]
    md = "\n".join(lines) + "\n"
    (results / f"{name}.md").write_text(md)
    return md


def main(argv: Optional[list[str]] = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--experiment", choices=sorted(EXPERIMENTS), default="e1")
    p.add_argument("--arms", default="", help="comma-separated arm labels (default: all of the experiment's)")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--groups", type=int, default=None, help="override the scale's groups per iteration (smoke runs)")
    p.add_argument("--eval-tasks", type=int, default=None, help="override the held-out task count (smoke runs)")
    p.add_argument("--distributed", action="store_true",
                   help="join the multi-host runtime first (bepo_jax.agent.rl.multihost.initialize)")
    p.add_argument("--out", default=str(ROOT / "runs" / "claims"))
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: report the arms whose runs are finished or that the results file "
                        "already holds, list the others as not run yet")
    args = p.parse_args(argv)
    exp = EXPERIMENTS[args.experiment]
    labels = [a.label for a in exp.arms]
    chosen = [x for x in args.arms.split(",") if x] or labels
    unknown = [x for x in chosen if x not in labels]
    if unknown:
        raise SystemExit(f"--arms: unknown arm(s) {unknown}; {args.experiment} has {', '.join(labels)}.")
    args.seeds = args.seeds or exp.seeds
    if args.seeds < 1:
        raise SystemExit(f"--seeds={args.seeds} must be >= 1.")
    iterations = args.iterations or exp.iterations
    base = base_config(exp, scale_fields(args.scale, args.groups, args.eval_tasks), iterations)
    mesh = None
    if args.distributed:
        from bepo_jax.agent.rl.multihost import initialize

        initialize()
    if args.scale == "pod" and not is_host_env(base.env):
        import jax

        from bepo_jax.credit.sharding import make_mesh

        if args.seeds % jax.device_count():
            raise SystemExit(f"--seeds={args.seeds} must be a multiple of the {jax.device_count()} devices at pod "
                             "scale (the run axis is sharded over all of them).")
        mesh = make_mesh((jax.device_count(),), ("runs",))
    out = Path(args.out) / args.experiment
    arms = [a for a in exp.arms if a.label in chosen]
    results = Path(args.results)
    # arms already reported (this file's earlier version), then the finished runs here, then the ones run now
    found = earlier_arms(results / f"{args.experiment}.json", exp, base, args.seeds, args.scale)
    local = {}
    for a in exp.arms:
        ds = exp.run_dirs(out, a.label, args.seeds)
        if all([finished_run(d, arm_config(base, a).replace(seed=s)) for s, d in ds.items()]):
            local[a.label] = [seed_numbers(read_metrics(d)) for d in ds.values()]
    earlier = [label for label in found if label not in local]
    known = {**found, **local}
    in_order = lambda: {a.label: known[a.label] for a in exp.arms if a.label in known}
    start = time.perf_counter()

    def report() -> str:
        import jax

        if jax.process_index():  # across processes the results files are process 0's
            return ""
        return write(args.experiment, exp, base, args, in_order(), [a.label for a in exp.arms if a.label not in known],
                     time.perf_counter() - start, results, earlier=tuple(earlier))

    md = report() if args.report_only else ""
    for arm in arms if not args.report_only else ():
        known[arm.label] = run_arm(exp, arm, base, args.seeds, out, progress=not args.quiet, mesh=mesh)
        earlier = [x for x in earlier if x != arm.label]
        md = report()
    if not args.quiet:
        print(md)
    return summarize(in_order(), exp.reference)


if __name__ == "__main__":
    main()
