"""Score a pretrained-model policy on TextWorld games a user brings, or on generated ones.

    bepo-jax eval --checkpoint runs/llm --games my_games/            # a trained run, the user's games
    bepo-jax eval --checkpoint runs/llm --game-seeds 100-147 --quest-length 2
    bepo-jax eval --model smollm2-135m --games my_games/              # the untrained model

``games_in(dir)`` lists a directory's games (``.z8`` / ``.ulx``, each with the ``.json`` TextWorld
writes beside it: the admissible commands and the objective come from it); ``games_from_seeds``
generates games from a seed range. ``evaluate_games`` plays ``episodes`` episodes of every game
(``batch`` games at a time, all their episodes in one batched rollout, sampled at the run's
temperature), and returns the success rate, its 95% t-interval over games (of the per-game
success), and one record per game (its file, content digest, success, turns, invalid replies).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import jax
import numpy as np

from .report import mean_ci
from .setup import rollouts_in_batches

GAME_SUFFIXES = (".z8", ".ulx")


def games_in(directory: str | Path) -> list[str]:
    """The TextWorld games in ``directory`` (sorted by name), each checked for its ``.json``."""
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"--games {d}: not a directory; pass a directory of TextWorld games (.z8 or .ulx files).")
    games = sorted(p for p in d.iterdir() if p.suffix in GAME_SUFFIXES)
    if not games:
        raise ValueError(f"--games {d}: no .z8 or .ulx game in it; compile your games with tw-make (TextWorld) "
                         "into this directory.")
    missing = [p.name for p in games if not p.with_suffix(".json").exists()]
    if missing:
        raise ValueError(f"--games {d}: {', '.join(missing[:5])} without the .json TextWorld writes beside a game "
                         "(it holds the admissible commands and the objective); keep the .json next to each game.")
    return [str(p) for p in games]


def parse_seeds(spec: str) -> range:
    """``"A-B"`` (inclusive) or ``"A"`` -> the seeds."""
    try:
        a, _, b = spec.partition("-")
        lo, hi = int(a), int(b) if b else int(a)
    except ValueError:
        raise ValueError(f"--game-seeds {spec!r}: write a seed range as A-B (e.g. 100-147) or one seed A.") from None
    if lo < 0 or hi < lo:
        raise ValueError(f"--game-seeds {spec!r}: need 0 <= A <= B.")
    return range(lo, hi + 1)


def games_from_seeds(seeds: Sequence[int], games_dir: str | Path, *, quest_length: int, rooms: int,
                     objects: int) -> list[str]:
    """One generated game per seed (TextWorld's generator; cached in ``games_dir``)."""
    from ..envs.textworld_env import generate_games

    return [str(generate_games(1, games_dir, seed=s, rooms=rooms, objects=objects, quest_length=quest_length)[0])
            for s in seeds]


def evaluate_games(setup, params, games: Sequence[str], *, episodes: Optional[int] = None, seed: int = 0,
                   batch: int = 16) -> dict:
    """Success of ``setup``'s chat policy with ``params`` on ``games``, ``episodes`` each (default
    the run's group size); games ``batch`` at a time (``setup.rollouts_in_batches``: the batch from
    game i with ``PRNGKey(seed)`` for i = 0, ``fold_in`` of it with i after). Returns
    success_rate, ci95 (the half-width of the 95% t-interval over games; None for one game: there
    is no interval), tasks, episodes and ``games`` (one record each)."""
    from ..envs.textworld_env import game_signature

    if not getattr(setup, "pretrained", None):
        raise ValueError("evaluate_games scores a pretrained model's run (RunConfig.model); this run has none.")
    if not games:
        raise ValueError("evaluate_games: no games to play.")
    if batch < 1:
        raise ValueError(f"--batch {batch}: play at least 1 game at a time.")
    K = episodes or setup.rollout_cfg.group_size
    if K < 1:
        raise ValueError(f"--episodes {K}: play at least 1 episode per game.")
    ro = setup.rollout_for(K, evaluation=True)
    games = list(games)
    outs = rollouts_in_batches(ro, params, games, jax.random.PRNGKey(seed), batch)
    records = []
    for start, out in zip(range(0, len(games), batch), outs):
        chunk = games[start:start + batch]
        success, valid, actions = map(np.asarray, (out.success, out.batch.mask, out.actions))
        for j, g in enumerate(chunk):
            records.append({"game": g, "signature": game_signature(g), "success": float(success[j].mean()),
                            "episodes": K, "turns": float(valid[j].sum(-1).mean()),
                            "invalid_rate": float(((actions[j] < 0) & valid[j]).sum() / max(valid[j].sum(), 1))})
        del out  # not held while the next batch rolls out
    per_game = np.asarray([r["success"] for r in records])
    ci = mean_ci(per_game)[1]
    return {"success_rate": float(per_game.mean()), "ci95": None if math.isnan(ci) else float(ci),  # one game: none
            "tasks": len(records), "episodes": K, "temperature": setup.rollout_cfg.temperature, "max_steps": setup.max_steps,
            "games": records}
