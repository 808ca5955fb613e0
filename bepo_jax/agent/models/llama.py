"""A Llama-family decoder in Flax NNX: the architecture of Llama 2/3, SmolLM, Qwen2/2.5 and kin.

    h_0 = E[tokens];  a_l = h_l + W_o Attn(RoPE(W_q n), RoPE(W_k n), W_v n),  n = RMSNorm(h_l)
    h_{l+1} = a_l + W_down( silu(W_gate m) * W_up m ),  m = RMSNorm(a_l);  logits = RMSNorm(h_L) W_head

Grouped-query attention (``heads`` query heads share ``kv_heads`` key/value heads, query head
h reading key/value head h // (heads / kv_heads), as transformers' ``repeat_kv``); RoPE in the
rotate-half layout with the checkpoint's theta and scaling (``default``, ``linear``, or
``llama3``'s frequency-dependent one); RMSNorm  x / sqrt(mean(x^2) + eps) * w  computed in
float32; SwiGLU; tied (W_head = E^T) or untied output head; optional q/k/v biases (Qwen2).

Positions are counted over the real tokens of each row (position = the number of real tokens
before it), so a left-padded prompt gives the logits of the same prompt unpadded, as
transformers does from an attention mask. The policy interface and the decode contract of
``models.interface`` hold: ``model(tokens, mask)``, ``prefill`` / ``decode_step`` over a
``LlamaCache`` (keys and values of every layer, the visible positions and each row's next
position), and the scoring shortcut ``score``. Parameters carry partition annotations over the
``"fsdp"`` and ``"model"`` mesh axes (attention heads and the MLP's hidden units on ``"model"``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from ...credit.configs import check_bool, check_choice, check_int, check_range
from .transformer import _NEG, key_bias

ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """vocab, hidden (model width), layers, heads (query heads), kv_heads (key/value heads,
    dividing heads), head_dim, intermediate (the SwiGLU hidden width); rope_theta; rope_type
    ("default", "linear": positions / rope_factor, "llama3": rope_factor, rope_low_freq_factor,
    rope_high_freq_factor, rope_original_context); rms_eps; tie_embeddings (the output head is
    the embedding's transpose); attention_bias (q/k/v biases, Qwen2); context (the longest
    sequence); dtype ("float32", the default, or "bfloat16": parameters and activations; the
    logits and the norms are float32 either way)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192
    rms_eps: float = 1e-5
    tie_embeddings: bool = True
    attention_bias: bool = False
    context: int = 2048
    dtype: str = "float32"

    def __post_init__(self):
        n = "LlamaConfig"
        for f in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "context",
                  "rope_original_context"):
            check_int(n, f, getattr(self, f), lo=1)
        if self.heads % self.kv_heads:
            raise ValueError(f"LlamaConfig.heads={self.heads} must be a multiple of kv_heads={self.kv_heads}.")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim={self.head_dim} must be even (RoPE rotates pairs).")
        check_range(n, "rope_theta", self.rope_theta, lo=0.0, lo_open=True)
        check_range(n, "rope_factor", self.rope_factor, lo=0.0, lo_open=True)
        check_range(n, "rms_eps", self.rms_eps, lo=0.0, lo_open=True)
        check_choice(n, "rope_type", self.rope_type, ROPE_TYPES)
        check_choice(n, "dtype", self.dtype, DTYPES)
        check_bool(n, "tie_embeddings", self.tie_embeddings)
        check_bool(n, "attention_bias", self.attention_bias)
        if self.rope_type == "llama3" and not self.rope_high_freq_factor > self.rope_low_freq_factor:
            raise ValueError("LlamaConfig: llama3 RoPE scaling needs rope_high_freq_factor > rope_low_freq_factor.")

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]


def rope_frequencies(cfg: LlamaConfig) -> Float[Array, "D/2"]:
    """The inverse frequencies theta^(-2i/D), i < D/2, after the checkpoint's scaling:
    ``linear`` divides them by the factor; ``llama3`` divides the low frequencies (wavelength
    > original_context / low_freq_factor) by it, keeps the high ones (wavelength <
    original_context / high_freq_factor) and interpolates smoothly between."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    if cfg.rope_type == "linear":
        return inv / cfg.rope_factor
    if cfg.rope_type == "llama3":
        old = float(cfg.rope_original_context)
        low_wave, high_wave = old / cfg.rope_low_freq_factor, old / cfg.rope_high_freq_factor
        wave = 2 * math.pi / inv
        scaled = jnp.where(wave > low_wave, inv / cfg.rope_factor, inv)
        smooth = (old / wave - cfg.rope_low_freq_factor) / (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor)
        smoothed = (1 - smooth) * scaled / cfg.rope_factor + smooth * scaled
        medium = (wave >= high_wave) & (wave <= low_wave)
        return jnp.where(medium, smoothed, scaled)
    return inv


def rope_tables(positions: Int[Array, "N L"], inv_freq: Float[Array, "D/2"]
                ) -> tuple[Float[Array, "N L 1 D"], Float[Array, "N L 1 D"]]:
    """cos(p f) and sin(p f) at every position, each frequency twice (the rotate-half layout):
    computed once per forward or decode step and shared by every layer's q and k."""
    ang = positions.astype(jnp.float32)[..., None] * inv_freq  # [N, L, D/2]
    return (jnp.concatenate([jnp.cos(ang)] * 2, axis=-1)[:, :, None, :],
            jnp.concatenate([jnp.sin(ang)] * 2, axis=-1)[:, :, None, :])


def apply_rope(x: Float[Array, "N L H D"], cos: Float[Array, "N L 1 D"], sin: Float[Array, "N L 1 D"]):
    """Rotate-half RoPE: x cos(p f) + rotate_half(x) sin(p f), rotate_half(x) = (-x2, x1)."""
    xf = x.astype(jnp.float32)
    x1, x2 = jnp.split(xf, 2, axis=-1)
    return (xf * cos + jnp.concatenate([-x2, x1], axis=-1) * sin).astype(x.dtype)


def gqa_attention(q: Float[Array, "N Q H D"], k: Float[Array, "N KV S D"], v: Float[Array, "N KV S D"],
                  bias: Float[Array, "N 1 1 S"], *, causal: bool, q_offset: int = 0) -> Float[Array, "N Q H D"]:
    """softmax(q k^T / sqrt(D) + bias [+ causal mask]) v with query head h reading key/value
    head h // G (G = H / KV), in float32; ``bias`` is ``transformer.key_bias`` of the visible keys.
    Keys and values are head-major ([N, KV, S, D], the caches' layout: XLA:CPU runs the batched
    matmuls without moving the cache, 4x faster than slot-major at 280 slots). ``q_offset``
    (static): the queries are positions q_offset .. q_offset + Q - 1."""
    N, Q, H, D = q.shape
    KV = k.shape[1]
    qg = q.reshape(N, Q, KV, H // KV, D).astype(jnp.float32)
    s = jnp.einsum("nqkgd,nksd->nkgqs", qg, k.astype(jnp.float32)) / math.sqrt(D)
    s = s + bias[:, :, None]  # [N, 1, 1, 1, S] over (kv head, group, query)
    if causal:
        S = k.shape[2]
        visible = (q_offset + jnp.arange(Q))[:, None] >= jnp.arange(S)[None]
        s = s + jnp.where(visible, 0.0, _NEG)
    out = jnp.einsum("nkgqs,nksd->nqkgd", jax.nn.softmax(s, axis=-1), v.astype(jnp.float32))
    return out.reshape(N, Q, H, D).astype(q.dtype)


def _linear(din, dout, spec, cfg: LlamaConfig, rngs, bias: bool = False):
    init = nnx.with_partitioning(nnx.initializers.normal(0.02), spec, eager_sharding=False)
    binit = nnx.with_partitioning(nnx.initializers.zeros_init(), spec[1:], eager_sharding=False)
    return nnx.Linear(din, dout, use_bias=bias, kernel_init=init, bias_init=binit, dtype=cfg.jnp_dtype,
                      param_dtype=cfg.jnp_dtype, rngs=rngs)


class RMSNorm(nnx.Module):
    """x / sqrt(mean(x^2) + eps) * scale, in float32, returned in the input's dtype."""

    def __init__(self, dim: int, eps: float, dtype):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (self.scale[...].astype(jnp.float32) * y).astype(x.dtype)


class LlamaBlock(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
        H, KV, D, W = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.hidden
        self.heads, self.kv_heads, self.head_dim = H, KV, D
        self.attn_norm = RMSNorm(W, cfg.rms_eps, cfg.jnp_dtype)
        self.q_proj = _linear(W, H * D, ("fsdp", "model"), cfg, rngs, cfg.attention_bias)
        self.k_proj = _linear(W, KV * D, ("fsdp", "model"), cfg, rngs, cfg.attention_bias)
        self.v_proj = _linear(W, KV * D, ("fsdp", "model"), cfg, rngs, cfg.attention_bias)
        self.o_proj = _linear(H * D, W, ("model", "fsdp"), cfg, rngs)
        self.mlp_norm = RMSNorm(W, cfg.rms_eps, cfg.jnp_dtype)
        self.gate_proj = _linear(W, cfg.intermediate, ("fsdp", "model"), cfg, rngs)
        self.up_proj = _linear(W, cfg.intermediate, ("fsdp", "model"), cfg, rngs)
        self.down_proj = _linear(cfg.intermediate, W, ("model", "fsdp"), cfg, rngs)

    def qkv(self, h, rope):
        """Queries [N, L, H, D]; keys and values head-major [N, KV, L, D] (``gqa_attention``)."""
        N, L, _ = h.shape
        x = self.attn_norm(h)
        q = self.q_proj(x).reshape(N, L, self.heads, self.head_dim)
        k = self.k_proj(x).reshape(N, L, self.kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(N, L, self.kv_heads, self.head_dim)
        return apply_rope(q, *rope), apply_rope(k, *rope).swapaxes(1, 2), v.swapaxes(1, 2)

    def out(self, h, att):
        N, L = att.shape[:2]
        h = h + self.o_proj(att.reshape(N, L, -1))
        m = self.mlp_norm(h)
        return h + self.down_proj(nnx.silu(self.gate_proj(m)) * self.up_proj(m))

    def __call__(self, h, rope, bias, out_from: int = 0):
        """The block over the whole sequence (``rope``: ``rope_tables`` of its positions); returns its
        output from position ``out_from`` on (static). The caches are filled by ``extend``."""
        q, k, v = self.qkv(h, rope)
        att = gqa_attention(q[:, out_from:], k, v, bias, causal=True, q_offset=out_from)
        return self.out(h[:, out_from:], att)

    def step(self, h, slot, rope, cache_k, cache_v, bias):
        """One new token (h [N, 1, W]) at cache slot ``slot``; ``rope``: ``rope_tables`` of its position."""
        q, k, v = self.qkv(h, rope)
        cache_k = jax.lax.dynamic_update_slice_in_dim(cache_k, k.astype(cache_k.dtype), slot, axis=2)
        cache_v = jax.lax.dynamic_update_slice_in_dim(cache_v, v.astype(cache_v.dtype), slot, axis=2)
        return self.out(h, gqa_attention(q, cache_k, cache_v, bias, causal=False)), cache_k, cache_v

    def extend(self, h, rope, cache_k, cache_v, write, bias, start: int, out_from: int):
        """C new tokens (h [N, C, W]) at cache slots start .. start + C - 1 (static), their keys and
        values written where ``write`` [N, C] is set (elsewhere the slot keeps what it held); each
        query sees the visible slots (``bias``) up to its own. Returns the output from chunk position
        ``out_from`` on (static) and the updated caches."""
        q, k, v = self.qkv(h, rope)
        C = h.shape[1]
        w = write[:, None, :, None]
        at = (slice(None), slice(None), slice(start, start + C))
        cache_k = cache_k.at[at].set(jnp.where(w, k.astype(cache_k.dtype), cache_k[at]))
        cache_v = cache_v.at[at].set(jnp.where(w, v.astype(cache_v.dtype), cache_v[at]))
        att = gqa_attention(q[:, out_from:], cache_k, cache_v, bias, causal=True, q_offset=start + out_from)
        return self.out(h[:, out_from:], att), cache_k, cache_v


class LlamaCache(NamedTuple):
    """Per-layer keys and values, head-major [N, kv_heads, S, head_dim], the visible slots (real tokens
    written so far) [N, S] and each row's next RoPE position (its real tokens so far) [N];
    ``hidden`` [N, S, hidden]: the input of block ``LlamaLM.capture_layer`` at every slot written
    (None unless the model captures it)."""

    k: tuple
    v: tuple
    valid: Bool[Array, "N S"]
    position: Int[Array, "N"]
    hidden: Optional[Float[Array, "N S W"]] = None


class LlamaLM(nnx.Module):
    """``LlamaLM(cfg, rngs=nnx.Rngs(0))(tokens, mask) -> logits`` float32 [N, L, vocab]
    (models.interface), with ``prefill`` / ``decode_step`` over a ``LlamaCache`` and ``score``.
    Random parameters here; a checkpoint's come from ``models.load_pretrained``."""

    # The block whose input the decode path records in its cache (``LlamaCache.hidden``) and
    # ``score_hidden`` starts from: set it when the blocks below it are frozen (training the top
    # N blocks), so the update reuses what the rollout computed instead of running them again.
    capture_layer: Optional[int] = None

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        emb = nnx.with_partitioning(nnx.initializers.normal(0.02), ("model", "fsdp"), eager_sharding=False)
        self.embed = nnx.Embed(cfg.vocab, cfg.hidden, embedding_init=emb, dtype=cfg.jnp_dtype,
                               param_dtype=cfg.jnp_dtype, rngs=rngs)
        self.layers = nnx.List([LlamaBlock(cfg, rngs) for _ in range(cfg.layers)])
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps, cfg.jnp_dtype)
        self.lm_head = None if cfg.tie_embeddings else _linear(cfg.hidden, cfg.vocab, ("fsdp", "model"), cfg, rngs)

    def _check(self, length: int) -> None:
        if length > self.cfg.context:
            raise ValueError(f"sequence length {length} exceeds the model's context of {self.cfg.context} tokens "
                             "(LlamaConfig.context); shorten the prompt or the reply.")

    def _head(self, h):
        h = self.norm(h).astype(jnp.float32)
        if self.lm_head is None:
            return h @ self.embed.embedding[...].astype(jnp.float32).T
        return self.lm_head(h.astype(self.cfg.jnp_dtype)).astype(jnp.float32)

    def _forward(self, tokens, mask, start: int = 0, *, hidden=None, first: int = 0):
        """Logits from position ``start`` and the input of block ``capture_layer`` (None when unset). ``hidden``: the input of block ``first`` (instead of
        embedding ``tokens`` and running the blocks below it)."""
        mask = mask.astype(bool)
        N, L = mask.shape
        self._check(L)
        positions = jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)
        rope = rope_tables(positions, rope_frequencies(self.cfg))
        bias = key_bias(mask)
        h = self.embed(tokens) if hidden is None else hidden.astype(self.cfg.jnp_dtype)
        captured = None
        for i, blk in enumerate(self.layers):
            if i < first:
                continue
            if i == self.capture_layer:
                captured = h
            h = blk(h, rope, bias, start if i == len(self.layers) - 1 else 0)
        return self._head(h), captured

    def __call__(self, tokens: Int[Array, "N L"], mask: Bool[Array, "N L"]) -> Float[Array, "N L V"]:
        return self._forward(tokens, mask)[0]

    def hidden_states(self, tokens: Int[Array, "N L"], mask: Bool[Array, "N L"]) -> Float[Array, "N L W"]:
        """The input of block ``capture_layer`` at every position (the full forward's)."""
        if self.capture_layer is None:
            raise ValueError("LlamaLM.hidden_states: set capture_layer (the first block to run again) first.")
        return self._forward(tokens, mask)[1]

    def score_hidden(self, hidden: Float[Array, "N L W"], mask: Bool[Array, "N L"], start: int
                     ) -> Float[Array, "N L-start V"]:
        """``self.score(tokens, mask, start)`` from the input of block ``capture_layer`` (``hidden``,
        e.g. what the decode path recorded): only the blocks from there run."""
        if self.capture_layer is None:
            raise ValueError("LlamaLM.score_hidden: set capture_layer (the first block to run again) first.")
        return self._forward(None, mask, start, hidden=hidden, first=self.capture_layer)[0]

    def score(self, tokens: Int[Array, "N L"], mask: Bool[Array, "N L"], start: int) -> Float[Array, "N L-start V"]:
        """``self(tokens, mask)[:, start:]`` (``start`` static): the last layer's queries, MLP
        and the output head only from ``start``."""
        return self._forward(tokens, mask, start)[0]

    def empty_cache(self, rows: int, length: int) -> LlamaCache:
        """A cache of ``length`` slots with nothing visible (what ``prefill`` extends)."""
        self._check(length)
        kv = jnp.zeros((rows, self.cfg.kv_heads, length, self.cfg.head_dim), self.cfg.jnp_dtype)
        hidden = None
        if self.capture_layer is not None:
            hidden = jnp.zeros((rows, length, self.cfg.hidden), self.cfg.jnp_dtype)
        return LlamaCache(k=(kv,) * len(self.layers), v=(kv,) * len(self.layers), valid=jnp.zeros((rows, length), bool),
                          position=jnp.zeros((rows,), jnp.int32), hidden=hidden)

    def prefill(self, tokens: Int[Array, "N P"], mask: Bool[Array, "N P"], length: int
                ) -> tuple[Float[Array, "N V"], LlamaCache]:
        """Run the prompt once: the next token's logits [N, V] and a cache of ``length`` slots
        (``extend`` of an empty cache at slot 0).

        Every block's keys and values cover the whole prompt; the last block's queries and MLP and
        the output head run at the last position only, so no [N, P, vocab] logits are made. Equal
        to the full forward's last position up to float32 rounding (other matmul shapes)."""
        return self.extend(self.empty_cache(tokens.shape[0], length), tokens, mask, 0)

    def extend(self, cache: LlamaCache, tokens: Int[Array, "N C"], mask: Bool[Array, "N C"], start: int
               ) -> tuple[Float[Array, "N V"], LlamaCache]:
        """Append a chunk of C tokens to ``cache`` at slots start .. start + C - 1 (``start`` static)
        and return the logits after the chunk's last position [N, V] (chunked prefill).

        ``mask`` marks the chunk's real tokens; a row's real tokens are numbered on from its cache's
        ``position`` (RoPE position = real tokens before it), and each attends to the visible
        slots before it and the chunk's real tokens up to itself:

            softmax_j( q_i . k_j / sqrt(D) ),  j over visible slots <= slot(i)

        Where ``mask`` is unset the slot keeps what the cache held there, so a row whose earlier
        tokens reach into the chunk's window (its new tokens right-aligned in it) loses nothing.
        Equal to ``prefill`` of the whole sequence up to float32 rounding (tested); the chunk's
        last position must be real in every row that is read."""
        N, C = tokens.shape
        S = cache.valid.shape[1]
        self._check(S)
        if start + C > S:
            raise ValueError(f"LlamaLM.extend: a chunk of {C} tokens at slot {start} overruns the cache's {S} slots.")
        mask = mask.astype(bool)
        valid = cache.valid.at[:, start:start + C].set(cache.valid[:, start:start + C] | mask)
        positions = cache.position[:, None] + jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)
        rope = rope_tables(positions, rope_frequencies(self.cfg))
        bias = key_bias(valid)
        h = self.embed(tokens)
        ks, vs, hidden = [], [], cache.hidden
        last = len(self.layers) - 1
        for i, (blk, ck, cv) in enumerate(zip(self.layers, cache.k, cache.v)):
            if i == self.capture_layer and hidden is not None:
                hidden = hidden.at[:, start:start + C].set(
                    jnp.where(mask[..., None], h.astype(hidden.dtype), hidden[:, start:start + C]))
            h, ck, cv = blk.extend(h, rope, ck, cv, mask, bias, start, C - 1 if i == last else 0)
            ks.append(ck)
            vs.append(cv)
        new = LlamaCache(k=tuple(ks), v=tuple(vs), valid=valid,
                         position=cache.position + jnp.sum(mask.astype(jnp.int32), axis=-1), hidden=hidden)
        return self._head(h)[:, -1], new

    def decode_step(self, token: Int[Array, "N"], pos, valid: Bool[Array, "N"], cache: LlamaCache
                    ) -> tuple[Float[Array, "N V"], LlamaCache]:
        """Write ``token`` at slot ``pos`` (``valid`` marks the rows where it is a real token; a
        row's RoPE position is its count of real tokens) and return the next token's logits."""
        vis = jax.lax.dynamic_update_slice_in_dim(cache.valid, valid[:, None], pos, axis=1)
        S = vis.shape[1]
        bias = key_bias(vis & (jnp.arange(S) <= pos)[None])
        rope = rope_tables(cache.position[:, None], rope_frequencies(self.cfg))
        h = self.embed(token[:, None])
        ks, vs, hidden = [], [], cache.hidden
        for i, (blk, ck, cv) in enumerate(zip(self.layers, cache.k, cache.v)):
            if i == self.capture_layer and hidden is not None:
                hidden = jax.lax.dynamic_update_slice_in_dim(hidden, h.astype(hidden.dtype), pos, axis=1)
            h, ck, cv = blk.step(h, pos, rope, ck, cv, bias)
            ks.append(ck)
            vs.append(cv)
        new = LlamaCache(k=tuple(ks), v=tuple(vs), valid=vis, position=cache.position + valid.astype(jnp.int32),
                         hidden=hidden)
        return self._head(h)[:, 0], new
