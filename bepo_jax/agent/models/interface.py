"""The policy interface: tokens and a mask in, next-token logits out.

    logits = model(tokens, mask)      tokens int32 [N, L], mask bool [N, L] -> float32 [N, L, V]

``logits[n, j]`` is the distribution of token ``j + 1`` given tokens ``0 .. j``
(causal); ``mask`` marks real tokens (padding may sit anywhere, the model must not
let it leak into real positions). Any Flax NNX module with this call satisfies it —
a Gemma or Llama port wraps its forward in two lines. Parameters that should shard
carry ``nnx.with_partitioning`` annotations over the mesh axes ``"fsdp"`` / ``"model"``.

The decode contract (optional; the rollouts use it when present, ``RolloutConfig.decode``):

    next_logits, cache = model.prefill(prompts, prompt_mask, length)
        prompts int32 [N, P], prompt_mask bool [N, P], length = P + response tokens
        -> float32 [N, V] (the distribution of token P given the prompt) and a cache
    next_logits, cache = model.decode_step(token, pos, valid, cache)
        token int32 [N] written at position pos (a traced int32 scalar, P <= pos < length);
        valid bool [N]: whether it is a real token for that row (False after EOS: it must
        then not be visible to later positions) -> float32 [N, V] for position pos + 1

``next_logits`` must equal ``model(tokens, mask)[:, pos]`` of the full forward at every
real position (float32 tolerance): the rollouts record log-probs from them, and the PPO
update recomputes them with the full forward (or the scoring shortcut below). The cache is any pytree of fixed shape (it
is carried through a ``lax.scan``). ``DecoderLM`` keeps per-layer keys and values.

The scoring shortcut (optional; the PPO update uses it when ``TrainConfig.score_from`` > 0):

    logits = model.score(tokens, mask, start)   start a static int -> float32 [N, L - start, V]

equal to ``model(tokens, mask)[:, start:]`` (float32 tolerance), computed without the
work that only positions before ``start`` need (``DecoderLM`` runs its last layer from there).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


@runtime_checkable
class PolicyModel(Protocol):
    def __call__(self, tokens: Int[Array, "N L"], mask: Bool[Array, "N L"]) -> Float[Array, "N L V"]: ...


@runtime_checkable
class DecodingModel(PolicyModel, Protocol):
    """A policy that also provides the decode contract (module docstring)."""

    def prefill(self, prompts: Int[Array, "N P"], prompt_mask: Bool[Array, "N P"], length: int
                ) -> tuple[Float[Array, "N V"], Any]: ...

    def decode_step(self, token: Int[Array, "N"], pos, valid: Bool[Array, "N"], cache: Any
                    ) -> tuple[Float[Array, "N V"], Any]: ...


def token_logprobs(logits: Float[Array, "N Lq V"], tokens: Int[Array, "N L"], start: int = 0
                   ) -> tuple[Float[Array, "N L"], Float[Array, "N L"]]:
    """log pi(token_j | tokens_<j) and the entropy of that distribution, aligned to token j.

    ``logits`` are the model's outputs at positions ``start`` .. L - 1 (``start`` static;
    0: the full forward), so tokens ``start + 1`` onward are scored; positions 0 ..
    ``start`` have no prediction here and get 0 for both.
    """
    if logits.shape[1] != tokens.shape[1] - start:
        raise ValueError(f"token_logprobs: logits cover {logits.shape[1]} positions, but tokens have "
                         f"{tokens.shape[1]} and start={start} (expected {tokens.shape[1] - start}).")
    logp_all = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    target = tokens[:, start + 1:]
    logp = jnp.take_along_axis(logp_all, target[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    pad = jnp.zeros((tokens.shape[0], start + 1), jnp.float32)
    return jnp.concatenate([pad, logp], axis=1), jnp.concatenate([pad, entropy], axis=1)


def score_logits(model, tokens: Int[Array, "N L"], mask: Bool[Array, "N L"], start: int = 0
                 ) -> Float[Array, "N L-start V"]:
    """The model's logits at positions ``start`` onward: through its ``score(tokens, mask,
    start)`` when it has one (the scoring shortcut, module docstring), else the full
    forward sliced."""
    if start and hasattr(model, "score"):
        return model.score(tokens, mask, start)
    return model(tokens, mask)[:, start:]
