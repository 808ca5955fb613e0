"""Named recipes: whole run configs by name (``bepo-jax train --recipe main_job``).

The one place a recipe is written: the Makefile (``make train``), the experiments
(``experiments/claims.py``'s main-recipe experiments and the confirmatory test) and the
command line all read it from here.

``main_job``: Gated-BEPO on Sokoban 6x6 with 1-2 boxes, 60 iterations of 16 levels x 8
trajectories drawn from 4096 generated levels (nearly every level new), a 2-layer
width-128 policy that sees the current grid only (prompt history 0), its output head
started near uniform (head init x 0.01), learning rate 1e-3 with 4 epochs of 4
minibatches per batch, evaluated on 128 held-out levels at iterations 0, 30 and 60.
Why these: docs/results.md, "How the main job's recipe was chosen".

``llm_textworld``: the offline SmolLM2-135M-Instruct (``bepo-jax models fetch smollm2-135m``)
plays TextWorld games of quest length 1 (2 rooms, 3 objects) through its chat template,
Gated-BEPO credit per turn; 2 games x 4 episodes of at most 4 turns per iteration, sampled at
temperature 0.7, one earlier turn in the chat, replies of at most 24 tokens; PPO (2
minibatches of 4 micro-batches) on the top 2 of its 30 blocks at learning rate 2e-5; 40
iterations, 12 held-out games at iterations 0, 20 and 40, a checkpoint every 2 iterations
(an iteration takes 30-60 s on a 2-core CPU: docs/llm.md).

``llm_textworld_wide``: ``llm_textworld`` as the recipe sweep chose it on training games only
(``experiments/llm_recipe_sweep.py``, variant ``wide_lr5e-5_top4_nopenalty``; docs/llm.md): 4 games x 8
episodes an iteration drawn from 64 training games, the whole episode in the chat (3 earlier turns,
so each turn's cache is reused whole), the top 4 blocks at learning rate 5e-5, and no penalty for a
reply that names no command (with one, the model collapsed onto short always-valid replies); 30
iterations, 48 held-out games (new in structure) and 48 training games x 4 episodes at iterations 0
and 30 (about 50 minutes on 2 cores; ``make train-llm``).
"""

from __future__ import annotations

from .config import RunConfig

RECIPES: dict[str, RunConfig] = {
    "main_job": RunConfig(env="sokoban", estimator="gated_bepo", task_pool=4096, groups=16, layers=2, width=128,
                          prompt_history=0, head_init_scale=0.01, learning_rate=1e-3, ppo_epochs=4,
                          num_minibatches=4, iterations=60, eval_tasks=128, eval_every=30),
    "llm_textworld": RunConfig(env="textworld", model="smollm2-135m", estimator="gated_bepo", groups=2, group_size=4,
                               max_steps=4, quest_length=1, temperature=0.7, constrained=False, prompt_history=1,
                               max_reply=24, train_layers=2, learning_rate=2e-5, num_minibatches=2, grad_accum=4,
                               iterations=40, eval_tasks=12, eval_every=20, checkpoint_every=2, keep_checkpoints=2),
}
RECIPES["llm_textworld_wide"] = RECIPES["llm_textworld"].replace(
    prompt_history=3, groups=4, group_size=8, task_pool=64, learning_rate=5e-5, train_layers=4, invalid_penalty=0.0,
    iterations=30, eval_tasks=48, eval_episodes=4, eval_every=30)


def recipe(name: str) -> RunConfig:
    """The run config of recipe ``name``."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)}.")
    return RECIPES[name]


def recipe_fields(name: str, *, without: tuple = ("estimator", "iterations", "eval_every")) -> dict:
    """The fields where recipe ``name`` differs from ``RunConfig()``, except ``without`` (an
    experiment's base config: its arms set the estimator, the experiment its length)."""
    d, base = recipe(name).to_dict(), RunConfig().to_dict()
    return {k: v for k, v in d.items() if v != base[k] and k not in without}
