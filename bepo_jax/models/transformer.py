"""A small decoder-only transformer in Flax NNX (pre-LayerNorm, learned positions).

    h_0 = E[tokens] + P[positions];  h_{l+1} = h_l + MLP(LN(h_l + Attn(LN(h_l))));  logits = LN(h) W_out

Causal self-attention masked by the padding mask. Kernels carry partition annotations:
embedding and MLP/attention inputs shard their first axis over ``"fsdp"``, so the
parameters and optimizer state split across an FSDP mesh axis.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from .._config import check_int


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """vocab: token ids in [0, vocab). layers, width (model dim), heads (width % heads == 0),
    context: the longest sequence. mlp_ratio: hidden = mlp_ratio * width. The default is
    tiny enough to train on a 2-core CPU."""

    vocab: int = 64
    layers: int = 2
    width: int = 64
    heads: int = 4
    context: int = 64
    mlp_ratio: int = 4

    def __post_init__(self):
        for f in ("vocab", "layers", "width", "heads", "context", "mlp_ratio"):
            check_int("TransformerConfig", f, getattr(self, f), lo=1)
        if self.width % self.heads:
            raise ValueError(f"TransformerConfig.width={self.width} must be a multiple of heads={self.heads}.")


def _dense(din, dout, rngs, spec=("fsdp", None)):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), spec, eager_sharding=False)
    return nnx.Linear(din, dout, kernel_init=init, use_bias=False, rngs=rngs)


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

    def __call__(self, h, attn_mask):
        N, L, W = h.shape
        q, k, v = jnp.split(self.qkv(self.ln1(h)), 3, axis=-1)
        shape = (N, L, self.heads, W // self.heads)
        q, k, v = (x.reshape(shape) for x in (q, k, v))
        scores = jnp.einsum("nqhd,nkhd->nhqk", q, k) / jnp.sqrt(W // self.heads).astype(h.dtype)
        scores = jnp.where(attn_mask[:, None], scores, jnp.finfo(scores.dtype).min)
        att = jax.nn.softmax(scores, axis=-1)
        h = h + self.proj(jnp.einsum("nhqk,nkhd->nqhd", att, v).reshape(N, L, W))
        return h + self.down(nnx.gelu(self.up(self.ln2(h))))


class DecoderLM(nnx.Module):
    """``DecoderLM(cfg, rngs=nnx.Rngs(0))(tokens, mask) -> logits`` (see models.interface)."""

    def __init__(self, cfg: TransformerConfig = TransformerConfig(), *, rngs: nnx.Rngs):
        self.cfg = cfg
        emb_init = nnx.with_partitioning(nnx.initializers.normal(0.02), ("fsdp", None), eager_sharding=False)
        self.embed = nnx.Embed(cfg.vocab, cfg.width, embedding_init=emb_init, rngs=rngs)
        self.pos = nnx.Embed(cfg.context, cfg.width, embedding_init=emb_init, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
        self.ln_f = nnx.LayerNorm(cfg.width, rngs=rngs)
        self.head = _dense(cfg.width, cfg.vocab, rngs)

    def __call__(self, tokens: Int[Array, "N L"], mask: Bool[Array, "N L"]) -> Float[Array, "N L V"]:
        N, L = tokens.shape
        if L > self.cfg.context:
            raise ValueError(f"sequence length {L} exceeds TransformerConfig.context={self.cfg.context}.")
        h = self.embed(tokens) + self.pos(jnp.arange(L))[None]
        causal = jnp.tril(jnp.ones((L, L), bool))
        attn_mask = causal[None] & mask[:, None, :] & mask[:, :, None] | jnp.eye(L, dtype=bool)[None]
        for blk in self.blocks:
            h = blk(h, attn_mask)
        return self.head(self.ln_f(h))
