"""How many held-out TextWorld games of the recorded LLM runs were renamed copies of training games.

    python -m experiments.textworld_structure

The runs keep their held-out games apart from their training games by content (``game_signature``:
world facts, entity names, winning commands). Two generated games can share everything but the
names ("lock locker with key" and "lock safe with passkey" on the same world; seeds 8 and 17 of the
r2/o3/q1 set). This counts, for every recorded LLM run's pools (rebuilt from their configs:
``make train-llm``'s recipe at seed 0 with its 12 held-out games, and the first LLM confirmatory
test's seeds 300-305 with 24), the held-out games whose structure (``game_structure``: the same with
names replaced by entity ids) equals a training game's, and the held-out games that repeat an earlier
held-out game's structure. Results: ``experiments/results/textworld_structure.{json,md}``.
"""

from __future__ import annotations

from bepo_jax.agent.envs.textworld_env import TextWorldRun, game_structure
from bepo_jax.agent.train.config import EVAL_SEED_OFFSET
from bepo_jax.agent.train.recipes import recipe

from .common import RESULTS, command, machine, parser, write_report

NAME = "textworld_structure"


def count(cfg) -> dict:
    """One config's pools: training games, held-out games, and the structural copies among them."""
    env = TextWorldRun(cfg, eval_seed_offset=EVAL_SEED_OFFSET)
    train = {game_structure(p) for p in env.train_tasks}
    held = env.held_out(cfg.eval_tasks)
    seen: set = set()
    copies, repeats, copy_index = [], [], []
    for i, p in enumerate(held):
        s = game_structure(p)
        if s in train:
            copies.append(p.rsplit("/", 1)[-1])
            copy_index.append(i)
        elif s in seen:
            repeats.append(p.rsplit("/", 1)[-1])
        seen.add(s)
    return {"seed": cfg.seed, "training_games": len(env.train_tasks), "distinct_training_structures": len(train),
            "held_out_games": len(held), "copies_of_training_games": copies, "copy_index": copy_index,
            "repeated_held_out": repeats}


def without_copies(rows: list[dict]) -> dict:
    """The first LLM test's contrasts (held-out success at its last evaluation, points, paired over seeds,
    95% t) recomputed from its runs' per-game results with every structural copy of a training game left out,
    beside the recorded ones."""
    import json

    import numpy as np

    from bepo_jax.agent.train.report import mean_ci

    from .llm_confirmatory import OUT, PRIMARY, SECONDARY

    drop = {r["seed"]: set(r["copy_index"]) for r in rows}
    runs = OUT / "runs" if (OUT / "runs").exists() else RESULTS / "llm_confirmatory" / "runs"

    def final(arm, seed, keep_all):
        lines = [json.loads(x) for x in open(runs / f"{arm}_s{seed}" / "metrics.jsonl")]
        per = [r for r in lines if "eval/per_task" in r][-1]["eval/per_task"]
        kept = [v for i, v in enumerate(per) if keep_all or i not in drop[seed]]
        return 100.0 * float(np.mean(kept))

    out = {}
    for a, b in PRIMARY + SECONDARY:
        for keep_all in (True, False):
            d = [final(a, r["seed"], keep_all) - final(b, r["seed"], keep_all) for r in rows]
            m, h = mean_ci(d)
            out.setdefault(f"{a} - {b}", {})["all games" if keep_all else "copies left out"] = [m, h]
    return out


def main(argv=None) -> None:
    parser(__doc__).parse_args(argv)
    from .llm_confirmatory import OVERRIDES, SEEDS

    base = recipe("llm_textworld")
    runs = {"make train-llm (llm_textworld, seed 0)": [count(base)],
            "first LLM confirmatory test (seeds 300-305)": [count(base.replace(seed=s, **OVERRIDES)) for s in SEEDS]}
    info = {"command": command(NAME, argv), "machine": machine(), "runs": runs,
            "llm_test_without_copies": without_copies(runs["first LLM confirmatory test (seeds 300-305)"])}
    L = ["# Held-out TextWorld games that were renamed copies of training games", "", f"`{info['command']}`", "",
         "| run | seed | training games (distinct structures) | held-out games | structural copies of a training game | "
         "repeats among held-out |", "|---|---:|---:|---:|---|---|"]
    for name, rows in runs.items():
        for r in rows:
            L.append(f"| {name} | {r['seed']} | {r['training_games']} ({r['distinct_training_structures']}) | "
                     f"{r['held_out_games']} | {len(r['copies_of_training_games'])} "
                     f"{', '.join(r['copies_of_training_games'])} | {len(r['repeated_held_out'])} |")
    L += ["", "The first LLM test's contrasts (held-out success at the last evaluation, points, 95% t over its 6 "
          "seeds), from its runs' per-game results, with all games and with the structural copies left out:", "",
          "| contrast | all games | copies left out |", "|---|---|---|"]
    for name, v in info["llm_test_without_copies"].items():
        L.append(f"| {name} | {v['all games'][0]:+.1f} +- {v['all games'][1]:.1f} | "
                 f"{v['copies left out'][0]:+.1f} +- {v['copies left out'][1]:.1f} |")
    write_report(RESULTS / f"{NAME}.json", info, "\n".join(L) + "\n")


if __name__ == "__main__":
    main()
