"""The policy interface: tokens and a mask in, next-token logits out.

    logits = model(tokens, mask)      tokens int32 [N, L], mask bool [N, L] -> float32 [N, L, V]

``logits[n, j]`` is the distribution of token ``j + 1`` given tokens ``0 .. j``
(causal); ``mask`` marks real tokens (padding may sit anywhere, the model must not
let it leak into real positions). Any Flax NNX module with this call satisfies it —
a Gemma or Llama port wraps its forward in two lines. Parameters that should shard
carry ``nnx.with_partitioning`` annotations over the mesh axes ``"fsdp"`` / ``"model"``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


@runtime_checkable
class PolicyModel(Protocol):
    def __call__(self, tokens: Int[Array, "N L"], mask: Bool[Array, "N L"]) -> Float[Array, "N L V"]: ...


def token_logprobs(logits: Float[Array, "N L V"], tokens: Int[Array, "N L"]) -> tuple[Float[Array, "N L"], Float[Array, "N L"]]:
    """log pi(token_j | tokens_<j) and the entropy of that distribution, aligned to token j.

    Position 0 has no prediction and gets 0 for both.
    """
    logp_all = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    target = tokens[:, 1:]
    logp = jnp.take_along_axis(logp_all, target[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    pad = jnp.zeros((tokens.shape[0], 1), jnp.float32)
    return jnp.concatenate([pad, logp], axis=1), jnp.concatenate([pad, entropy], axis=1)
