"""The Llama-family decoder (bepo_jax.agent.models.llama) on tiny random configs: its logits against
a plain-NumPy forward written here from the architecture's equations, left padding, the decode
contract, the scoring shortcut, RoPE scaling against the published formula, and bad configs."""

import math

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bepo_jax.agent.models.llama import LlamaConfig, LlamaLM, rope_frequencies

TINY = dict(vocab=97, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, intermediate=48, rope_theta=1e4,
            context=64)


def _model(**over):
    cfg = LlamaConfig(**{**TINY, **over})
    model = LlamaLM(cfg, rngs=nnx.Rngs(0))
    # random norms and biases too, so that every parameter matters
    state = nnx.state(model)
    leaves, tree = jax.tree_util.tree_flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    nnx.update(model, jax.tree_util.tree_unflatten(tree, leaves))
    return model


def numpy_forward(model, tokens):
    """Llama's forward for one unpadded row, in float64 NumPy, from the equations alone."""
    cfg = model.cfg
    p = nnx.to_pure_dict(nnx.state(model))
    a = lambda x: np.asarray(x, np.float64)
    E = a(p["embed"]["embedding"])
    h = E[np.asarray(tokens)]
    L = len(tokens)
    D, H, KV = cfg.head_dim, cfg.heads, cfg.kv_heads
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, D, 2) / D)
    ang = np.arange(L)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.rms_eps) * a(w)

    def rope(x):  # x [L, heads, D]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos[:, None] + np.concatenate([-x2, x1], -1) * sin[:, None]

    def lin(x, layer, bias=True):
        y = x @ a(layer["kernel"])
        return y + a(layer["bias"]) if bias and "bias" in layer else y

    for i in range(cfg.layers):
        lp = p["layers"][i]
        x = rms(h, lp["attn_norm"]["scale"])
        q = rope(lin(x, lp["q_proj"]).reshape(L, H, D))
        k = rope(lin(x, lp["k_proj"]).reshape(L, KV, D))
        v = lin(x, lp["v_proj"]).reshape(L, KV, D)
        out = np.zeros((L, H, D))
        for head in range(H):
            kv = head // (H // KV)
            s = q[:, head] @ k[:, kv].T / math.sqrt(D)
            s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
            w = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (w / w.sum(-1, keepdims=True)) @ v[:, kv]
        h = h + lin(out.reshape(L, H * D), lp["o_proj"])
        m = rms(h, lp["mlp_norm"]["scale"])
        g = lin(m, lp["gate_proj"])
        h = h + lin(g / (1 + np.exp(-g)) * lin(m, lp["up_proj"]), lp["down_proj"])
    h = rms(h, p["norm"]["scale"])
    return h @ E.T if cfg.tie_embeddings else h @ a(p["lm_head"]["kernel"])


@pytest.mark.parametrize("over", [{}, {"tie_embeddings": False, "attention_bias": True, "kv_heads": 1}])
def test_logits_equal_a_plain_numpy_forward(over):
    model = _model(**over)
    tokens = np.random.default_rng(0).integers(0, TINY["vocab"], (2, 11))
    got = np.asarray(model(jnp.asarray(tokens), jnp.ones((2, 11), bool)))
    for row in range(2):
        np.testing.assert_allclose(got[row], numpy_forward(model, tokens[row]), rtol=2e-4, atol=2e-4)


def test_left_padding_changes_nothing_at_real_positions():
    model = _model()
    tokens = np.random.default_rng(1).integers(0, TINY["vocab"], (1, 9))
    plain = np.asarray(model(jnp.asarray(tokens), jnp.ones((1, 9), bool)))[0]
    padded = np.concatenate([np.full((1, 5), 3), tokens], axis=1)
    mask = np.concatenate([np.zeros((1, 5), bool), np.ones((1, 9), bool)], axis=1)
    got = np.asarray(model(jnp.asarray(padded), jnp.asarray(mask)))[0, 5:]
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)


def test_prefill_and_decode_steps_give_the_full_forward_logits():
    """The decode contract with left-padded prompts of different lengths and a row that stops early."""
    model = _model()
    rng = np.random.default_rng(2)
    P, R = 7, 5
    prompts = rng.integers(0, TINY["vocab"], (3, P))
    pmask = np.ones((3, P), bool)
    pmask[1, :3] = False  # a shorter, left-padded prompt
    reply = rng.integers(0, TINY["vocab"], (3, R))
    valid = np.ones((3, R), bool)
    valid[2, 2:] = False  # row 2 ended after two reply tokens
    logits, cache = model.prefill(jnp.asarray(prompts), jnp.asarray(pmask), P + R)
    steps = [np.asarray(logits)]
    for t in range(R):
        logits, cache = model.decode_step(jnp.asarray(reply[:, t]), P + t, jnp.asarray(valid[:, t]), cache)
        steps.append(np.asarray(logits))
    full = np.asarray(model(jnp.asarray(np.concatenate([prompts, reply], 1)),
                            jnp.asarray(np.concatenate([pmask, valid], 1))))
    for t in range(R + 1):
        for row in range(3):
            if t == 0 or valid[row, t - 1]:
                np.testing.assert_allclose(steps[t][row], full[row, P - 1 + t], rtol=1e-4, atol=1e-4)


def test_prefill_makes_no_logits_at_every_prompt_position():
    """The prefill's program holds no [N, P, vocab] value: the head runs at the last position only
    (read from its jaxpr, the program JAX traces; the full forward's does hold one)."""
    model = _model(vocab=211)  # a vocabulary no other dimension equals
    N, P = 3, 10
    tokens, mask = jnp.zeros((N, P), jnp.int32), jnp.ones((N, P), bool)

    def shapes(fn):
        jaxpr = jax.make_jaxpr(fn)(tokens, mask).jaxpr
        found, todo = set(), [jaxpr]
        while todo:
            j = todo.pop()
            for eqn in j.eqns:
                found.update(tuple(v.aval.shape) for v in eqn.outvars)
                todo.extend(sub.jaxpr if hasattr(sub, "jaxpr") else sub
                            for sub in jax.extend.core.jaxprs_in_params(eqn.params))
        return found

    assert (N, P, 211) in shapes(lambda t, m: model(t, m))
    got = shapes(lambda t, m: model.prefill(t, m, P + 4)[0])
    assert (N, P, 211) not in got and (N, 211) in got


def test_score_is_the_full_forward_from_start():
    model = _model()
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, TINY["vocab"], (2, 12)))
    mask = jnp.ones((2, 12), bool)
    np.testing.assert_allclose(np.asarray(model.score(tokens, mask, 8)), np.asarray(model(tokens, mask))[:, 8:],
                               rtol=1e-5, atol=1e-5)


def test_llama3_rope_scaling_follows_the_published_formula():
    """Meta's reference (llama3's apply_scaling), written as a plain loop over the frequencies."""
    cfg = LlamaConfig(**{**TINY, "head_dim": 64, "rope_theta": 500000.0}, rope_type="llama3", rope_factor=8.0,
                      rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_context=8192)
    want = []
    for i in range(0, 64, 2):
        f = 1.0 / 500000.0 ** (i / 64)
        wavelen = 2 * math.pi / f
        if wavelen < 8192 / 4.0:
            want.append(f)
        elif wavelen > 8192 / 1.0:
            want.append(f / 8.0)
        else:
            s = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            want.append((1 - s) * f / 8.0 + s * f)
    np.testing.assert_allclose(np.asarray(rope_frequencies(cfg)), want, rtol=1e-5)
    linear = LlamaConfig(**TINY, rope_type="linear", rope_factor=2.0)
    np.testing.assert_allclose(np.asarray(rope_frequencies(linear)) * 2,
                               1.0 / 1e4 ** (np.arange(0, 8, 2) / 8), rtol=1e-6)


def test_bfloat16_runs_close_to_float32():
    model32 = _model()
    model16 = LlamaLM(LlamaConfig(**TINY, dtype="bfloat16"), rngs=nnx.Rngs(0))
    state = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), nnx.state(model32))
    nnx.update(model16, state)
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, TINY["vocab"], (1, 10)))
    a, b = model32(tokens, jnp.ones((1, 10), bool)), model16(tokens, jnp.ones((1, 10), bool))
    assert b.dtype == jnp.float32 and np.isfinite(np.asarray(b)).all()
    assert float(jnp.max(jnp.abs(a - b))) < 0.1 * float(jnp.max(jnp.abs(a)))


@pytest.mark.parametrize("over,match", [({"kv_heads": 3}, "multiple of kv_heads"), ({"head_dim": 7}, "even"),
                                        ({"rope_type": "yarn"}, "rope_type"), ({"dtype": "float16"}, "dtype"),
                                        ({"rms_eps": 0.0}, "rms_eps")])
def test_bad_configs_name_the_field(over, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig(**{**TINY, **over})


def test_a_sequence_longer_than_the_context_is_refused():
    model = _model()
    with pytest.raises(ValueError, match="exceeds the model's context of 64 tokens"):
        model(jnp.zeros((1, 65), jnp.int32), jnp.ones((1, 65), bool))
