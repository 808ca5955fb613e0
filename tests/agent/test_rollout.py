"""Rollouts of a token policy in JAX Sokoban: prompts, parsing, invalid actions, StepBatch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bepo_jax as bj
import bepo_jax.agent.models
from bepo_jax.agent.envs import sokoban as sk
from bepo_jax.agent.envs.text import EOS, VOCAB, decode, encode
from bepo_jax.credit.hashing import hash_tokens
from bepo_jax.agent.envs.base import parse_response, word_table
from bepo_jax.agent.rollouts.jitted import RolloutConfig, make_rollout, prompt_length

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
    # the action key is the action id's (the same action, the same key; padding is the invalid id's)
    ak, valid = np.asarray(out.batch.action_key), np.asarray(out.batch.mask)
    np.testing.assert_array_equal(ak[valid], np.broadcast_to(np.asarray(bj.action_keys(np.array([3]))), ak[valid].shape))
    assert not (ak[~valid] == ak[valid][:1]).all(axis=-1).any()
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
    model = bj.agent.models.DecoderLM(bj.agent.models.TransformerConfig(vocab=VOCAB, context=prompt_length(42, 2, 5) + 6, layers=1,
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
    model = bj.agent.models.DecoderLM(bj.agent.models.TransformerConfig(vocab=VOCAB, context=64, layers=1, width=8, heads=2),
                                rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_response=4 cannot hold the longest action word"):
        make_rollout(model, sk.SokobanEnv(), RolloutConfig(max_response=4))
    with pytest.raises(ValueError, match="invalid_penalty=1.0 is out of range"):
        RolloutConfig(invalid_penalty=1.0)


# ------------------------------------------------------------------ KV-cache decoding

def _reference_logits(model, tokens, mask):
    """The decoder's forward written out with an explicit [N, L, L] mask (the earlier
    implementation): causal, padded keys hidden, a padded query sees itself only."""
    N, L = tokens.shape
    h = model.embed(tokens) + model.pos(jnp.arange(L))[None]
    m = jnp.tril(jnp.ones((L, L), bool))[None] & mask[:, None, :] & mask[:, :, None] | jnp.eye(L, dtype=bool)[None]
    for blk in model.blocks:
        q, k, v = blk._qkv(h)
        s = jnp.einsum("nqhd,nkhd->nhqk", q, k) / jnp.sqrt(q.shape[-1])
        att = jax.nn.softmax(jnp.where(m[:, None], s, jnp.finfo(s.dtype).min), axis=-1)
        h = blk._out(h, jnp.einsum("nhqk,nkhd->nqhd", att, v))
    return model.head(model.ln_f(h))


def _random_prompts(seed, n, p):
    rng = np.random.default_rng(seed)
    pm = rng.random((n, p)) < 0.75
    pm[:, 0] = pm[:, -1] = True  # BOS and SEP: prompts start and end with a real token
    return np.where(pm, rng.integers(4, VOCAB, (n, p)), 0).astype(np.int32), pm


@pytest.mark.parametrize("seed", [0, 1])
def test_attention_without_mask_tensors_equals_the_explicit_mask_at_real_positions(seed):
    model = bj.agent.models.DecoderLM(bj.agent.models.TransformerConfig(vocab=VOCAB, layers=2, width=32, heads=4, context=24),
                                rngs=nnx.Rngs(seed))
    tok, pm = _random_prompts(seed, 5, 24)
    got, want = np.asarray(model(tok, pm)), np.asarray(_reference_logits(model, jnp.asarray(tok), jnp.asarray(pm)))
    np.testing.assert_allclose(got[pm], want[pm], rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(got))  # padded positions are finite too (no all-masked NaN rows)


def test_prefill_and_decode_steps_give_the_full_forward_logits():
    model = bj.agent.models.DecoderLM(bj.agent.models.TransformerConfig(vocab=VOCAB, layers=2, width=32, heads=4, context=30),
                                rngs=nnx.Rngs(2))
    tok, pm = _random_prompts(3, 4, 30)
    P = 18
    full = np.asarray(model(tok, pm))
    logits, cache = model.prefill(jnp.asarray(tok[:, :P]), jnp.asarray(pm[:, :P]), 30)
    np.testing.assert_allclose(np.asarray(logits), full[:, P - 1], rtol=1e-5, atol=1e-5)
    step = jax.jit(model.decode_step)
    for pos in range(P, 30):
        logits, cache = step(jnp.asarray(tok[:, pos]), jnp.int32(pos), jnp.asarray(pm[:, pos]), cache)
        real = pm[:, pos]  # the output at a real position is the full forward's
        np.testing.assert_allclose(np.asarray(logits)[real], full[real, pos], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("constrained,per_row,temperature", [(False, False, 1.0), (True, False, 0.7), (True, True, 2.0)])
def test_cached_sampling_equals_the_full_forward_path(constrained, per_row, temperature):
    from bepo_jax.agent.rollouts.jitted import forced_positions, sample_responses

    model = bj.agent.models.DecoderLM(bj.agent.models.TransformerConfig(vocab=VOCAB, layers=2, width=32, heads=4, context=40),
                                rngs=nnx.Rngs(4))
    tok, pm = _random_prompts(5, 16, 32)
    kw = {}
    if constrained:
        words = WORDS
        table = jnp.broadcast_to(jnp.asarray(words), (16,) + words.shape)
        valid = jnp.asarray(np.random.default_rng(0).random((16, words.shape[0])) < 0.7) | (jnp.arange(4) == 0)
        kw = dict(table=table, table_valid=valid, forced=None if per_row else forced_positions(words))
    out = {d: sample_responses(model, tok, pm, jax.random.key(7), max_response=8, temperature=temperature,
                               decode=d, **kw) for d in ("full", "cached")}
    for name, a, b in zip(("tokens", "mask", "response_mask"), out["full"][:3], out["cached"][:3]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    np.testing.assert_allclose(np.asarray(out["cached"][3]), np.asarray(out["full"][3]), rtol=1e-5, atol=2e-5)
    if constrained:  # every row spelled one of its allowed words
        acts = np.asarray(jax.vmap(parse_response)(out["cached"][0][:, 32:], kw["table"], kw["table_valid"]))
        assert np.all(acts >= 0) and np.all(np.asarray(kw["table_valid"])[np.arange(16), acts])


def test_rollouts_with_cached_and_full_decoding_are_the_same():
    env = sk.SokobanEnv(sk.SokobanConfig(max_steps=4))
    model = bj.agent.models.DecoderLM(bj.agent.models.TransformerConfig(vocab=VOCAB, context=prompt_length(42, 2, 5) + 8, layers=1,
                                                            width=16, heads=2), rngs=nnx.Rngs(0))
    levels = sk.generate_levels(2, config=env.config, seed=1)
    params = nnx.state(model, nnx.Param)
    outs = {d: jax.jit(make_rollout(model, env, RolloutConfig(group_size=3, constrained=True, max_response=8,
                                                                decode=d)))(params, levels, jax.random.PRNGKey(3))
            for d in ("full", "cached")}
    np.testing.assert_array_equal(np.asarray(outs["full"].tokens), np.asarray(outs["cached"].tokens))
    np.testing.assert_array_equal(np.asarray(outs["full"].actions), np.asarray(outs["cached"].actions))
    np.testing.assert_allclose(np.asarray(outs["cached"].old_logp), np.asarray(outs["full"].old_logp), atol=2e-5)


def test_decode_option_errors_and_fallback():
    from bepo_jax.agent.rollouts.jitted import sample_responses

    with pytest.raises(ValueError, match="RolloutConfig.decode='kv'"):
        RolloutConfig(decode="kv")

    class NoCache(nnx.Module):  # a model with the forward contract only
        def __init__(self):
            self.w = nnx.Param(jnp.zeros((VOCAB,)))

        def __call__(self, tokens, mask):
            return jnp.broadcast_to(self.w[...], tokens.shape + (VOCAB,))

    tok, pm = _random_prompts(0, 2, 6)
    with pytest.raises(ValueError, match="decode='cached' needs a model with prefill"):
        sample_responses(NoCache(), tok, pm, jax.random.key(0), max_response=3, temperature=1.0, decode="cached")
    seq, *_ = sample_responses(NoCache(), tok, pm, jax.random.key(0), max_response=3, temperature=1.0)  # auto: full
    assert seq.shape == (2, 9)
