"""RL after a supervised warm start: does step credit -- and the gate -- help where the gate can close?

Every setting measured before started RL from a near-uniform policy, where the confidence gate is
open for almost every record (96-99% at the start of the main job), so "the gate adds nothing"
could only mean "the gate never closed". Real LLM agents start RL from a competent, peaked policy.
This experiment makes one and runs the ladder from it:

1. ``sft``: the warm start (``bepo_jax.agent.train.sft``): the recipe's policy cloned from a noisy
   shortest-path expert on 4096 generated levels of its own seed (10000: no RL seed's levels), the
   expert erring with a fixed wrong action at a share ``NOISE`` of the states (``corruption="state"``:
   a peaked clone with systematic mistakes, tuned so that it succeeds on about half the held-out
   levels); written to ``runs/warm_start/sft`` and kept, parameters included, in
   ``experiments/results/warm_start/`` (every later ``sft`` or ``run`` restores that one, bit for bit).
2. ``run``: ``claims.py --experiment warm_start`` -- GRPO, the ladder (``ladder_fp_added``,
   ``bepo_additive``, Gated-BEPO), GiGPO and HGPO from the warm start, and Gated-BEPO from the cold
   start, 8 seeds (200-207) each as one program, 30 iterations at the recipe but a learning rate of 3e-4
   (the recipe's 1e-3 wrecked the warm start in a probe: ``PROBES``), held-out success on each seed's 128
   levels at iterations 0, 15 and 30. Resumable: finished arms are read, not re-run.
3. ``report``: ``experiments/results/warm_start.{json,md,png}`` -- the claims table with the paper's
   numbers (verdict rules of docs/results.md), and the regime over training, warm against cold: the
   share of records the gate admits, distinct successors per state, and the share of groups whose
   trajectories disagree on the outcome.

    nice python -m experiments.warm_start sft          # once; kept in experiments/results/warm_start/
    nice python -m experiments.warm_start run          # ~35 min per arm on 2 cores
    python -m experiments.warm_start report

Fixed before the first RL run (this file's commit): the warm start's settings, the arms, seeds,
iterations and contrasts (``claims.EXPERIMENTS["warm_start"]``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from bepo_jax.agent.train import RunConfig, mean_ci
from bepo_jax.agent.train.sft import SFTConfig, sft
from experiments import claims
from experiments.formatting import REGIME, claims_table, regime_lines, warm_start_sentence
from experiments.common import ROOT, parser, write_json

EXPERIMENT = "warm_start"
SFT_SEED = 10_000  # the warm start's own levels and initialisation: no RL run uses this seed
NOISE = 0.2
SFT = SFTConfig(noise=NOISE, corruption="state", epochs=20, batch_size=256, learning_rate=1e-3)
# The probes that chose the warm start (by hand, before this file fixed it; never part of the results): the
# clone must succeed on about half of its held-out levels and be peaked (the gate's regime).
PROBES = (
    ("bepo-jax sft --recipe main_job --noise 0.5 --seed 10000 --epochs 5 (step corruption)",
     "held-out success 0.316 -> 0.493 (128 levels); RL from it (gated_bepo, seed 1, 3 iterations): the gate "
     "admitted 94-95% of records, 9-10 states per group: a broad clone, the gate as open as from the cold start"),
    ("bepo-jax sft --recipe main_job --noise 0.2 --corruption state --seed 10000 --epochs 5",
     "held-out 0.316 -> 0.396, loss still falling (0.30 -> 0.12 over epochs 2-5); RL from it (seed 1, 2 "
     "iterations): the gate admitted 91% of records, 4-6 states per group; so 20 epochs here"),
    ("bepo-jax sft --recipe main_job --noise 0.3 --corruption state --seed 10000 --epochs 5",
     "stopped by hand during its supervised stage (the 0.2 probe had answered what it was for)"),
    # after the warm start below was trained and kept, before any arm ran: the RL learning rate
    ("bepo-jax train --recipe main_job --init-from runs/warm_start/sft --iterations 3 --seed 1 (lr 1e-3, the recipe's)",
     "held-out 0.558 -> 0.304 in 3 iterations (training tasks 0.567 -> 0.387): the update wrecks the warm policy; "
     "the gate admitted 68-77% of records, 1.6-1.9 distinct successors per state, 6-31% of groups mixed"),
    ("... --iterations 6 --learning-rate 1e-4 / 3e-4 (seed 1)",
     "held-out 0.558 -> 0.571 / 0.587, training tasks unchanged: the warm start kept; the gate admitted 41-71% of "
     "records (1.4-1.7 successors per state), 0-25% of groups mixed; so 3e-4 for every arm"),
)


def warm_config() -> RunConfig:
    """The warm start's run config: the experiment's base (the recipe) on its own seed."""
    exp = claims.EXPERIMENTS[EXPERIMENT]
    base = {k: v for k, v in exp.base.items() if k != "init_from"}
    return RunConfig(**base, seed=SFT_SEED)


def run_sft(out: Path) -> dict:
    res = sft(warm_config(), SFT, out)
    print(f"warm start: held-out success {res['held_out_before']['success_rate']:.3f} -> "
          f"{res['held_out_after']['success_rate']:.3f} ({res['held_out_after']['tasks']} levels); expert "
          f"{res['demo_success']:.3f}")
    return res


ARTIFACT = ROOT / "experiments" / "results" / "warm_start"  # the warm start kept: sft.json + its parameters


def _flat(params) -> dict:
    import jax

    return {jax.tree_util.keystr(path): np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(params)}


def save_artifact(warm: Path, artifact: Path = ARTIFACT) -> Path:
    """Keep the warm start in the repository (run directories do not outlive a working session, and a
    supervised stage trained again on another machine need not give the same bits): its summary and its
    parameters (float32, compressed), so that every arm of every session starts from the same policy."""
    from bepo_jax.agent.train import load_run

    _, state, _ = load_run(warm)
    artifact.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(artifact / "params.npz", **_flat(state.params))
    (artifact / "sft.json").write_text((warm / "sft.json").read_text())
    return artifact


def restore_artifact(warm: Path, artifact: Path = ARTIFACT) -> None:
    """Write the kept warm start back as the run directory ``warm`` (config.json, checkpoints/0, sft.json)
    when it is not there; the parameters are the stored ones, bit for bit."""
    import jax

    from bepo_jax.agent.rl.checkpoint import Checkpointer
    from bepo_jax.agent.train import rundir
    from bepo_jax.agent.train.setup import Setup

    if (warm / "sft.json").exists():
        return
    info = json.loads((artifact / "sft.json").read_text())
    cfg = RunConfig.from_stored(info["config"])
    stored = np.load(artifact / "params.npz")
    state = Setup(cfg).trainer.init_state()
    leaves = [stored[jax.tree_util.keystr(path)] for path, _ in jax.tree_util.tree_leaves_with_path(state.params)]
    state = state._replace(params=jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state.params),
                                                               [jax.numpy.asarray(x) for x in leaves]))
    rundir.prepare(cfg, warm, resume=(warm / "config.json").exists())
    ckpt = Checkpointer(warm / "checkpoints", max_to_keep=cfg.keep_checkpoints)
    try:
        ckpt.save(0, state, {"iteration": 0, "config": cfg.to_dict(), "sft": info["sft"], "restored_from": str(artifact)})
    finally:
        ckpt.close()
    write_json(warm / "sft.json", info, indent=1)


def regime(per_arm: dict) -> dict:
    """Per arm and regime metric: its value over iterations, mean over seeds (and the 95% t half-width)."""
    out = {}
    for label, seeds in per_arm.items():
        out[label] = {}
        for key, _ in REGIME:
            curves = [s.get(key, []) for s in seeds]
            n = min((len(c) for c in curves), default=0)
            if not n:
                continue
            c = np.array([x[:n] for x in curves])
            out[label][key] = [[it + 1, *mean_ci(c[:, it])] for it in range(n)]
    return out


def report(results: Path) -> None:
    info = json.loads((results / f"{EXPERIMENT}.json").read_text())
    warm = json.loads((ARTIFACT / "sft.json").read_text()) if (ARTIFACT / "sft.json").exists() \
        else info.get("warm_start")
    reg = regime(info["per_seed"])
    info["regime"], info["warm_start"] = reg, warm
    write_json(results / f"{EXPERIMENT}.json", info, indent=2)
    md = (results / f"{EXPERIMENT}.md").read_text().split("\n## The regime")[0].rstrip()
    extra = ["", "## The regime: where the gate can close", ""]
    if warm:
        extra += [f"{warm_start_sentence(warm)} (`bepo_jax.agent.train.sft`; kept in `experiments/results/warm_start/`, "
                  f"restored into `{claims.WARM_START_DIR}`.)", ""]
    extra += ["How it was chosen (probes run by hand on seed 1 before any arm ran; not part of the results):", "",
              *(f"- `{cmd}`: {what}" for cmd, what in PROBES), ""]
    extra += ["Per iteration, mean ± 95% t over seeds (graph estimators record the first two; the gate's share is "
              "the share of records with >= 2 distinct successors for the BEPO family and of records in a repeated "
              "state for GiGPO):", "", *regime_lines(reg), "",
              "## The paper's claims from the warm start", "", claims_table(info)]
    (results / f"{EXPERIMENT}.md").write_text(md + "\n" + "\n".join(extra) + "\n")
    print(f"wrote {results / EXPERIMENT}.json/.md")


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("step", choices=("sft", "run", "report"))
    p.add_argument("--arms", default=",".join(a.label for a in claims.EXPERIMENTS[EXPERIMENT].arms))
    p.add_argument("--out", default=str(ROOT / "runs" / "claims"))
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    os.chdir(ROOT)  # the experiment's init_from is relative to the repository root
    warm = ROOT / claims.WARM_START_DIR
    if args.step == "sft":
        if (ARTIFACT / "sft.json").exists():
            restore_artifact(warm)  # the kept warm start, not a new one
            print(f"warm start restored from {ARTIFACT} into {warm}")
        else:
            run_sft(warm)
            save_artifact(warm)
    elif args.step == "run":
        if (ARTIFACT / "sft.json").exists():
            restore_artifact(warm)
        if not (warm / "sft.json").exists():
            raise SystemExit(f"no warm start in {claims.WARM_START_DIR}: run `python -m experiments.warm_start sft` "
                             "first.")
        for arm in args.arms.split(","):
            claims.main(["--experiment", EXPERIMENT, "--arms", arm, "--out", args.out, "--results", args.results,
                         "--quiet"])
            report(Path(args.results))
    else:
        report(Path(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
