"""Text generation with a pretrained model's KV cache: ``generate`` (token ids) and ``reply`` (chat).

All prompts of a call decode together: they are left-padded to a common length (a multiple of
``bucket``, so prompts of similar length share one compiled program), ``prefill`` runs them
once, and one ``lax.scan`` of ``decode_step`` samples ``max_tokens`` tokens; a row stops at its
first end-of-turn token (later tokens are not visible to it and are cut from its reply).
Temperature 0 is greedy decoding (argmax), else sampling from softmax(logits / temperature)
with a key from ``seed``.
"""

from __future__ import annotations

from functools import partial
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

def left_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token rows right-aligned in ``width`` columns, ``pad_id`` before them: int32 ids and the
    bool mask of the real tokens, each [len(rows), width] (positions count real tokens, so a
    left-padded prompt gives the logits of the prompt alone)."""
    ids = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = np.asarray(r, np.int32)
        mask[i, width - len(r):] = True
    return ids, mask


@partial(jax.jit, static_argnames=("graphdef", "max_tokens", "greedy"))
def _decode(graphdef, state, prompts, mask, stop, key, temperature, *, max_tokens: int, greedy: bool):
    model = nnx.merge(graphdef, state)
    N, P = prompts.shape
    logits, cache = model.prefill(prompts, mask, P + max_tokens)

    def pick(logits, k):
        if greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(k, logits / temperature, axis=-1).astype(jnp.int32)

    def step(carry, t):
        logits, cache, done, k = carry
        k, sub = jax.random.split(k)
        tok = pick(logits, sub)
        valid = ~done
        logits, cache = model.decode_step(tok, P + t, valid, cache)
        done = done | jnp.isin(tok, stop)
        return (logits, cache, done, k), (tok, valid)

    init = (logits, cache, jnp.zeros((N,), bool), key)
    _, (toks, valid) = jax.lax.scan(step, init, jnp.arange(max_tokens))
    return toks.T, valid.T


def generate(model, prompts: Sequence[Sequence[int]], *, max_tokens: int = 64, temperature: float = 0.0, seed: int = 0,
             stop_ids: Sequence[int] = (), pad_id: int = 0, bucket: int = 32,
             context: Optional[int] = None) -> list[list[int]]:
    """New token ids for each prompt (a list of token ids), each ending at (and including) its
    first token in ``stop_ids``, at most ``max_tokens`` long.

    A tiny random Llama-family model, two prompts of different lengths, greedy decoding; the same
    prompt alone gives the same tokens (the left padding changes nothing):

    >>> from flax import nnx
    >>> from bepo_jax.agent.models.llama import LlamaConfig, LlamaLM
    >>> model = LlamaLM(LlamaConfig(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
    ...                             intermediate=64, context=128), rngs=nnx.Rngs(0))
    >>> out = generate(model, [[5, 9, 12], [7]], max_tokens=6)
    >>> [len(o) for o in out]
    [6, 6]
    >>> generate(model, [[5, 9, 12]], max_tokens=6) == out[:1]
    True
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate: give at least one prompt, each with at least one token.")
    if max_tokens < 1:
        raise ValueError(f"generate: max_tokens={max_tokens} must be >= 1.")
    if temperature < 0:
        raise ValueError(f"generate: temperature={temperature} must be >= 0 (0 = greedy).")
    vocab = getattr(getattr(model, "cfg", None), "vocab", None)
    if vocab is not None and any(not 0 <= t < vocab for p in prompts for t in p):
        bad = next(t for p in prompts for t in p if not 0 <= t < vocab)
        raise ValueError(f"generate: prompt token id {bad} is outside the model's {vocab}-token vocabulary (an "
                         "embedding row it does not have would read NaN); encode with the model's own tokenizer.")
    longest = max(len(p) for p in prompts)
    P = -(-longest // bucket) * bucket
    context = context or getattr(getattr(model, "cfg", None), "context", None)
    if context is not None:
        if longest + max_tokens > context:
            raise ValueError(f"generate: a prompt of {longest} tokens plus max_tokens={max_tokens} exceeds the model's "
                             f"context of {context} tokens; shorten the prompt or lower max_tokens.")
        P = min(P, context - max_tokens)
    tokens, mask = left_pad(prompts, P, pad_id)
    graphdef, state = nnx.split(model)
    stop = jnp.asarray(list(stop_ids) or [-1], jnp.int32)
    toks, valid = _decode(graphdef, state, jnp.asarray(tokens), jnp.asarray(mask), stop, jax.random.key(seed),
                          jnp.float32(max(temperature, 1e-6)), max_tokens=int(max_tokens), greedy=temperature == 0)
    toks, valid = np.asarray(toks), np.asarray(valid)
    return [[int(t) for t, v in zip(row, ok) if v] for row, ok in zip(toks, valid)]


def reply(pretrained, messages, *, max_tokens: int = 64, temperature: float = 0.0, seed: int = 0) -> str:
    """The model's reply to a chat (``messages``: [{"role": ..., "content": ...}]) as text: the
    checkpoint's chat template with the generation prompt, decoding until its end-of-turn token."""
    tok = pretrained.tokenizer
    ids = pretrained.prompt_ids(messages)
    new = generate(pretrained.model, [ids], max_tokens=max_tokens, temperature=temperature, seed=seed,
                   stop_ids=tok.end_of_turn_ids, pad_id=tok.pad_id)[0]
    return tok.decode([t for t in new if t not in tok.end_of_turn_ids], skip_special_tokens=True)
