"""The supervised warm start: the Sokoban solver against brute force in the environment's own
dynamics, the noisy expert, the replay against a sampled rollout's record, the SFT stage and
RL started from it (``RunConfig.init_from``)."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bepo_jax.agent.envs import sokoban as sk
from bepo_jax.agent.envs.sokoban_solver import LevelSolver, demonstrations
from bepo_jax.agent.models import DecoderLM, TransformerConfig
from bepo_jax.agent.envs.text import VOCAB
from bepo_jax.agent.rollouts.jitted import RolloutConfig, make_replay, make_rollout, prompt_length
from bepo_jax.agent.train import RunConfig, load_run, train
from bepo_jax.agent.train.setup import Setup
from bepo_jax.agent.train.sft import SFTConfig, sft

DEPTH = 5  # brute force over every action sequence of this length (4^5 = 1024 per level)


def _brute_force_lengths(levels, depth):
    """The first step at which some action sequence of ``depth`` moves solves each level, with the
    environment's own ``step`` (inf if none does)."""
    seqs = jnp.asarray(list(itertools.product(range(4), repeat=depth)), jnp.int32)

    def first_success(level, seq):
        def body(state, a):
            state, _, _ = sk.step(state, a, sk.SokobanConfig(max_steps=depth))
            return state, state.success
        _, solved = jax.lax.scan(body, sk.reset(level), seq)
        return jnp.where(jnp.any(solved), jnp.argmax(solved) + 1, 99)

    best = jax.jit(jax.vmap(lambda lv: jnp.min(jax.vmap(lambda s: first_success(lv, s))(seqs))))(levels)
    return [float("inf") if b == 99 else int(b) for b in np.asarray(best)]


def test_solver_distances_are_the_shortest_solutions():
    levels = sk.generate_levels(24, seed=5)
    want = _brute_force_lengths(levels, DEPTH)
    got = [LevelSolver(sk.level_at(levels, i), 10).distance(LevelSolver(sk.level_at(levels, i), 10).start)
           for i in range(24)]
    assert any(w != float("inf") for w in want) and any(w >= 3 for w in want if w != float("inf"))
    for g, w in zip(got, want):
        assert g == w if w != float("inf") else g > DEPTH


def _replayed(levels, actions, max_steps=10, prompt_history=0):
    env = sk.SokobanEnv(sk.SokobanConfig(max_steps=max_steps))
    return jax.jit(make_replay(env, RolloutConfig(group_size=1, prompt_history=prompt_history, max_response=8)))(
        jax.tree_util.tree_map(jnp.asarray, levels), actions)


def test_noise_free_expert_solves_every_level_in_the_fewest_moves():
    levels = sk.generate_levels(32, seed=7)
    actions, success = demonstrations(levels, max_steps=10, noise=0.0, seed=0)
    shortest = [LevelSolver(sk.level_at(levels, i), 10).distance(LevelSolver(sk.level_at(levels, i), 10).start)
                for i in range(32)]
    rep = _replayed(levels, actions)
    # the environment's own success flag and episode lengths, not the expert's record
    np.testing.assert_array_equal(np.asarray(rep.success), [d <= 10 for d in shortest])
    np.testing.assert_array_equal(np.asarray(rep.success), success)
    lengths = np.asarray(rep.valid).sum(axis=1)
    for i, d in enumerate(shortest):
        if d <= 10:
            assert lengths[i] == d


def test_noise_lowers_the_expert_and_state_corruption_is_a_fixed_policy():
    levels = sk.generate_levels(256, seed=8)
    rates = [demonstrations(levels, max_steps=10, noise=n, seed=1)[1].mean() for n in (0.0, 0.3, 0.6)]
    assert rates[0] > rates[1] > rates[2]
    actions, _ = demonstrations(levels, max_steps=10, noise=0.3, seed=1, corruption="state")
    # the same grid (the environment's observation) always gets the same action
    env = sk.SokobanEnv()
    step = jax.jit(sk.step, static_argnums=2)  # the environment's own step, compiled once
    seen = {}
    for i in range(256):
        state = sk.reset(sk.level_at(levels, i))
        for a in actions[i]:
            if a < 0:
                break
            key = np.asarray(state.grid).tobytes()
            assert seen.setdefault(key, int(a)) == int(a)
            state, _, _ = step(state, int(a), env.config)
    assert len(seen) > 256
    with pytest.raises(ValueError, match="noise"):
        demonstrations(levels, max_steps=10, noise=1.5, seed=0)
    with pytest.raises(ValueError, match="corruption"):
        demonstrations(levels, max_steps=10, noise=0.1, seed=0, corruption="episode")


@pytest.mark.parametrize("prompt_history", [0, 2])
def test_replay_writes_what_the_rollout_wrote(prompt_history):
    """Replaying a sampled rollout's own actions gives its tokens, masks and success."""
    env = sk.SokobanEnv(sk.SokobanConfig(max_steps=6))
    cfg = RolloutConfig(group_size=1, prompt_history=prompt_history, max_response=8, constrained=True)
    P = prompt_length(env.obs_len, prompt_history, 5)
    model = DecoderLM(TransformerConfig(vocab=VOCAB, layers=1, width=32, heads=2, context=P + 8), rngs=nnx.Rngs(0))
    levels = sk.generate_levels(6, config=env.config, seed=2)
    ro = jax.jit(make_rollout(model, env, cfg))(nnx.state(model, nnx.Param), levels, jax.random.PRNGKey(3))
    rep = jax.jit(make_replay(env, cfg))(jax.tree_util.tree_map(jnp.asarray, levels), ro.actions[:, 0])
    valid = np.asarray(ro.batch.mask[:, 0])
    np.testing.assert_array_equal(np.asarray(rep.valid), valid)
    np.testing.assert_array_equal(np.asarray(rep.success), np.asarray(ro.success[:, 0]))
    for name in ("tokens", "mask", "response_mask"):
        a, b = np.asarray(getattr(rep, name)), np.asarray(getattr(ro, name)[:, 0])
        np.testing.assert_array_equal(a[valid], b[valid], err_msg=name)


def _tiny(**kw):
    base = dict(env="sokoban", layers=1, width=32, heads=2, task_pool=16, eval_tasks=8, groups=2, group_size=2,
                iterations=1, eval_every=1, prompt_history=0, seed=3)
    return RunConfig(**{**base, **kw})


@pytest.mark.slow  # 30 epochs of sft, then RL from it (tens of seconds): make test skips it, CI=1 runs it
def test_sft_clones_the_expert_and_rl_starts_from_it(tmp_path):
    cfg = _tiny()
    res = sft(cfg, SFTConfig(noise=0.0, epochs=30, batch_size=32, learning_rate=3e-3), tmp_path / "warm",
              progress=False)
    assert res["loss"][-1] < 0.5 * res["loss"][0]
    # the clone acts like the noise-free expert on the training tasks it saw
    assert res["train_after"]["success_rate"] > res["train_before"]["success_rate"] + 0.2
    stored = json.loads((tmp_path / "warm" / "sft.json").read_text())
    assert stored["demonstrations"] == 16 and stored["demo_success"] == 1.0
    _, warm_state, it = load_run(tmp_path / "warm")
    assert it == 0
    rl = _tiny(init_from=str(tmp_path / "warm"), estimator="grpo")
    first = Setup(rl).init_state()
    fresh = Setup(_tiny()).init_state()
    same = jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(a, b)), first.params, warm_state.params)
    assert all(jax.tree_util.tree_leaves(same))
    assert not all(jax.tree_util.tree_leaves(
        jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(a, b)), fresh.params, warm_state.params)))
    out = train(rl, tmp_path / "rl", progress=False)
    # iteration 0's held-out evaluation is the warm start's (same params, same tasks, same key)
    assert out["initial"]["success_rate"] == pytest.approx(res["held_out_after"]["success_rate"])
    # a second sft into the same directory with the same settings returns the stored summary
    assert sft(cfg, SFTConfig(noise=0.0, epochs=30, batch_size=32, learning_rate=3e-3), tmp_path / "warm",
               progress=False)["loss"] == res["loss"]
    with pytest.raises(ValueError, match="other settings"):
        sft(cfg, SFTConfig(noise=0.1), tmp_path / "warm", progress=False)


def test_an_interrupted_sft_trains_again_and_another_config_is_refused(tmp_path):
    out = tmp_path / "warm"
    sft(_tiny(), SFTConfig(epochs=1), out, progress=False)
    (out / "sft.json").unlink()  # as if killed before the end: config.json and maybe checkpoints, no summary
    res = sft(_tiny(), SFTConfig(epochs=1), out, progress=False)
    assert (out / "sft.json").exists() and res["sft"]["epochs"] == 1
    (out / "sft.json").unlink()
    with pytest.raises(ValueError, match="width"):
        sft(_tiny(width=64), SFTConfig(epochs=1), out, progress=False)


def test_init_from_refuses_another_policy_and_a_missing_run(tmp_path):
    sft(_tiny(), SFTConfig(epochs=1), tmp_path / "warm", progress=False)
    with pytest.raises(ValueError, match=r"\['width'\].*width=32 there, 64 here"):
        Setup(_tiny(width=64, init_from=str(tmp_path / "warm"))).init_state()
    with pytest.raises(ValueError, match="not a run directory"):
        Setup(_tiny(init_from=str(tmp_path / "nothing"))).init_state()


def test_sft_needs_demonstrations_it_can_get(tmp_path):
    with pytest.raises(ValueError, match="no solver"):
        sft(_tiny(env="maze"), SFTConfig(epochs=1), tmp_path / "maze", progress=False)
    levels = sk.generate_levels(4, seed=0)
    with pytest.raises(ValueError, match=r"int32 \[N, 10\]"):
        sft(_tiny(), SFTConfig(epochs=1), tmp_path / "bad", progress=False,
            demonstrations=(levels, np.zeros((4, 3), np.int32)))
