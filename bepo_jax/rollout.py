"""Multi-turn rollouts of a token policy in a pure-JAX environment (Sokoban), K
trajectories per task from one start state, as one jittable function.

At step t the prompt holds the current observation and the last ``history`` (h = 2)
observation/action pairs as text; the policy samples a short response (at most
``max_response`` tokens, ``temperature``); a response that does not spell an action
word followed by EOS is an *invalid action*: the environment does not move (no-op)
and the step's ``penalty`` field gets ``invalid_penalty``. The output is a StepBatch
(obs keys hash the raw grid with ``hash_tokens``), the sequences the update needs
(tokens, masks, response mask, old log-probs under the sampling policy at temperature 1)
and the success flags.

Prompt layout (fixed length P = 2 + h (S + A + 1) + S, S = H (W + 1) grid tokens,
A = 5 action tokens): BOS, then per history slot: grid, action word, SEP (PAD and
masked where the slot is before t = 0), then the current grid, SEP. Response: R
tokens after the prompt.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from ._config import check_int, check_range
from .envs import sokoban as sk
from .envs.text import BOS, EOS, PAD, SEP, encode
from .hashing import hash_tokens
from .models.interface import token_logprobs
from .types import FAILURE, SUCCESS, TRUNCATED, StepBatch

ACTION_WORDS = sk.ACTIONS
WORD_LEN = max(len(w) for w in ACTION_WORDS)
_CELL_TOKENS = np.array([encode(sk.SYMBOLS[c])[0] for c in range(7)], np.int32)
_NEWLINE = int(encode("\n")[0])
_WORDS = np.full((len(ACTION_WORDS), WORD_LEN), PAD, np.int32)
for _i, _w in enumerate(ACTION_WORDS):
    _WORDS[_i, : len(_w)] = encode(_w)
_WORD_LENS = np.array([len(w) for w in ACTION_WORDS], np.int32)
# Each action word followed by EOS (and EOS beyond), for constrained decoding.
_WORDS_EOS = np.full((len(ACTION_WORDS), WORD_LEN + 1), EOS, np.int32)
_WORDS_EOS[:, :WORD_LEN] = np.where(_WORDS == PAD, EOS, _WORDS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """group_size K (8), history h (2), temperature (1.0), max_response tokens (6, must
    fit the longest action word + EOS), invalid_penalty (-0.1, <= 0), constrained (False):
    sample only token sequences that spell an action word then EOS (the logits of every
    other token are masked), so a policy trained from scratch acts validly from the
    start; the recorded log-probs stay those of the unconstrained policy, which is what
    the update evaluates."""

    group_size: int = 8
    history: int = 2
    temperature: float = 1.0
    max_response: int = 6
    invalid_penalty: float = -0.1
    constrained: bool = False

    def __post_init__(self):
        n = "RolloutConfig"
        check_int(n, "group_size", self.group_size, lo=1)
        check_int(n, "history", self.history, lo=0)
        check_range(n, "temperature", self.temperature, lo=0.0, lo_open=True)
        check_int(n, "max_response", self.max_response, lo=WORD_LEN + 1)
        check_range(n, "invalid_penalty", self.invalid_penalty, hi=0.0)


def prompt_length(size: int, history: int) -> int:
    grid = size * (size + 1)
    return 2 + history * (grid + WORD_LEN + 1) + grid


class Rollout(NamedTuple):
    batch: StepBatch                          # [B, K, T]
    tokens: Int[Array, "B K T L"]             # prompt + response
    mask: Bool[Array, "B K T L"]              # real tokens
    response_mask: Bool[Array, "B K T L"]     # the sampled response tokens (through EOS)
    old_logp: Float[Array, "B K T L"]         # log pi(token) at sampling time, temperature 1
    actions: Int[Array, "B K T"]              # parsed action, -1 = invalid
    success: Bool[Array, "B K"]


def grid_tokens(grid: Int[Array, "H W"]) -> Int[Array, "S"]:
    """The grid's text as token ids: rows of symbols, each followed by a newline."""
    cells = jnp.asarray(_CELL_TOKENS)[grid.astype(jnp.int32)]
    nl = jnp.full((grid.shape[0], 1), _NEWLINE, jnp.int32)
    return jnp.concatenate([cells, nl], axis=1).reshape(-1)


def parse_action(response: Int[Array, "R"]) -> Int[Array, ""]:
    """The action whose word the response spells (then EOS), or -1."""
    R = response.shape[0]
    words = jnp.asarray(_WORDS)
    lens = jnp.asarray(_WORD_LENS)
    pos = jnp.arange(WORD_LEN)
    head = response[:WORD_LEN]
    same = jnp.all(jnp.where(pos[None, :] < lens[:, None], head[None, :] == words, True), axis=1)
    eos_at = response[jnp.clip(lens, 0, R - 1)] == EOS
    ok = same & eos_at
    return jnp.where(jnp.any(ok), jnp.argmax(ok), -1).astype(jnp.int32)


def make_rollout(model: nnx.Module, env: sk.SokobanConfig = sk.SokobanConfig(), config: RolloutConfig = RolloutConfig()):
    """``rollout(params, levels, key) -> Rollout`` for B levels (one group each), jittable.

    ``model`` gives the graph; ``params`` (an ``nnx.State`` of its parameters) are passed
    per call so one compiled rollout serves every training iteration.
    """
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    H = W = env.size
    S = H * (W + 1)
    h = config.history
    P = prompt_length(env.size, h)
    R = config.max_response
    L = P + R
    T = env.max_steps
    K = config.group_size

    def build_prompt(hist_grids, hist_actions, hist_valid, grid):
        parts, masks = [jnp.array([BOS], jnp.int32)], [jnp.ones((1,), bool)]
        for j in range(h):
            word = jnp.where(hist_actions[j] >= 0, jnp.asarray(_WORDS)[jnp.clip(hist_actions[j], 0, 3)],
                             jnp.full((WORD_LEN,), PAD, jnp.int32))
            slot = jnp.concatenate([grid_tokens(hist_grids[j]), word, jnp.array([SEP], jnp.int32)])
            parts.append(jnp.where(hist_valid[j], slot, PAD))
            masks.append(jnp.broadcast_to(hist_valid[j], slot.shape) & (slot != PAD))
        parts += [grid_tokens(grid), jnp.array([SEP], jnp.int32)]
        masks += [jnp.ones((S,), bool), jnp.ones((1,), bool)]
        return jnp.concatenate(parts), jnp.concatenate(masks)

    def sample(params, prompts, pmasks, key):
        """Autoregressive sampling of R tokens for [N] prompts (full forward per token)."""
        model = nnx.merge(graphdef, params, rest)
        N = prompts.shape[0]
        seq = jnp.concatenate([prompts, jnp.full((N, R), PAD, jnp.int32)], axis=1)
        msk = jnp.concatenate([pmasks, jnp.zeros((N, R), bool)], axis=1)
        alive = jnp.ones((N,), bool)
        words = jnp.asarray(_WORDS_EOS)
        word_alive = jnp.ones((N, words.shape[0]), bool)
        for r in range(R):
            key, sub = jax.random.split(key)
            logits = model(seq, msk | (jnp.arange(L) == P + r)[None])[:, P + r - 1]
            if config.constrained:
                cand = words[:, min(r, WORD_LEN)]  # [A] the next token of each word
                allowed = jnp.any(word_alive[:, :, None] & (cand[None, :, None] == jnp.arange(logits.shape[-1])),
                                  axis=1)
                logits = jnp.where(allowed, logits, -jnp.inf)
            tok = jax.random.categorical(sub, logits / config.temperature, axis=-1).astype(jnp.int32)
            tok = jnp.where(alive, tok, PAD)
            if config.constrained:
                word_alive = word_alive & (words[:, min(r, WORD_LEN)][None, :] == tok[:, None])
            seq = seq.at[:, P + r].set(tok)
            msk = msk.at[:, P + r].set(alive)
            alive = alive & (tok != EOS)
        logp, _ = token_logprobs(model(seq, msk), seq)
        resp = msk & (jnp.arange(L) >= P)[None]
        return seq, msk, resp, jnp.where(resp, logp, 0.0)

    def rollout(params, levels: sk.Level, key) -> Rollout:
        B = levels.walls.shape[0]
        rep = lambda x: jnp.repeat(x[:, None], K, axis=1).reshape((B * K,) + x.shape[1:])
        state = jax.vmap(sk.reset)(jax.tree_util.tree_map(rep, sk.Level(*levels)))
        hist_grids = jnp.zeros((B * K, max(h, 1), H, W), jnp.int8)
        hist_actions = jnp.full((B * K, max(h, 1)), -1, jnp.int32)
        hist_valid = jnp.zeros((B * K, max(h, 1)), bool)

        def one_step(carry, key_t):
            state, hist_grids, hist_actions, hist_valid = carry
            grid = jax.vmap(lambda s: s.grid)(state)
            prompts, pmasks = jax.vmap(build_prompt)(hist_grids, hist_actions, hist_valid, grid)
            seq, msk, resp, logp = sample(params, prompts, pmasks, key_t)
            action = jax.vmap(parse_action)(seq[:, P:])
            valid_step = ~state.done
            new_state, reward, _ = jax.vmap(lambda s, a: sk.step(s, a, env))(state, jnp.clip(action, 0, 3))
            # An invalid action is a no-op: keep the position, still spend the time step.
            invalid = action < 0
            kept = jax.tree_util.tree_map(lambda a, b: jnp.where(invalid.reshape((-1,) + (1,) * (a.ndim - 1)), a, b),
                                          state._replace(t=new_state.t, done=new_state.done), new_state)
            kept = kept._replace(done=state.done | (kept.t >= env.max_steps) | kept.success)
            reward = jnp.where(invalid, jnp.where(valid_step, env.step_penalty, 0.0), reward)
            penalty = jnp.where(invalid & valid_step, config.invalid_penalty, 0.0)
            key_obs = hash_tokens(grid.reshape(B * K, -1).astype(jnp.int32), jnp.ones((B * K, H * W), bool))
            if h:
                hist_grids = jnp.concatenate([hist_grids[:, 1:], grid[:, None]], axis=1)
                hist_actions = jnp.concatenate([hist_actions[:, 1:], action[:, None]], axis=1)
                hist_valid = jnp.concatenate([hist_valid[:, 1:], jnp.ones((B * K, 1), bool)], axis=1)
            out = (key_obs, reward, penalty, valid_step, seq, msk & valid_step[:, None], resp & valid_step[:, None],
                   jnp.where(valid_step[:, None], logp, 0.0), jnp.where(valid_step, action, -1))
            return (kept, hist_grids, hist_actions, hist_valid), out

        keys = jax.random.split(key, T)
        (final, *_), outs = jax.lax.scan(one_step, (state, hist_grids, hist_actions, hist_valid), keys)
        key_obs, reward, penalty, valid, seq, msk, resp, logp, action = (
            jnp.swapaxes(x, 0, 1).reshape((B, K, T) + x.shape[2:]) for x in outs)
        success = final.success.reshape(B, K)
        hit_limit = final.t.reshape(B, K) >= env.max_steps
        outcome = jnp.where(success, SUCCESS, jnp.where(hit_limit, TRUNCATED, FAILURE)).astype(jnp.int32)
        batch = StepBatch(obs_key=key_obs, reward=reward, mask=valid, outcome=outcome, penalty=penalty)
        return Rollout(batch, seq, msk, resp, logp, action, success)

    return rollout
