"""A small decoder-only transformer in Flax NNX (pre-LayerNorm, learned positions).

    h_0 = E[tokens] + P[positions];  h_{l+1} = h_l + MLP(LN(h_l + Attn(LN(h_l))));  logits = LN(h) W_out

Causal self-attention (``attention``: ``jax.nn.dot_product_attention`` on GPU/TPU, head-major
matmuls on CPU) with padded keys masked by an additive [N, 1, 1, L] bias — no
[N, L, L] mask tensor. Outputs at real positions attend to the real tokens up to them;
outputs at padded positions are defined (no NaN) but meaningless.

Decode path (models.interface): ``prefill`` runs the prompt once and keeps every layer's
keys and values in a ``DecodeCache``; ``decode_step`` adds one token and attends over the
cache: O(L) per sampled token instead of a full O(L^2) forward. Kernels carry partition annotations:
embedding and MLP/attention inputs shard their first axis over ``"fsdp"``, so the
parameters and optimizer state split across an FSDP mesh axis.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from ...credit.configs import check_int, check_range


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """vocab: token ids in [0, vocab). layers, width (model dim), heads (width % heads == 0),
    context: the longest sequence. mlp_ratio: hidden = mlp_ratio * width. head_init_scale:
    the output head's initial weights are LeCun-normal times this factor (1 = plain LeCun;
    a small value such as 0.01 starts the policy near uniform over every token, the usual
    policy-head initialisation of PPO). The default is tiny enough to train on a 2-core CPU."""

    vocab: int = 64
    layers: int = 2
    width: int = 64
    heads: int = 4
    context: int = 64
    mlp_ratio: int = 4
    head_init_scale: float = 1.0

    def __post_init__(self):
        for f in ("vocab", "layers", "width", "heads", "context", "mlp_ratio"):
            check_int("TransformerConfig", f, getattr(self, f), lo=1)
        check_range("TransformerConfig", "head_init_scale", self.head_init_scale, lo=0.0, lo_open=True)
        if self.width % self.heads:
            raise ValueError(f"TransformerConfig.width={self.width} must be a multiple of heads={self.heads}.")


def _dense(din, dout, rngs, spec=("fsdp", None), scale: float = 1.0):
    """A bias-free linear layer, LeCun-normal initialised with its standard deviation times ``scale``."""
    base = nnx.initializers.variance_scaling(scale**2, "fan_in", "truncated_normal")
    init = nnx.with_partitioning(base, spec, eager_sharding=False)
    return nnx.Linear(din, dout, kernel_init=init, use_bias=False, rngs=rngs)


_NEG = -1e9  # additive bias of a masked key: finite, so a query with no visible key gets no NaN


def key_bias(valid: Bool[Array, "N S"]) -> Float[Array, "N 1 1 S"]:
    """Additive attention bias of the keys: 0 where valid, -1e9 where not (broadcast over
    heads and queries; no [N, L, L] mask is built)."""
    return jnp.where(valid, 0.0, _NEG).astype(jnp.float32)[:, None, None, :]


def attention(q: Float[Array, "N Q H D"], k: Float[Array, "N S H D"], v: Float[Array, "N S H D"],
              bias: Float[Array, "N 1 1 S"], *, causal: bool, q_offset: int = 0) -> Float[Array, "N Q H D"]:
    """softmax(q k^T / sqrt(D) + bias [+ causal mask]) v per head. ``q_offset`` (static):
    the queries are the positions q_offset .. q_offset + Q - 1 of the keys' sequence, so
    the causal mask lets query i see keys j <= q_offset + i. On GPU/TPU through
    ``jax.nn.dot_product_attention`` (fused kernels where the backend has them); on CPU as
    head-major batched matmuls, which XLA:CPU runs about 2.6x faster than the former at
    146 tokens (``experiments/results/bench_env_loop.md``)."""
    Q, S = q.shape[1], k.shape[1]
    visible = (q_offset + jnp.arange(Q))[:, None] >= jnp.arange(S)[None]  # [Q, S]
    if jax.default_backend() != "cpu":
        if causal and q_offset:
            return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=visible[None, None])
        return jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=causal)
    qt, kt, vt = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [N, H, L, D]
    s = jnp.matmul(qt, jnp.swapaxes(kt, -1, -2)) / jnp.sqrt(q.shape[-1]).astype(q.dtype) + bias
    if causal:
        s = s + jnp.where(visible, 0.0, _NEG).astype(s.dtype)
    return jnp.swapaxes(jnp.matmul(jax.nn.softmax(s, axis=-1), vt), 1, 2)


class Block(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        w = cfg.width
        self.heads = cfg.heads
        self.ln1 = nnx.LayerNorm(w, rngs=rngs)
        self.qkv = _dense(w, 3 * w, rngs)
        self.proj = _dense(w, w, rngs)
        self.ln2 = nnx.LayerNorm(w, rngs=rngs)
        self.up = _dense(w, cfg.mlp_ratio * w, rngs)
        self.down = _dense(cfg.mlp_ratio * w, w, rngs)

    def _qkv(self, h):
        N, L, W = h.shape
        q, k, v = jnp.split(self.qkv(self.ln1(h)), 3, axis=-1)
        shape = (N, L, self.heads, W // self.heads)
        return tuple(x.reshape(shape) for x in (q, k, v))

    def _out(self, h, att):
        N, L, W = h.shape
        h = h + self.proj(att.reshape(N, L, W))
        return h + self.down(nnx.gelu(self.up(self.ln2(h))))

    def __call__(self, h, bias, out_from: int = 0):
        """Causal self-attention over the whole sequence; ``bias`` [N, 1, 1, L] masks keys.
        Returns the block's output at positions ``out_from`` onward (static; 0 = all) and
        this layer's keys and values at every position (for a cache)."""
        q, k, v = self._qkv(h)
        att = attention(q[:, out_from:], k, v, bias, causal=True, q_offset=out_from)
        return self._out(h[:, out_from:], att), (k, v)

    def step(self, h, pos, cache_k, cache_v, bias):
        """One new position ``pos`` (h [N, 1, W]) against the cached keys and values
        [N, S, heads, d], after writing its own there; ``bias`` masks the cache's keys."""
        q, k, v = self._qkv(h)
        cache_k = jax.lax.dynamic_update_slice_in_dim(cache_k, k, pos, axis=1)
        cache_v = jax.lax.dynamic_update_slice_in_dim(cache_v, v, pos, axis=1)
        att = attention(q, cache_k, cache_v, bias, causal=False)
        return self._out(h, att), cache_k, cache_v


class DecodeCache(NamedTuple):
    """Per-layer keys and values [N, S, heads, d] of the positions written so far, and
    which positions are visible keys (real tokens already written) [N, S]."""

    k: tuple
    v: tuple
    valid: Bool[Array, "N S"]


class DecoderLM(nnx.Module):
    """``DecoderLM(cfg, rngs=nnx.Rngs(0))(tokens, mask) -> logits`` (see models.interface),
    with the decode contract: ``prefill`` and ``decode_step`` over a ``DecodeCache``."""

    def __init__(self, cfg: TransformerConfig = TransformerConfig(), *, rngs: nnx.Rngs):
        self.cfg = cfg
        emb_init = nnx.with_partitioning(nnx.initializers.normal(0.02), ("fsdp", None), eager_sharding=False)
        self.embed = nnx.Embed(cfg.vocab, cfg.width, embedding_init=emb_init, rngs=rngs)
        self.pos = nnx.Embed(cfg.context, cfg.width, embedding_init=emb_init, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
        self.ln_f = nnx.LayerNorm(cfg.width, rngs=rngs)
        self.head = _dense(cfg.width, cfg.vocab, rngs, scale=cfg.head_init_scale)

    def _check(self, length: int) -> None:
        if length > self.cfg.context:
            raise ValueError(f"sequence length {length} exceeds TransformerConfig.context={self.cfg.context}.")

    def _forward(self, tokens, mask, start: int = 0):
        N, L = tokens.shape
        self._check(L)
        h = self.embed(tokens) + self.pos(jnp.arange(L))[None]
        bias = key_bias(mask)
        kv = []
        for i, blk in enumerate(self.blocks):
            h, layer_kv = blk(h, bias, start if i == len(self.blocks) - 1 else 0)
            kv.append(layer_kv)
        return self.head(self.ln_f(h)), kv

    def __call__(self, tokens: Int[Array, "N L"], mask: Bool[Array, "N L"]) -> Float[Array, "N L V"]:
        return self._forward(tokens, mask)[0]

    def score(self, tokens: Int[Array, "N L"], mask: Bool[Array, "N L"], start: int) -> Float[Array, "N L-start V"]:
        """``self(tokens, mask)[:, start:]`` (``start`` static), computed so: every layer but
        the last runs at every position (the last one's keys and values need them), the
        last one's queries, MLP and the output head only from ``start``. For a policy
        update whose responses follow a long prompt this skips most of the last layer:
        at a 628-token prompt and 25-token responses its attention shrinks 26x."""
        return self._forward(tokens, mask, start)[0]

    def prefill(self, tokens: Int[Array, "N P"], mask: Bool[Array, "N P"], length: int
                ) -> tuple[Float[Array, "N V"], DecodeCache]:
        """Run the prompt once: the logits at its last position (the next token's
        distribution) and a cache of ``length`` positions holding the prompt's keys and values."""
        N, P = tokens.shape
        self._check(length)
        logits, kv = self._forward(tokens, mask)
        pad = lambda x: jnp.pad(x, ((0, 0), (0, length - P), (0, 0), (0, 0)))
        cache = DecodeCache(k=tuple(pad(k) for k, _ in kv), v=tuple(pad(v) for _, v in kv),
                            valid=jnp.pad(mask, ((0, 0), (0, length - P))))
        return logits[:, -1], cache

    def decode_step(self, token: Int[Array, "N"], pos, valid: Bool[Array, "N"], cache: DecodeCache
                    ) -> tuple[Float[Array, "N V"], DecodeCache]:
        """Write ``token`` at position ``pos`` (a traced int; ``valid`` marks the rows where it
        is a real token) and return the next token's logits: one cached step, O(S) per layer."""
        h = self.embed(token[:, None]) + self.pos(jnp.reshape(pos, (1,)))[None]
        vis = jax.lax.dynamic_update_slice_in_dim(cache.valid, valid[:, None], pos, axis=1)
        S = vis.shape[1]
        bias = key_bias(vis & (jnp.arange(S) <= pos)[None])
        ks, vs = [], []
        for blk, ck, cv in zip(self.blocks, cache.k, cache.v):
            h, ck, cv = blk.step(h, pos, ck, cv, bias)
            ks.append(ck)
            vs.append(cv)
        return self.head(self.ln_f(h))[:, 0], DecodeCache(k=tuple(ks), v=tuple(vs), valid=vis)
