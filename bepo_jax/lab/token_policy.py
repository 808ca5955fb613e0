"""The action-level policy of a token policy under constrained decoding.

The rollouts (``bepo_jax.agent.rollouts.jitted.sample_responses`` with a word table) sample a response
token by token, each from the model's softmax at ``temperature`` restricted to the tokens
that continue a word still alive. So the probability of action word w at state s is

    pi(w | s) = prod_r  exp(z_r[w_r] / T) / sum_{u in allowed_r(w_<r)} exp(z_r[u] / T)

with z_r the model's logits for response position r given the prompt of s and w_<r, and
allowed_r(w_<r) the r-th tokens of the words that share w's first r tokens (one token at
a determined position: factor 1). With ``prompt_history = 0`` the prompt is a function of
the state (BOS, the rendered observation, SEP), so this is a time-independent tabular
policy that ``evaluate`` and ``credit_quality`` take. Longer prompt histories make the
policy depend on the path, which a tabular model cannot hold: refused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..agent.envs.base import word_lengths, word_table
from ..agent.envs.text import BOS, PAD, SEP
from .model import TabularModel


def token_policy_probs(lm, env, model: TabularModel, *, temperature: float = 1.0, prompt_history: int = 0,
                       batch_size: int = 512) -> np.ndarray:
    """float64 [num_states, num_actions]: pi(word | state) of ``lm`` (a ``models``
    policy: ``lm(tokens, mask) -> logits``) under constrained decoding (module docstring)."""
    from ..agent.rollouts.jitted import check_context, prompt_length

    if prompt_history != 0:
        raise ValueError(f"token_policy_probs: prompt_history={prompt_history}; only 0 gives a policy of the state "
                         "alone (longer histories depend on the path). Train or evaluate with prompt_history=0.")
    if not temperature > 0:
        raise ValueError(f"token_policy_probs: temperature={temperature} must be > 0.")
    words = word_table(env.action_words, max(len(w) for w in env.action_words))  # [A, W1]
    A, W1 = words.shape
    lens = np.asarray(word_lengths(words))  # tokens before EOS
    obs = np.asarray(jax.vmap(env.render)(model.inner))  # [S, obs_len]
    S, O = obs.shape
    P = prompt_length(O, 0, W1 - 1)
    check_context(lm, P, W1, "token_policy_probs")
    prompts = np.concatenate([np.full((S, 1), BOS), obs, np.full((S, 1), SEP)], axis=1).astype(np.int32)
    pmask = np.concatenate([np.ones((S, 1), bool), obs != PAD, np.ones((S, 1), bool)], axis=1)
    seq = np.concatenate([np.repeat(prompts, A, 0), np.tile(words, (S, 1))], axis=1)  # [S A, P + W1]
    msk = np.concatenate([np.repeat(pmask, A, 0),
                          np.tile(np.arange(W1)[None] <= lens[:, None], (S, 1))], axis=1)
    logits = []
    for i in range(0, S * A, batch_size):
        logits.append(np.asarray(lm(jnp.asarray(seq[i:i + batch_size]), jnp.asarray(msk[i:i + batch_size]))
                                 [:, P - 1:P + W1 - 1], np.float64))
    z = np.concatenate(logits).reshape(S, A, W1, -1) / temperature  # z[s, a, r] predicts word a's token r
    V = z.shape[-1]
    logp = np.zeros((S, A))
    for a in range(A):
        for r in range(int(lens[a]) + 1):  # the word's tokens and its EOS
            same = np.all(words[:, :r] == words[a, :r], axis=1)
            allowed = np.zeros(V, bool)
            allowed[words[same, r]] = True
            zr = z[:, a, r]
            zmax = zr[:, allowed].max(-1, keepdims=True)
            lse = zmax[:, 0] + np.log(np.exp(zr[:, allowed] - zmax).sum(-1))
            logp[:, a] += zr[:, words[a, r]] - lse
    p = np.exp(logp)
    return p / p.sum(1, keepdims=True)
