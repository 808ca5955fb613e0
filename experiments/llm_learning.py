"""Does a pretrained LLM agent learn with step credit? The ``llm_textworld`` recipe, run and recorded.

    python -m experiments.llm_learning                 # run (or resume) runs/llm_textworld, then record
    python -m experiments.llm_learning --record-only   # record a finished run

SmolLM2-135M-Instruct plays TextWorld games (quest length 1) through its chat template and
trains its top 2 blocks with Gated-BEPO credit per turn (recipe in
``bepo_jax.agent.train.recipes``). The run is resumable: rerun the same command after a stop.
Recorded in ``experiments/results/llm_textworld/``: held-out success (12 games never trained
on, 4 episodes each) at iterations 0 and the last, the paired per-game change with its 95%
t-interval over the 12 games, the training games' success, the per-iteration curve (success,
invalid-command rate, reply length, episode length, seconds split between decoding the
replies, stepping the games and the update), and the curve PNG.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bepo_jax.agent.train import train
from bepo_jax.agent.train.recipes import recipe
from bepo_jax.agent.train.report import paired_change
from bepo_jax.agent.train.rundir import read_metrics

from .common import RESULTS, ROOT, command, git_commit, machine, parser, write_json

NAME = "llm_learning"
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


def record(out: Path, dest: Path) -> dict:
    """The results file of a finished run in ``out``."""
    rows = read_metrics(out)
    evals = [r for r in rows if "eval/success_rate" in r]
    first, last = evals[0], evals[-1]
    held = lambda r: {k[len("eval/"):]: v for k, v in r.items() if k.startswith("eval/")}
    change, ci = paired_change(held(first), held(last))
    steps = [r for r in rows if r["iteration"] > 0]
    total = sum(r["step_time"] for r in steps)
    decode = sum(r["rollout/decode_s"] for r in steps)
    env = sum(r["rollout/env_s"] for r in steps)
    res = {
        "command": command(NAME),
        "recipe": recipe("llm_textworld").to_dict(),
        "iterations": last["iteration"],
        "held_out": {"games": first["eval/tasks"], "episodes_per_game": recipe("llm_textworld").group_size,
                     "initial": first["eval/success_rate"], "initial_ci95": first["eval/ci95"],
                     "final": last["eval/success_rate"], "final_ci95": last["eval/ci95"],
                     "paired_change": change, "paired_change_ci95": ci,
                     "evaluated_at": [r["iteration"] for r in evals],
                     "success_at": [r["eval/success_rate"] for r in evals]},
        "training_games": _training_games(first, last),
        "time_split_s": {"iterations_total": total, "decode": decode, "env": env, "update_and_rest": total - decode - env,
                         "per_iteration": total / max(len(steps), 1)},
        "starts": (out / "starts.log").read_text().splitlines() if (out / "starts.log").exists() else [],
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
    p.add_argument("--out", default=str(ROOT / "runs" / "llm_textworld"), help="the run directory")
    p.add_argument("--record-only", action="store_true", help="only record a finished run")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    args = p.parse_args(argv)
    out = Path(args.out)
    if not args.record_only:
        resume = (out / "config.json").exists()
        done = len(read_metrics(out)) - 1 if resume else 0
        _log(out, f"start at {git_commit()} ({f'resume after iteration {done}' if resume else 'fresh'})")
        train(recipe("llm_textworld"), out, resume=resume, progress=args.progress)
        _log(out, "finished")
    res = record(out, RESULTS / "llm_textworld")
    h = res["held_out"]
    print(f"held-out success {h['initial']:.3f} -> {h['final']:.3f} (paired change {h['paired_change']:+.3f} "
          f"+- {h['paired_change_ci95']:.3f} over {h['games']} games)")


if __name__ == "__main__":
    main()
