"""Does a pretrained LLM agent learn with step credit? An LLM recipe's run, run and recorded.

    python -m experiments.llm_learning                 # run (or resume) runs/llm_textworld_wide, then record
    python -m experiments.llm_learning --record-only   # record a finished run
    python -m experiments.llm_learning --recipe llm_textworld   # the earlier recipe (did not learn to win)

SmolLM2-135M-Instruct plays TextWorld games (quest length 1) through its chat template and
trains with Gated-BEPO credit per turn: by default the recipe ``llm_textworld_wide`` (4 games x 8
episodes an iteration from 64 training games, the top 4 blocks at lr 5e-5, 30 iterations; recipes in
``bepo_jax.agent.train.recipes``), chosen by a sweep on training games only. The run is resumable:
rerun the same command after a stop. Recorded in ``experiments/results/RECIPE/``: held-out success
(``eval_tasks`` games new in structure to the training games, ``eval_episodes`` each) at iteration 0
and the last, the paired per-game change with its 95% t-interval over the games, the training games'
success, the per-iteration curve (success, invalid-command rate, reply length, episode length,
seconds split between decoding the replies, stepping the games and the update), the curve PNG, every
start of the run with its commit and wall time, and what determines the result (``provenance``: the
recipe, the commit, the digests of the training and held-out pools, ``setup.pool_digests``, and every
evaluated game's id). ``tests/experiments/test_llm_job_record.py`` recomputes the recipe and the
digests from the current code, so the README's table cannot go stale without a test saying so.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from bepo_jax.agent.train import RunConfig, train
from bepo_jax.agent.train.recipes import recipe
from bepo_jax.agent.train.report import paired_change
from bepo_jax.agent.train.rundir import held_out_pools, read_metrics
from bepo_jax.agent.train.setup import pool_digests

from .common import RESULTS, ROOT, command, git_commit, machine, parser, write_json

NAME = "llm_learning"
RECIPE = "llm_textworld_wide"
CURVE = ("iteration", "success_rate", "invalid_rate", "reply_tokens", "episode_length", "step_time",
         "rollout/decode_s", "rollout/env_s", "update_s", "rollout/compiles", "graph/gated_share", "approx_kl", "clip_frac",
         "grad_norm", "entropy")


def _log(out: Path, line: str) -> None:
    """One line of the run's start log (``starts.log``: every start, stop and finish, with the commit)."""
    import datetime

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "starts.log", "a") as f:
        f.write(f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} {line}\n")


def _training_games(first: dict, last: dict) -> dict:
    """The training games' evaluation before and after, with the paired change over the games."""
    if "eval_train/success_rate" not in first or "eval_train/success_rate" not in last:
        return {}
    train = lambda r: {k[len("eval_train/"):]: v for k, v in r.items() if k.startswith("eval_train/")}
    change, ci = paired_change(train(first), train(last))
    return {"games": first["eval_train/tasks"], "initial": first["eval_train/success_rate"],
            "final": last["eval_train/success_rate"], "paired_change": change, "paired_change_ci95": ci}


def provenance(cfg: RunConfig, name: str, out: Path, evals: list[dict]) -> dict:
    """What determines a recorded run: its recipe (the run's config must be it), the commit of this
    checkout, the digests of its training and held-out pools (``pool_digests``) and the ids of every
    evaluation's games."""
    if cfg.to_dict() != recipe(name).to_dict():
        raise ValueError(f"{out}: the run's config is not the {name!r} recipe's; record only a run of that recipe "
                         f"(python -m experiments.llm_learning --recipe {name}).")
    pools = held_out_pools(out)
    return {"recipe": name, "commit": git_commit(), "held_out_pools": pools,
            "pools": pool_digests(cfg, pools=pools, cache_dir=out.parent / ".textworld_games"),
            "evaluated_games": [{"iteration": r["iteration"], "held_out": r.get("eval/task_ids"),
                                 "training": r.get("eval_train/task_ids")} for r in evals]}


def record(out: Path, dest: Path, name: str = RECIPE) -> dict:
    """The results file of a finished run of recipe ``name`` in ``out``."""
    rows = read_metrics(out)
    evals = [r for r in rows if "eval/success_rate" in r]
    first, last = evals[0], evals[-1]
    cfg = RunConfig.from_stored(json.loads((out / "config.json").read_text()))
    held = lambda r: {k[len("eval/"):]: v for k, v in r.items() if k.startswith("eval/")}
    change, ci = paired_change(held(first), held(last))
    steps = [r for r in rows if r["iteration"] > 0]
    total = sum(r["step_time"] for r in steps)
    decode = sum(r["rollout/decode_s"] for r in steps)
    env = sum(r["rollout/env_s"] for r in steps)
    starts = (out / "starts.log").read_text().splitlines() if (out / "starts.log").exists() else []
    res = {
        "command": command(NAME),
        "recipe": cfg.to_dict(),
        "provenance": provenance(cfg, name, out, evals),
        "iterations": last["iteration"],
        "held_out": {"games": first["eval/tasks"], "episodes_per_game": cfg.episodes_per_evaluation,
                     "initial": first["eval/success_rate"], "initial_ci95": first["eval/ci95"],
                     "final": last["eval/success_rate"], "final_ci95": last["eval/ci95"],
                     "paired_change": change, "paired_change_ci95": ci,
                     "evaluated_at": [r["iteration"] for r in evals],
                     "success_at": [r["eval/success_rate"] for r in evals]},
        "training_games": _training_games(first, last),
        "time_split_s": {"iterations_total": total, "decode": decode, "env": env, "update_and_rest": total - decode - env,
                         "per_iteration": total / max(len(steps), 1)},
        "wall_s": sum(float(line.rsplit(" after ", 1)[1].split(" s")[0]) for line in starts
                      if " after " in line and line.endswith(" s wall")),
        "starts": starts,
        "curve": [{k: r[k] for k in CURVE if k in r} for r in rows],
        "machine": machine(),
    }
    dest.mkdir(parents=True, exist_ok=True)
    write_json(dest / "summary.json", res)
    if (out / "curve.png").exists():
        shutil.copyfile(out / "curve.png", dest / "curve.png")
    return res


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--recipe", default=RECIPE, help="an LLM recipe (bepo_jax.agent.train.recipes)")
    p.add_argument("--out", default=None, help="the run directory (default runs/RECIPE)")
    p.add_argument("--record-only", action="store_true", help="only record a finished run")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    args = p.parse_args(argv)
    cfg = recipe(args.recipe)
    if not cfg.pretrained:
        raise SystemExit(f"--recipe {args.recipe}: not an LLM recipe (it sets no model); the main job is `make train`.")
    out = Path(args.out or ROOT / "runs" / args.recipe)
    if not args.record_only:
        resume = (out / "config.json").exists()
        done = len(read_metrics(out)) - 1 if resume else 0
        _log(out, f"start at {git_commit()} ({f'resume after iteration {done}' if resume else 'fresh'})")
        t0 = time.time()
        train(cfg, out, resume=resume, progress=args.progress)
        _log(out, f"finished after {time.time() - t0:.0f} s wall")
    res = record(out, RESULTS / args.recipe, args.recipe)
    h = res["held_out"]
    print(f"held-out success {h['initial']:.3f} -> {h['final']:.3f} (paired change {h['paired_change']:+.3f} "
          f"+- {h['paired_change_ci95']:.3f} over {h['games']} games)")


if __name__ == "__main__":
    main()
