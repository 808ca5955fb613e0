"""Choosing an LLM recipe that learns, on training games only: a small sweep of resumable runs.

    python -m experiments.llm_recipe_sweep                       # run (or resume) every variant in turn
    python -m experiments.llm_recipe_sweep --variants wide,wide_lr5e-5_top4
    python -m experiments.llm_recipe_sweep --no-start-after '2026-12-06 06:20'
    python -m experiments.llm_recipe_sweep --report              # the table of what has finished

Each variant is ``RunConfig`` overrides of the ``llm_textworld`` recipe (SmolLM2-135M-Instruct,
TextWorld quest length 1, Gated-BEPO) run by its own loop in ``runs/llm_sweep/<name>/``:
``LLMSetup.iterate`` with cache reuse, an orbax checkpoint every 2 iterations, metrics.jsonl
appended line by line, every start logged with its commit in ``starts.log``; rerunning the
command resumes where the last checkpoint left it. **No held-out game is ever played here**:
the choice rests on the training games alone, evaluated (the first ``EVAL_GAMES`` training
games x 4 episodes, at the run's temperature) at iteration 0 and at the end, and on the success
sampled during training. Held-out games are scored once, by the chosen recipe's own run.

Results: ``experiments/results/llm_sweep/summary.json`` and ``.md`` (every variant started,
finished or not, and its starts).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import numpy as np

from bepo_jax.agent.train.recipes import recipe
from bepo_jax.agent.train.report import paired_change
from bepo_jax.agent.train.rundir import RunLock, atomic_write, read_metrics

from .common import RESULTS, ROOT, command, git_commit, machine, parser, write_json, write_lines
from .llm_learning import _log

NAME = "llm_recipe_sweep"
OUT = ROOT / "runs" / "llm_sweep"
DEST = RESULTS / "llm_sweep"
EVAL_GAMES, EVAL_EPISODES, EVAL_BATCH = 16, 4, 8  # 32 rows at a time (128 at once held 12.8 GB and crawled)
ITERATIONS = 30
# name -> overrides of llm_textworld; every variant shows the whole episode (prompt_history 3 of at most 4
# turns: each turn extends the last, so the carried caches are reused whole)
BASE = {"prompt_history": 3, "iterations": ITERATIONS}
VARIANTS = {
    "recipe": {},  # the recipe's update (2 games x 4 episodes, top 2 blocks, lr 2e-5, 8 training games)
    "wide": {"groups": 4, "group_size": 8, "task_pool": 64},  # 32 episodes an iteration over 64 games
    "wide_lr5e-5_top4": {"groups": 4, "group_size": 8, "task_pool": 64, "learning_rate": 5e-5, "train_layers": 4},
    # the same without the invalid-command penalty: wide_lr5e-5_top4 collapsed onto short always-valid replies
    "wide_lr5e-5_top4_nopenalty": {"groups": 4, "group_size": 8, "task_pool": 64, "learning_rate": 5e-5,
                                   "train_layers": 4, "invalid_penalty": 0.0},
    "wide_lr5e-5_top4_kl": {"groups": 4, "group_size": 8, "task_pool": 64, "learning_rate": 5e-5, "train_layers": 4,
                            "kl_coef": 0.05},
}
# What happened to a run outside its own records, written down by hand (a run directory lives in runs/, which
# git does not keep: when the machine is shut down, the directory goes with it)
EVENTS = {
    "wide": ["resumed later on 2026-12-06 from its iteration-8 checkpoint and reached iteration 12 (sampled success, "
             "iterations 1-12: 0.28, 0.00, 0.16, 0.00, 0.22, 0.31, 0.25, 0.09, 0.16, 0.00, 0.19, 0.09; invalid 0.10-0.18 "
             "in iterations 9-12); at about 09:11 UTC the machine was shut down and the run directory went with it: "
             "iterations 10-12 and the checkpoints are lost, the table keeps what the last summary recorded"],
    "wide_lr5e-5_top4": ["during iteration 3 of its first start the process was killed with the session's shell "
                         "(a tool restart, about 13:30 UTC); the next start resumed from its iteration-2 checkpoint "
                         "and iteration 3 reproduced exactly (sampled success 0.156, invalid 0.496)"],
}
CURVE = ("iteration", "success_rate", "invalid_rate", "reply_tokens", "episode_length", "step_time",
         "rollout/decode_s", "update_s", "rollout/prefill_tokens", "rollout/prompt_tokens", "rollout/compiles",
         "graph/gated_share", "approx_kl", "clip_frac", "entropy")


def config_of(name: str):
    return recipe("llm_textworld").replace(**{**BASE, **VARIANTS[name]})


def _append(out: Path, row: dict) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def train_games_eval(setup, params, seed: int) -> dict:
    """The first EVAL_GAMES training games x EVAL_EPISODES episodes, EVAL_BATCH games at a time."""
    from bepo_jax.agent.train.game_eval import evaluate_games

    games = setup.train_tasks[:EVAL_GAMES]
    ev = evaluate_games(setup, params, games, episodes=EVAL_EPISODES, seed=seed, batch=EVAL_BATCH)
    ev["per_task"] = [g["success"] for g in ev.pop("games")]
    return {f"eval_train/{k}": v for k, v in ev.items()}


def run_variant(name: str) -> None:
    """Run or resume variant ``name`` to its last iteration (training games only)."""
    from bepo_jax.agent.rl.checkpoint import Checkpointer
    from bepo_jax.agent.train.llm_setup import LLMSetup

    cfg = config_of(name)
    out = OUT / name
    with RunLock(out):
        stored = out / "config.json"
        if stored.exists() and json.loads(stored.read_text()) != cfg.to_dict():
            raise ValueError(f"{out} holds variant {name} with another config; move it away to start afresh.")
        atomic_write(stored, json.dumps(cfg.to_dict(), indent=2))
        setup = LLMSetup(cfg, cache_dir=ROOT / "runs" / ".textworld_games")
        ckpt = Checkpointer(out / "checkpoints", max_to_keep=2)
        state, start = setup.init_state(), 0
        if ckpt.steps():
            state, meta, start = ckpt.restore_latest(setup.trainer.abstract_state())
            start = int(meta.get("iteration", start))
        rows = [r for r in read_metrics(out) if r["iteration"] <= start]
        atomic_write(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        _log(out, f"start at {git_commit()} " + (f"(resume after iteration {start})" if start else "(fresh)"))
        try:
            if not rows:
                row = {"iteration": 0, **train_games_eval(setup, state.params, cfg.seed)}
                _append(out, row)
            for it in range(start + 1, cfg.iterations + 1):
                t0 = time.perf_counter()
                state, m = setup.iterate(state, it)
                row = {"iteration": it, **m, "step_time": time.perf_counter() - t0}
                if it == cfg.iterations:
                    row.update(train_games_eval(setup, state.params, cfg.seed + it))
                _append(out, row)
                if it % 2 == 0 or it == cfg.iterations:
                    ckpt.save(it, state, {"iteration": it, "config": cfg.to_dict()})
                print(f"{name} it {it}: success {m['success_rate']:.3f} invalid {m.get('invalid_rate', 0):.3f} "
                      f"{row['step_time']:.1f}s", flush=True)
        finally:
            ckpt.close()
        _log(out, f"finished at iteration {cfg.iterations}")


def _recorded() -> dict:
    """The variants the last written summary holds, by name (kept when their run directory is gone)."""
    path = DEST / "summary.json"
    return {v["variant"]: v for v in json.loads(path.read_text())["variants"]} if path.exists() else {}


def summarize() -> dict:
    variants, recorded = [], _recorded()
    for name in VARIANTS:
        out = OUT / name
        rows = read_metrics(out)
        starts = (out / "starts.log").read_text().splitlines() if (out / "starts.log").exists() else []
        before = [s for s in recorded.get(name, {}).get("starts", []) if s not in EVENTS.get(name, [])]
        if not starts and name in recorded:  # the run directory is gone: keep what was recorded
            variants.append({**recorded[name], "starts": before + EVENTS.get(name, []), "run_directory_lost": True})
            continue
        if not starts:
            continue
        starts = before + [s for s in starts if s not in before] + EVENTS.get(name, [])
        cfg = config_of(name)
        done = bool(rows) and rows[-1]["iteration"] >= cfg.iterations and "eval_train/success_rate" in rows[-1]
        steps = [r for r in rows if r["iteration"] > 0]
        v = {"variant": name, "overrides": {**BASE, **VARIANTS[name]}, "finished": done,
             "iterations_done": steps[-1]["iteration"] if steps else 0, "starts": starts,
             "seconds": sum(r["step_time"] for r in steps),
             "curve": [{k: r[k] for k in CURVE if k in r} for r in rows]}
        if steps:
            last = steps[-5:]
            v["sampled_success_last5"] = float(np.mean([r["success_rate"] for r in last]))
            v["sampled_success_first5"] = float(np.mean([r["success_rate"] for r in steps[:5]]))
            v["invalid_last5"] = float(np.mean([r.get("invalid_rate", np.nan) for r in last]))
        if rows and "eval_train/success_rate" in rows[0]:
            v["training_games_initial"] = rows[0]["eval_train/success_rate"]
        if done:
            tr = lambda r: {k[len("eval_train/"):]: r[k] for k in r if k.startswith("eval_train/")}
            change, ci = paired_change(tr(rows[0]), tr(rows[-1]))
            v["training_games"] = {"games": rows[0]["eval_train/tasks"], "initial": rows[0]["eval_train/success_rate"],
                                   "final": rows[-1]["eval_train/success_rate"], "paired_change": change,
                                   "paired_change_ci95": ci}
        variants.append(v)
    return {"command": command(NAME), "commit": git_commit(), "machine": machine(), "eval_games": EVAL_GAMES,
            "variants": variants}


def render(res: dict) -> list[str]:
    f = lambda x, d=3: "-" if x is None else f"{x:.{d}f}"
    lines = ["# Choosing the LLM recipe on training games only", "",
             f"`{res['command']}`; every variant started is listed. Training games only: the first "
             f"{res['eval_games']} training games x 4 episodes evaluated at iteration 0 and the last (the interval: "
             "95% t over those games of the paired change); 'sampled' = the success of the training episodes, "
             "means of the first and last 5 iterations; 's / it.' is wall time, other jobs on the machine included. "
             "No held-out game is played.", "",
             "| variant | overrides | iterations | s / it. | sampled, first 5 | sampled, last 5 | invalid, last 5 | "
             "training games, it. 0 | at the end | change (95% CI) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for v in res["variants"]:
        tg = v.get("training_games", {})
        its = max(v["iterations_done"], 1)
        change = (f"{tg['paired_change']:+.3f} +- {tg['paired_change_ci95']:.3f}" if tg else
                  "not finished; run directory lost" if v.get("run_directory_lost") else "not finished")
        lines.append(f"| {v['variant']} | {', '.join(f'{k}={x}' for k, x in v['overrides'].items())} | "
                     f"{v['iterations_done']} | {v['seconds'] / its:.1f} | {f(v.get('sampled_success_first5'))} | "
                     f"{f(v.get('sampled_success_last5'))} | {f(v.get('invalid_last5'))} | {f(v.get('training_games_initial'))} | "
                     f"{f(tg.get('final'))} | {change} |")
    lines += ["", "Starts:", ""] + [f"- {v['variant']}: " + "; ".join(v["starts"]) for v in res["variants"]]
    return lines


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, run in this order")
    p.add_argument("--no-start-after", default=None, metavar="'YYYY-MM-DD HH:MM'",
                   help="start no variant after this time (UTC)")
    p.add_argument("--report", action="store_true", help="only write the summary of what has run")
    args = p.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    limit = None
    if args.no_start_after:
        limit = datetime.datetime.strptime(args.no_start_after, "%Y-%m-%d %H:%M").replace(tzinfo=datetime.timezone.utc)
    if not args.report:
        for name in names:
            if limit and datetime.datetime.now(datetime.timezone.utc) > limit:
                print(f"not starting {name}: past {args.no_start_after}", flush=True)
                break
            rows = read_metrics(OUT / name)
            if rows and rows[-1]["iteration"] >= config_of(name).iterations and "eval_train/success_rate" in rows[-1]:
                continue
            run_variant(name)
    res = summarize()
    DEST.mkdir(parents=True, exist_ok=True)
    write_json(DEST / "summary.json", res)
    write_lines(DEST / "summary.md", render(res))


if __name__ == "__main__":
    main()
