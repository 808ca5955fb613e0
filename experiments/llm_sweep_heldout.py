"""The chosen LLM recipe's run on held-out games: the sweep's run of ``wide_lr5e-5_top4_nopenalty``
(= recipe ``llm_textworld_wide`` but for its evaluation settings; tests/experiments/test_llm_recipe_sweep.py),
its untrained and its final parameters on the same held-out games.

    python -m experiments.llm_sweep_heldout [--games 48 --episodes 4]
    python -m experiments.llm_sweep_heldout --quest-length 2   # transfer: games whose quest takes 2 commands

The sweep chose the variant on training games only and registered it before any held-out game was
played; this program then plays, once, the first ``--games`` held-out games of that run (new in
structure to its 64 training games: ``held_out`` "structural", ``textworld_env.game_structure``),
``--episodes`` each at the run's temperature, with the untrained model (iteration 0) and with the
run's last checkpoint, the same games and the same sampling keys for both. The interval is the 95%
t-interval over games of the paired change. Results: ``experiments/results/llm_sweep/held_out.{json,md}``
(``held_out_q{Q}`` for ``--quest-length Q`` other than the run's: games from the same held-out seeds with
longer quests, new in structure to the training games as well).
"""

from __future__ import annotations

import time

from bepo_jax.agent.train.report import paired_change

from .common import command, git_commit, machine, parser, write_json, write_lines
from .llm_recipe_sweep import DEST, EVAL_BATCH, OUT, ROOT, config_of

NAME = "llm_sweep_heldout"
VARIANT = "wide_lr5e-5_top4_nopenalty"


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--games", type=int, default=48)
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quest-length", type=int, default=None, help="default: the run's (1)")
    args = p.parse_args(argv)
    from bepo_jax.agent.rl.checkpoint import Checkpointer
    from bepo_jax.agent.train.game_eval import evaluate_games
    from bepo_jax.agent.train.llm_setup import LLMSetup

    cfg, out = config_of(VARIANT), OUT / VARIANT
    setup = LLMSetup(cfg, cache_dir=ROOT / "runs" / ".textworld_games", held_out="structural")
    ckpt = Checkpointer(out / "checkpoints", max_to_keep=2)
    state, meta, it = ckpt.restore_latest(setup.trainer.abstract_state())
    ckpt.close()
    if int(meta.get("iteration", it)) != cfg.iterations:
        raise SystemExit(f"{out}: the newest checkpoint is iteration {meta.get('iteration', it)}, not the last "
                         f"({cfg.iterations}); finish the sweep's run first.")
    quest = args.quest_length or cfg.quest_length
    games = setup.env.held_out(args.games, quest_length=quest)  # the same held-out seeds; none a training game
    stem = "held_out" if quest == cfg.quest_length else f"held_out_q{quest}"
    res = {"command": command(NAME), "commit": git_commit(), "machine": machine(), "variant": VARIANT,
           "recipe": "llm_textworld_wide", "held_out_pools": "structural", "games": args.games,
           "episodes": args.episodes, "seed": args.seed, "quest_length": quest}
    for label, params in (("initial", setup.init_state().params), ("final", state.params)):
        t0 = time.perf_counter()
        ev = evaluate_games(setup, params, games, episodes=args.episodes, seed=args.seed, batch=EVAL_BATCH)
        ev["per_task"] = [g["success"] for g in ev["games"]]
        res[label] = {**ev, "seconds": time.perf_counter() - t0}
        print(f"{label}: success {ev['success_rate']:.3f}", flush=True)
    assert [g["signature"] for g in res["initial"]["games"]] == [g["signature"] for g in res["final"]["games"]]
    change, ci = paired_change(res["initial"], res["final"])
    res["paired_change"], res["paired_change_ci95"] = change, ci
    write_json(DEST / f"{stem}.json", res)
    f = lambda label: res[label]
    write_lines(DEST / f"{stem}.md", [
        f"# The chosen LLM recipe on held-out games of quest length {quest}", "",
        f"`{res['command']}` at {res['commit']}: the sweep's run of `{VARIANT}` (recipe `llm_textworld_wide`), "
        f"its untrained and its final (iteration {cfg.iterations}) parameters on the first {args.games} held-out games "
        f"of quest length {quest} (trained on {cfg.quest_length}; new in structure to its {cfg.task_pool} training games), {args.episodes} episodes each at temperature "
        f"{cfg.temperature}, the same games and sampling keys for both; the interval is the 95% t-interval over the "
        "games of the paired change. Played once, after the recipe was chosen on training games.", "",
        "| parameters | success | 95% t over games | turns per episode (mean over games) | invalid replies (mean over games) | seconds |",
        "|---|---:|---:|---:|---:|---:|",
        *[f"| {label} | {f(label)['success_rate']:.3f} | +- {f(label)['ci95']:.3f} | "
          f"{sum(g['turns'] for g in f(label)['games']) / len(f(label)['games']):.2f} | "
          f"{sum(g['invalid_rate'] for g in f(label)['games']) / len(f(label)['games']):.3f} | "
          f"{f(label)['seconds']:.0f} |" for label in ("initial", "final")],
        "", f"Paired change: **{change:+.3f} +- {ci:.3f}** ({args.games} games).",
    ])


if __name__ == "__main__":
    main()
