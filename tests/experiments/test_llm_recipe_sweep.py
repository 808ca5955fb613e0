"""The LLM recipe the sweep chose is the recipe the library names (``llm_textworld_wide``): the same
run config as the sweep's variant, field by field, but for when and on how many held-out games it
is evaluated (the sweep plays none)."""

from bepo_jax.agent.train.recipes import recipe
from experiments.llm_recipe_sweep import config_of


def test_the_named_recipe_is_the_chosen_variant():
    chosen = config_of("wide_lr5e-5_top4_nopenalty").to_dict()
    named = recipe("llm_textworld_wide").to_dict()
    differ = {k for k in named if named[k] != chosen[k]}
    assert differ == {"eval_tasks", "eval_every", "eval_episodes"}, differ
    assert named["invalid_penalty"] == 0.0 and named["train_layers"] == 4 and named["learning_rate"] == 5e-5
