"""Rollouts of a token policy in JAX Sokoban: prompts, parsing, invalid actions, StepBatch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bepo_jax as bj
import bepo_jax.models
from bepo_jax.envs import sokoban as sk
from bepo_jax.envs.text import EOS, VOCAB, decode, encode
from bepo_jax.hashing import hash_tokens
from bepo_jax.envs.base import parse_response, word_table
from bepo_jax.rollout import RolloutConfig, make_rollout, prompt_length

WORDS = word_table(sk.ACTIONS, 5)


class ScriptedLM(nnx.Module):
    """Puts all probability on one fixed token per position (a policy that always says the same)."""

    def __init__(self, length, script_at, script):
        table = np.full((length, VOCAB), -30.0, np.float32)
        table[:, EOS] = 0.0
        for i, tok in enumerate(script):
            table[script_at - 1 + i] = -30.0
            table[script_at - 1 + i, tok] = 0.0
        self.table = nnx.Param(jnp.asarray(table))

    def __call__(self, tokens, mask):
        return jnp.broadcast_to(self.table[...][None] * 10.0, tokens.shape + (VOCAB,))


def _words(text):
    return np.concatenate([encode(text), [EOS]])


@pytest.mark.parametrize("text,want", [("up", 0), ("down", 1), ("left", 2), ("right", 3), ("rig", -1), ("upx", -1)])
def test_parse_action(text, want):
    resp = np.zeros(6, np.int32)
    ids = _words(text) if text != "upx" else encode("upx")
    resp[: len(ids)] = ids
    assert int(parse_response(jnp.asarray(resp), jnp.asarray(WORDS), jnp.ones(4, bool))) == want


def _run(script_text, K=3, max_steps=4, seed=0):
    env = sk.SokobanConfig(max_steps=max_steps)
    cfg = RolloutConfig(group_size=K)
    P = prompt_length(env.size * (env.size + 1), cfg.prompt_history, 5)
    model = ScriptedLM(P + cfg.max_response, P, _words(script_text))
    levels = sk.generate_levels(2, config=env, seed=seed)
    out = jax.jit(make_rollout(model, sk.SokobanEnv(env), cfg))(nnx.state(model, nnx.Param), levels, jax.random.PRNGKey(0))
    return out, levels, env, P


def test_scripted_policy_moves_and_batch_is_consistent():
    out, levels, env, P = _run("right")
    B, K, T = out.batch.mask.shape
    assert (B, K, T) == (2, 3, 4)
    assert np.all(np.asarray(out.actions)[np.asarray(out.batch.mask)] == 3)
    assert np.all(np.asarray(out.batch.penalty) == 0)
    assert decode(np.asarray(out.tokens)[0, 0, 0, P:]) == "right"
    assert np.asarray(out.response_mask)[0, 0, 0].sum() == len("right") + 1  # through EOS
    # The obs key of step t is the hash of the grid before step t; replay the level on the host.
    for b in range(B):
        s = sk.reset(sk.level_at(levels, b))
        for t in range(T):
            if not bool(out.batch.mask[b, 0, t]):
                break
            g = np.asarray(s.grid).reshape(1, -1).astype(np.int32)
            np.testing.assert_array_equal(np.asarray(out.batch.obs_key)[b, 0, t], np.asarray(hash_tokens(g, g >= 0))[0])
            s, r, d = sk.step(s, 3, env)
            assert float(out.batch.reward[b, 0, t]) == float(r)
    # every trajectory of a group is identical under a deterministic policy
    keys = np.asarray(out.batch.obs_key)
    assert (keys[:, :1] == keys).all()
    bj.check_batch(out.batch)  # a valid StepBatch (prefix masks, codes, finite)
    adv = bj.gated_bepo(out.batch).advantage
    assert adv.shape == (2, 3, 4)


def test_invalid_responses_are_noops_with_penalty():
    out, levels, env, P = _run("xyz")
    m = np.asarray(out.batch.mask)
    assert np.all(np.asarray(out.actions)[m] == -1)
    np.testing.assert_allclose(np.asarray(out.batch.penalty)[m], -0.1)
    assert len(set(map(tuple, np.asarray(out.batch.obs_key)[0, 0][m[0, 0]]))) == 1  # never moved
    assert np.all(np.asarray(out.batch.outcome) == bj.TRUNCATED)


def test_constrained_decoding_always_spells_an_action():
    env = sk.SokobanConfig(max_steps=4)
    cfg = RolloutConfig(group_size=4, constrained=True, temperature=2.0)
    model = bj.models.DecoderLM(bj.models.TransformerConfig(vocab=VOCAB, context=prompt_length(42, 2, 5) + 6, layers=1,
                                                            width=16, heads=2), rngs=nnx.Rngs(0))
    levels = sk.generate_levels(2, config=env, seed=1)
    out = jax.jit(make_rollout(model, sk.SokobanEnv(env), cfg))(nnx.state(model, nnx.Param), levels, jax.random.PRNGKey(3))
    m = np.asarray(out.batch.mask)
    acts = np.asarray(out.actions)[m]
    assert np.all(acts >= 0) and len(set(acts.tolist())) > 1  # valid, and not all the same
    assert np.all(np.asarray(out.batch.penalty) == 0)
    assert np.all(np.isfinite(np.asarray(out.old_logp)))


def test_rollout_config_errors():
    with pytest.raises(ValueError, match="max_response=1 is out of range"):
        RolloutConfig(max_response=1)
    model = bj.models.DecoderLM(bj.models.TransformerConfig(vocab=VOCAB, context=64, layers=1, width=8, heads=2),
                                rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_response=4 cannot hold the longest action word"):
        make_rollout(model, sk.SokobanEnv(), RolloutConfig(max_response=4))
    with pytest.raises(ValueError, match="invalid_penalty=1.0 is out of range"):
        RolloutConfig(invalid_penalty=1.0)
