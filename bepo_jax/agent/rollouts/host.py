"""Rollouts in Python environments (``HostEnv``: TextWorld, or any JAX env stepped
from the host): a host loop over time steps that batches the policy calls.

Per time step: every live episode's prompt is built (the same ``build_prompt`` as the
jitted path: task, last h observation/action pairs, current observation), then *one*
jitted call samples all B x K responses (constrained to each episode's admissible
commands when ``constrained``) and parses them; the host steps each environment with
its command (an invalid response is a no-op with ``invalid_penalty``). Observations are
text: encoded with the character tokenizer, padded to ``obs_len`` tokens; obs keys hash
the raw observation text (``hash_observations``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..envs.base import JaxEnv, env_reset, env_step, history_words, parse_response, render_tokens_text, word_table
from ..envs.text import EOS, PAD, encode, normalize
from ...credit.hashing import action_keys, hash_observations
from .jitted import (Rollout, RolloutConfig, _check_response_fits, build_prompt, check_context, finish_rollout,
                      prompt_length, sample_responses)


def _pad(ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    ids = ids[:n]
    out = np.full((n,), PAD, np.int32)
    out[: len(ids)] = ids
    return out, np.arange(n) < len(ids)


def make_host_rollout(model: nnx.Module, make_env: Callable[[], Any], config: RolloutConfig = RolloutConfig(), *,
                      max_steps: int, obs_len: int, word_width: int, max_commands: int, task_len: int = 0):
    """``rollout(params, tasks, key) -> Rollout`` for a list of B tasks (one group each).

    ``make_env()`` builds one ``HostEnv``; B x K of them are made on the first call and
    reused. Shapes: observations ``obs_len`` tokens, commands ``word_width`` tokens (at most
    ``max_commands`` per state), the task ``task_len`` tokens, ``max_steps`` steps. After a call,
    ``rollout.state_texts`` [B, K, T] holds the text each state key was hashed from ("" past an
    episode's end: ProxMO's TF-IDF reads it).
    """
    _check_response_fits(config, word_width)
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    K, h, T, S, R = config.group_size, config.prompt_history, max_steps, obs_len, config.max_response
    P = prompt_length(S, h, word_width, task_len)
    check_context(model, P, R, "make_host_rollout")
    envs: list = []

    @jax.jit
    def policy(params, task, task_m, h_obs, h_obs_m, h_word, h_valid, obs, obs_m, table, table_valid, key):
        model = nnx.merge(graphdef, params, rest)
        prompts, pmasks = jax.vmap(build_prompt)(task, task_m, h_obs, h_obs_m, h_word, h_valid, obs, obs_m)
        seq, msk, resp, logp = sample_responses(
            model, prompts, pmasks, key, max_response=R, temperature=config.temperature,
            table=table if config.constrained else None, table_valid=table_valid if config.constrained else None,
            decode=config.decode)
        action = jax.vmap(parse_response)(seq[:, P:], table, table_valid)
        return seq, msk, resp, logp, action

    def rollout(params, tasks: Sequence[Any], key) -> Rollout:
        B = len(tasks)
        N = B * K
        while len(envs) < N:
            envs.append(make_env())
        obs_text, cmds = zip(*[envs[i].reset(tasks[i // K]) for i in range(N)])
        obs_text, cmds = list(obs_text), [list(c) for c in cmds]
        task = np.zeros((N, task_len), np.int32)
        task_m = np.zeros((N, task_len), bool)
        if task_len:  # the objective in the character tokenizer's alphabet
            for i in range(N):
                task[i], task_m[i] = _pad(encode(normalize(getattr(envs[i], "objective", ""))), task_len)
        hh = max(h, 1)
        h_obs = np.zeros((N, hh, S), np.int32)
        h_obs_m = np.zeros((N, hh, S), bool)
        h_word = np.full((N, hh, word_width), PAD, np.int32)
        h_valid = np.zeros((N, hh), bool)
        done = np.zeros(N, bool)
        ended = np.zeros(N, bool)
        success = np.zeros(N, bool)
        steps = np.zeros(N, np.int32)
        raw = np.empty((N, T), object)
        raw[:] = ""
        reward = np.zeros((N, T), np.float32)
        penalty = np.zeros((N, T), np.float32)
        valid = np.zeros((N, T), bool)
        action_out = np.full((N, T), -1, np.int32)
        action_text = np.full((N, T), "", object)  # the chosen command ("" = no valid action, and padding)
        seqs, msks, resps, logps = [], [], [], []
        for t in range(T):
            obs = np.zeros((N, S), np.int32)
            obs_m = np.zeros((N, S), bool)
            table = np.full((N, max_commands, word_width + 1), EOS, np.int32)
            table_valid = np.zeros((N, max_commands), bool)
            for i in range(N):
                obs[i], obs_m[i] = _pad(encode(obs_text[i]), S)
                c = cmds[i][:max_commands]
                if c:
                    table[i, : len(c)] = word_table(c, word_width)
                    table_valid[i, : len(c)] = True
            key, sub = jax.random.split(key)
            seq, msk, resp, logp, action = jax.device_get(policy(
                params, task, task_m, h_obs[:, :h], h_obs_m[:, :h], h_word[:, :h], h_valid[:, :h], obs, obs_m,
                table, table_valid, sub))
            live = ~done
            for i in np.flatnonzero(live):
                raw[i, t] = obs_text[i]
                a = int(action[i])
                if a >= 0:
                    action_text[i, t] = cmds[i][a]
                    obs_text[i], r, d, won, cmds[i] = envs[i].step(cmds[i][a])
                    reward[i, t] = r
                    success[i] |= won
                    ended[i] = d or won  # the environment ended it: SUCCESS or FAILURE, never TRUNCATED
                    done[i] = ended[i]
                else:
                    penalty[i, t] = config.invalid_penalty
                steps[i] += 1
                done[i] |= steps[i] >= T
            valid[:, t] = live
            action_out[:, t] = np.where(live, action, -1)
            seqs.append(seq), msks.append(msk & live[:, None]), resps.append(resp & live[:, None])
            logps.append(np.where(live[:, None], logp, 0.0))
            if h:
                chosen = history_words(table[np.arange(N), np.maximum(action, 0)])
                word = np.where((action >= 0)[:, None], chosen, PAD)
                h_obs = np.concatenate([h_obs[:, 1:], obs[:, None]], axis=1)
                h_obs_m = np.concatenate([h_obs_m[:, 1:], obs_m[:, None]], axis=1)
                h_word = np.concatenate([h_word[:, 1:], word[:, None]], axis=1)
                h_valid = np.concatenate([h_valid[:, 1:], np.ones((N, 1), bool)], axis=1)
            if done.all():
                for rest_t in range(t + 1, T):  # pad the remaining steps
                    seqs.append(np.zeros_like(seq)), msks.append(np.zeros_like(msk))
                    resps.append(np.zeros_like(resp)), logps.append(np.zeros_like(logp))
                break
        keys = hash_observations(raw.reshape(-1).tolist()).reshape(N, T, 2)
        rollout.state_texts = raw.reshape(B, K, T)
        stack = lambda xs: np.stack(xs, axis=1)
        shape = lambda x: jnp.asarray(x.reshape((B, K) + x.shape[1:]))
        return finish_rollout(shape(keys), shape(reward), shape(penalty), shape(valid), shape(stack(seqs)),
                              shape(stack(msks)), shape(stack(resps)), shape(stack(logps)), shape(action_out),
                              shape(success), shape(ended), action_key=shape(action_keys(action_text)))

    return rollout


# Jitted once per environment object (it is a static argument), shared by all its episodes.
_reset = jax.jit(env_reset, static_argnums=0)
_step = jax.jit(env_step, static_argnums=0)
_render = jax.jit(lambda env, inner: env.render(inner), static_argnums=0)


class JaxEnvOnHost:
    """A ``JaxEnv`` stepped one episode at a time from Python: the host-driven baseline of
    the jitted loop (each step a separate jitted call per environment)."""

    def __init__(self, env: JaxEnv):
        self.env = env
        self.objective = getattr(env, "objective", "")  # the task text a chat prompt starts with
        self._words = list(env.action_words)

    def reset(self, task) -> tuple[str, list[str]]:
        self._state = _reset(self.env, task)
        return render_tokens_text(_render(self.env, self._state.inner)), self._words

    def step(self, command: str) -> tuple[str, float, bool, bool, list[str]]:
        self._state, reward, _ = _step(self.env, self._state, self._words.index(command))
        s = self._state
        # done = the environment's own end (success or terminal); the host loop applies the time limit.
        return render_tokens_text(_render(self.env, s.inner)), float(reward), bool(s.terminal), bool(s.success), self._words
