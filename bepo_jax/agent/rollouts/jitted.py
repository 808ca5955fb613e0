"""Multi-turn rollouts of a token policy, K trajectories per task from one start state.

At step t the prompt holds the task (host environments), the last ``prompt_history`` (h = 2)
observation/action pairs and the current observation, as text tokens; the policy
samples a short response (at most ``max_response`` tokens, ``temperature``). A response
that does not spell an action word (or admissible command) followed by EOS is an
*invalid action*: the environment does not move (no-op) and the step's ``penalty``
field gets ``invalid_penalty``. Output: a StepBatch (obs keys = ``hash_tokens`` of the
raw observation), the sequences the update needs (tokens, masks, response mask, old
log-probs under the sampling policy at temperature 1) and the success flags.

Prompt layout (fixed length P = 2 + Q + h (S + A + 1) + S; S observation tokens, A
tokens of the longest action word, Q task tokens): BOS, the task, then per history
slot: observation, action word, SEP (PAD and masked where the slot is before t = 0
or the action was invalid), then the current observation, SEP. Response: R tokens.

``make_rollout`` is the pure-JAX path (one jittable function, PureJaxRL style); the
host loop for Python environments (``bepo_jax.agent.rollouts.host``) uses the same prompt
builder, sampler and parser.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from ...credit.configs import check_choice, check_int, check_range
from ..envs.base import JaxEnv, env_reset, env_step, history_words, observation_keys, parse_response, word_table
from ..envs.text import BOS, EOS, PAD, SEP
from ..models.interface import token_logprobs
from ...credit.hashing import action_id_keys
from ...credit.types import StepBatch, outcome_codes


DECODES = ("auto", "cached", "full")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """group_size K (8), prompt_history h (2: the observation/action pairs the prompt shows; not the
    estimators' ``history``, which merges states), temperature (1.0), max_response tokens (6; must
    fit the longest action word + EOS), invalid_penalty (-0.1, <= 0), constrained (False):
    sample only token sequences that spell an action word then EOS (the logits of every
    other token are masked), so a policy trained from scratch acts validly from the
    start; the recorded log-probs stay those of the unconstrained policy, which is what
    the update evaluates. decode ("auto"): how responses are sampled — "cached" (KV cache,
    log-probs at sampling time), "full" (a full forward per token), "auto" (cached when the
    model provides prefill/decode_step); see ``sample_responses``."""

    group_size: int = 8
    prompt_history: int = 2
    temperature: float = 1.0
    max_response: int = 6
    invalid_penalty: float = -0.1
    constrained: bool = False
    decode: str = "auto"

    def __post_init__(self):
        check_sampling_fields("RolloutConfig", self, "max_response")
        check_choice("RolloutConfig", "decode", self.decode, DECODES)


def check_sampling_fields(name: str, cfg, reply_field: str) -> None:
    """The checks every rollout config shares (``RolloutConfig``, ``ChatRolloutConfig``): group_size >= 1,
    prompt_history >= 0, temperature > 0, the reply's length ``reply_field`` >= 2 (a token and the end),
    invalid_penalty <= 0."""
    check_int(name, "group_size", cfg.group_size, lo=1)
    check_int(name, "prompt_history", cfg.prompt_history, lo=0)
    check_range(name, "temperature", cfg.temperature, lo=0.0, lo_open=True)
    check_int(name, reply_field, getattr(cfg, reply_field), lo=2)
    check_range(name, "invalid_penalty", cfg.invalid_penalty, hi=0.0)


def prompt_length(obs_len: int, prompt_history: int, word_len: int, task_len: int = 0) -> int:
    return 2 + task_len + prompt_history * (obs_len + word_len + 1) + obs_len


class Rollout(NamedTuple):
    batch: StepBatch                          # [B, K, T]
    tokens: Int[Array, "B K T L"]             # prompt + response
    mask: Bool[Array, "B K T L"]              # real tokens
    response_mask: Bool[Array, "B K T L"]     # the sampled response tokens (through EOS)
    old_logp: Float[Array, "B K T L"]         # log pi(token) at sampling time (1 / the chat sampling temperature)
    actions: Int[Array, "B K T"]              # parsed action, -1 = invalid
    success: Bool[Array, "B K"]
    hidden: Optional[Float[Array, "B K T L W"]] = None  # the frozen blocks' output (chat rollouts, top-N training)
    obs_tokens: Optional[Int[Array, "B K T S"]] = None  # the states' texts as bytes (chat rollouts: similarity merging)


def build_prompt(task: Int[Array, "Q"], task_mask: Bool[Array, "Q"], hist_obs: Int[Array, "h S"],
                 hist_obs_mask: Bool[Array, "h S"], hist_word: Int[Array, "h A"], hist_valid: Bool[Array, "h"],
                 obs: Int[Array, "S"], obs_mask: Bool[Array, "S"]) -> tuple[Int[Array, "P"], Bool[Array, "P"]]:
    """One prompt (layout in the module docstring); PAD tokens are never real."""
    one = lambda tok: (jnp.array([tok], jnp.int32), jnp.ones((1,), bool))
    parts = [one(BOS), (task, task_mask)]
    for j in range(hist_obs.shape[0]):
        slot = jnp.concatenate([hist_obs[j], hist_word[j], jnp.array([SEP], jnp.int32)])
        smask = jnp.concatenate([hist_obs_mask[j], hist_word[j] != PAD, jnp.ones((1,), bool)]) & hist_valid[j]
        parts.append((jnp.where(smask, slot, PAD), smask))
    parts += [(obs, obs_mask), one(SEP)]
    return jnp.concatenate([p for p, _ in parts]), jnp.concatenate([m for _, m in parts])


def forced_positions(words: np.ndarray) -> list[bool]:
    """For a fixed word table [A, W1]: whether the token at each response position is
    determined by the tokens before it (every word sharing a prefix continues alike)."""
    out = []
    for r in range(words.shape[1]):
        nxt: dict[tuple, set] = {}
        for w in words:
            nxt.setdefault(tuple(w[:r]), set()).add(int(w[r]))
        out.append(all(len(v) == 1 for v in nxt.values()))
    return out


def supports_decode(model) -> bool:
    """Whether ``model`` provides the decode contract (models.interface): prefill + decode_step."""
    return callable(getattr(model, "prefill", None)) and callable(getattr(model, "decode_step", None))


def _next_tokens(r, table, word_alive):
    """The next token of every word at response position ``r`` ([N, A]), and the token
    when only one word is left (``only``, [N])."""
    cand = jnp.take(table, jnp.minimum(r, table.shape[-1] - 1), axis=2)
    only = jnp.take_along_axis(cand, jnp.argmax(word_alive, axis=1)[:, None], axis=1)[:, 0]
    return cand, only


def _allowed_logits(logits, cand, word_alive):
    """The logits with every token masked that no still-possible word continues with."""
    allowed = jnp.any(word_alive[:, :, None] & (cand[:, :, None] == jnp.arange(logits.shape[-1])), axis=1)
    return jnp.where(allowed, logits, -jnp.inf)


def sample_responses(model: nnx.Module, prompts: Int[Array, "N P"], pmasks: Bool[Array, "N P"], key, *,
                     max_response: int, temperature: float, table: Optional[Int[Array, "N A W1"]] = None,
                     table_valid: Optional[Bool[Array, "N A"]] = None, forced: Optional[list[bool]] = None,
                     decode: str = "auto", stop_ids: tuple[int, ...] = (EOS,), pad_id: int = PAD,
                     logp_temperature: float = 1.0, return_hidden: bool = False,
                     expand: Optional[Int[Array, "N"]] = None):
    """Autoregressive sampling of ``max_response`` tokens for N prompts. With ``table``
    (each row's words + EOS) only those words can be sampled (constrained decoding);
    ``forced[r]`` (from ``forced_positions`` of a fixed table) marks positions whose token
    the earlier ones determine (taken without a draw). The recorded log-probs are those of
    the unconstrained policy at temperature 1. Returns (tokens, mask, response_mask,
    old_logp), each [N, L].

    ``decode``: "cached" — one ``prefill`` of the prompts, then one ``decode_step`` per
    token until every row has stopped (``decode_responses``), log-probs taken at sampling time; "full" — a full forward per
    sampled position (skipping determined ones) and one more at the end for the log-probs
    (the reference path, for models without the decode contract); "auto" — cached when
    the model provides it. Both draw the same keys: same tokens, log-probs equal to
    float32 tolerance.

    ``stop_ids``: the tokens that end a response (the character tokenizer's EOS; a pretrained
    model's end-of-turn ids; a word table ends its words with the first); ``pad_id`` fills the
    positions after it. ``logp_temperature``: the log-probs are recorded from softmax(logits /
    logp_temperature) (1: the policy itself; the sampling temperature when the update scores at it,
    ``TrainConfig.temperature``). ``return_hidden``: also return the input of the model's block
    ``capture_layer`` at every position [N, L, W] (``LlamaLM``; what the update starts from when
    the blocks below it are frozen; the last position, which predicts nothing, is 0 on the cached
    path). ``expand`` (cached decoding): ``prompts`` are U distinct prompts and row n of the N
    responses continues prompt ``expand[n]`` — the prompts are prefilled once each and the cache
    (every leaf batch-first) is gathered to the N rows."""
    if decode not in DECODES:
        raise ValueError(f"sample_responses: decode={decode!r}; use one of {DECODES}.")
    cached = supports_decode(model) if decode == "auto" else decode == "cached"
    if cached and not supports_decode(model):
        raise ValueError(f"decode='cached' needs a model with prefill() and decode_step() (models.interface); "
                         f"{type(model).__name__} has none: use decode='full' or 'auto'.")
    if expand is not None and not cached:
        prompts, pmasks, expand = prompts[expand], pmasks[expand], None
    fn = _sample_cached if cached else _sample_full
    extra = {"expand": expand} if cached else {}
    return fn(model, prompts, pmasks, key, max_response=max_response, temperature=temperature, table=table,
              table_valid=table_valid, forced=forced, stop=jnp.asarray(stop_ids, jnp.int32), pad=pad_id,
              logp_temperature=logp_temperature, return_hidden=return_hidden, **extra)


def _sample_cached(model, prompts, pmasks, key, *, max_response, temperature, table, table_valid, forced, stop, pad,
                   logp_temperature, return_hidden, expand=None):
    logits, cache = model.prefill(prompts, pmasks, prompts.shape[1] + max_response)
    if expand is not None:  # one prefill per distinct prompt, then each row's copy of its cache
        logits, cache = jax.tree_util.tree_map(lambda x: x[expand], (logits, cache))
        prompts, pmasks = prompts[expand], pmasks[expand]
    toks, alives, logps, cache = decode_responses(
        model, logits, cache, prompts.shape[1], key, max_response=max_response, temperature=temperature, table=table,
        table_valid=table_valid, forced=forced, stop=stop, pad=pad, logp_temperature=logp_temperature)
    N, P = prompts.shape
    seq = jnp.concatenate([prompts, toks], axis=1)
    msk = jnp.concatenate([pmasks, alives], axis=1)
    resp = jnp.concatenate([jnp.zeros_like(pmasks), alives], axis=1)
    logp = jnp.concatenate([jnp.zeros((N, P), jnp.float32), logps], axis=1)
    if return_hidden:
        return seq, msk, resp, jnp.where(resp, logp, 0.0), cache.hidden
    return seq, msk, resp, jnp.where(resp, logp, 0.0)


def decode_responses(model, logits: Float[Array, "N V"], cache, slot: int, key, *, max_response: int,
                     temperature: float, table=None, table_valid=None, forced=None, stop, pad: int,
                     logp_temperature: float = 1.0):
    """Sample up to ``max_response`` tokens per row from ``logits`` (the next token's, after a
    prefill or ``extend``) over ``cache``, writing token r at cache slot ``slot + r``. Returns the
    tokens [N, R] (``pad`` after a row's stop token), the response mask [N, R] (through the stop
    token), the log-probs under softmax(logits / logp_temperature) [N, R] and the final cache.

    Token r of every row is drawn with the r-th key of one sequential split of ``key``; the loop
    ends when every row has stopped (a ``while_loop``: a turn of 3-token replies costs 3 decode
    steps, not ``max_response``), which changes no token, mask or log-prob. The last token is
    never written to the cache (nothing reads it)."""
    R = max_response
    N = logits.shape[0]
    forced_r = None
    if forced is not None:
        forced_r = jnp.asarray([forced[min(r, len(forced) - 1)] for r in range(R)])
    word_alive = table_valid if table is not None else jnp.zeros((N, 1), bool)

    def pick(logits, r, alive, word_alive, key):
        key, sub = jax.random.split(key)
        logp_all = jax.nn.log_softmax(logits.astype(jnp.float32) / logp_temperature, axis=-1)
        if table is not None:
            cand, only = _next_tokens(r, table, word_alive)
            tok = jax.random.categorical(sub, _allowed_logits(logits, cand, word_alive) / temperature,
                                         axis=-1).astype(jnp.int32)
            if forced_r is not None:
                tok = jnp.where(forced_r[r], only, tok)
        else:
            tok = jax.random.categorical(sub, logits / temperature, axis=-1).astype(jnp.int32)
        tok = jnp.where(alive, tok, pad)
        if table is not None:
            word_alive = word_alive & (cand == tok[:, None])
        logp = jnp.where(alive, jnp.take_along_axis(logp_all, tok[:, None], axis=-1)[:, 0], 0.0)
        return tok, logp, word_alive, key

    def body(carry):  # token r drawn and written at slot + r (r < R - 1)
        r, logits, cache, alive, word_alive, key, toks, alives, logps = carry
        tok, logp, word_alive, key = pick(logits, r, alive, word_alive, key)
        toks, alives, logps = toks.at[:, r].set(tok), alives.at[:, r].set(alive), logps.at[:, r].set(logp)
        logits, cache = model.decode_step(tok, slot + r, alive, cache)
        return r + 1, logits, cache, alive & ~jnp.isin(tok, stop), word_alive, key, toks, alives, logps

    carry = (jnp.int32(0), logits, cache, jnp.ones((N,), bool), word_alive, key, jnp.full((N, R), pad, jnp.int32),
             jnp.zeros((N, R), bool), jnp.zeros((N, R), jnp.float32))
    r, logits, cache, alive, word_alive, key, toks, alives, logps = jax.lax.while_loop(
        lambda c: (c[0] < R - 1) & jnp.any(c[3]), body, carry)
    # the last token (r = R - 1) needs no decode step; where every row had stopped earlier it is padding
    tok, logp, _, _ = pick(logits, jnp.minimum(r, R - 1), alive & (r < R), word_alive, key)
    toks = jax.lax.dynamic_update_slice_in_dim(toks, tok[:, None], jnp.minimum(r, R - 1), axis=1)
    alives = jax.lax.dynamic_update_slice_in_dim(alives, (alive & (r < R))[:, None], jnp.minimum(r, R - 1), axis=1)
    logps = jax.lax.dynamic_update_slice_in_dim(logps, logp[:, None], jnp.minimum(r, R - 1), axis=1)
    return toks, alives, jnp.where(alives, logps, 0.0), cache


def _sample_full(model, prompts, pmasks, key, *, max_response, temperature, table, table_valid, forced, stop, pad,
                 logp_temperature, return_hidden):
    N, P = prompts.shape
    R = max_response
    L = P + R
    seq = jnp.concatenate([prompts, jnp.full((N, R), pad, jnp.int32)], axis=1)
    msk = jnp.concatenate([pmasks, jnp.zeros((N, R), bool)], axis=1)
    alive = jnp.ones((N,), bool)
    word_alive = table_valid
    for r in range(R):
        key, sub = jax.random.split(key)

        def sampled(seq, msk, sub, cand=None, word_alive=None):
            logits = model(seq, msk | (jnp.arange(L) == P + r)[None])[:, P + r - 1]
            if cand is not None:
                logits = _allowed_logits(logits, cand, word_alive)
            return jax.random.categorical(sub, logits / temperature, axis=-1).astype(jnp.int32)

        if table is None:
            tok = sampled(seq, msk, sub)
        else:
            cand, only = _next_tokens(r, table, word_alive)
            W1 = table.shape[-1]
            if forced is not None and forced[min(r, W1 - 1)]:
                tok = only  # statically determined: no forward pass
            elif forced is not None:
                tok = sampled(seq, msk, sub, cand, word_alive)
            else:  # per-row tables (host loop): skip the forward when every alive row is determined
                determined = jnp.all(jnp.where(word_alive, cand == only[:, None], True), axis=1) | ~alive
                tok = jax.lax.cond(jnp.all(determined), lambda *a: only, sampled, seq, msk, sub, cand, word_alive)
        tok = jnp.where(alive, tok, pad)
        if table is not None:
            word_alive = word_alive & (cand == tok[:, None])
        seq = seq.at[:, P + r].set(tok)
        msk = msk.at[:, P + r].set(alive)
        alive = alive & ~jnp.isin(tok, stop)
    logp, _ = token_logprobs(model(seq, msk) / logp_temperature, seq)
    resp = msk & (jnp.arange(L) >= P)[None]
    if return_hidden:
        return seq, msk, resp, jnp.where(resp, logp, 0.0), model.hidden_states(seq, msk)
    return seq, msk, resp, jnp.where(resp, logp, 0.0)


def _check_response_fits(config: RolloutConfig, word_width: int) -> None:
    if config.max_response < word_width + 1:
        raise ValueError(f"RolloutConfig.max_response={config.max_response} cannot hold the longest action word "
                         f"({word_width} tokens) plus EOS; set max_response >= {word_width + 1}.")


def check_context(model: nnx.Module, prompt: int, response: int, what: str) -> None:
    """Raise when the model's context cannot hold prompt + response tokens, naming the fix."""
    context = getattr(getattr(model, "cfg", None), "context", None)
    if context is not None and prompt + response > context:
        raise ValueError(
            f"{what}: a step's sequence has {prompt + response} tokens (prompt {prompt} + response {response}) but "
            f"the model's context is {context}; build the model with TransformerConfig(context={prompt + response}) "
            "or more (prompt_length(obs_len, prompt_history, word_len, task_len) + max_response), or shorten "
            "prompt_history / the observation.")


def check_render(env: JaxEnv, obs) -> None:
    """Raise when ``env.render`` does not return ``env.obs_len`` tokens (checked at trace time)."""
    if obs.shape[-1] != env.obs_len:
        raise ValueError(
            f"{type(env).__name__}.render returned {obs.shape[-1]} tokens but obs_len = {env.obs_len}; render must "
            "return exactly obs_len int32 tokens (pad with PAD, or set obs_len to the rendered length).")


class _Prompts:
    """The prompts of N parallel episodes of a JaxEnv, step by step (the layout of the module
    docstring), with the last ``prompt_history`` observation/action pairs: ``start`` gives the
    empty history, ``__call__`` the current observations and prompts, ``push`` the history
    after an action. Shared by the sampled rollouts and the replay of given actions."""

    def __init__(self, env: JaxEnv, prompt_history: int, words: np.ndarray):
        self.env, self.h, self.S = env, prompt_history, env.obs_len
        self.hist_words = history_words(words)

    def start(self, n: int):
        hh = max(self.h, 1)
        return (jnp.zeros((n, hh, self.S), jnp.int32), jnp.full((n, hh), -1, jnp.int32), jnp.zeros((n, hh), bool))

    def __call__(self, inner, hist):
        h, S = self.h, self.S
        h_obs, h_act, h_valid = hist
        obs = jax.vmap(self.env.render)(inner)
        check_render(self.env, obs)
        word = jnp.where(h_act[..., None] >= 0, jnp.asarray(self.hist_words)[jnp.clip(h_act, 0)], PAD)
        empty = jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool)
        prompts, pmasks = jax.vmap(lambda ho, w, hv, o: build_prompt(
            *empty, ho[:h], jnp.ones((h, S), bool), w[:h], hv[:h], o, jnp.ones((S,), bool)))(
                h_obs, word, h_valid, obs)
        return obs, prompts, pmasks

    def push(self, hist, obs, action):
        if not self.h:
            return hist
        h_obs, h_act, h_valid = hist
        return (jnp.concatenate([h_obs[:, 1:], obs[:, None]], axis=1),
                jnp.concatenate([h_act[:, 1:], action[:, None]], axis=1),
                jnp.concatenate([h_valid[:, 1:], jnp.ones((h_valid.shape[0], 1), bool)], axis=1))


def make_rollout(model: nnx.Module, env: JaxEnv, config: RolloutConfig = RolloutConfig()):
    """``rollout(params, tasks, key) -> Rollout`` for B tasks (one group each), jittable.

    ``model`` gives the graph; ``params`` (an ``nnx.State`` of its parameters) are passed
    per call so one compiled rollout serves every training iteration.
    """
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    words = word_table(env.action_words, max(len(w) for w in env.action_words))
    A = words.shape[1] - 1
    _check_response_fits(config, A)
    forced = forced_positions(words)
    S, h, T, K = env.obs_len, config.prompt_history, env.max_steps, config.group_size
    P = prompt_length(S, h, A)
    check_context(model, P, config.max_response, f"make_rollout({type(env).__name__})")
    prompter = _Prompts(env, h, words)

    def rollout(params, tasks, key) -> Rollout:
        model = nnx.merge(graphdef, params, rest)
        B = jax.tree_util.tree_leaves(tasks)[0].shape[0]
        rep = lambda x: jnp.repeat(jnp.asarray(x)[:, None], K, axis=1).reshape((B * K,) + x.shape[1:])
        state = jax.vmap(lambda task: env_reset(env, task))(jax.tree_util.tree_map(rep, tasks))
        table = jnp.broadcast_to(jnp.asarray(words), (B * K,) + words.shape) if config.constrained else None
        table_valid = jnp.ones((B * K, words.shape[0]), bool) if config.constrained else None

        def one_step(carry, key_t):
            state, hist = carry
            obs, prompts, pmasks = prompter(state.inner, hist)
            seq, msk, resp, logp = sample_responses(model, prompts, pmasks, key_t, max_response=config.max_response,
                                                    temperature=config.temperature, table=table,
                                                    table_valid=table_valid, forced=forced, decode=config.decode)
            action = jax.vmap(parse_response, in_axes=(0, None, None))(
                seq[:, P:], jnp.asarray(words), jnp.ones((words.shape[0],), bool))
            key_obs = observation_keys(env, state.inner)
            new_state, reward, valid = jax.vmap(lambda s, a: env_step(env, s, a))(state, action)
            penalty = jnp.where((action < 0) & valid, config.invalid_penalty, 0.0)
            out = (key_obs, reward, penalty, valid, seq, msk & valid[:, None], resp & valid[:, None],
                   jnp.where(valid[:, None], logp, 0.0), jnp.where(valid, action, -1))
            return (new_state, prompter.push(hist, obs, action)), out

        keys = jax.random.split(key, T)
        (final, _), outs = jax.lax.scan(one_step, (state, prompter.start(B * K)), keys)
        key_obs, reward, penalty, valid, seq, msk, resp, logp, action = (
            jnp.swapaxes(x, 0, 1).reshape((B, K, T) + x.shape[2:]) for x in outs)
        return finish_rollout(key_obs, reward, penalty, valid, seq, msk, resp, logp, action,
                              final.success.reshape(B, K), final.terminal.reshape(B, K))

    return rollout


class Replay(NamedTuple):
    """Given actions replayed in the environment, as the sequences a policy would have produced."""

    tokens: Int[Array, "N T L"]           # prompt + the action word + EOS
    mask: Bool[Array, "N T L"]            # real tokens (False at steps after the episode ended)
    response_mask: Bool[Array, "N T L"]   # the response tokens (the word and its EOS)
    valid: Bool[Array, "N T"]             # the step belongs to the episode
    success: Bool[Array, "N"]             # the environment's own success flag at the end


def make_replay(env: JaxEnv, config: RolloutConfig = RolloutConfig()):
    """``replay(tasks, actions) -> Replay``: play ``actions`` int32 [N, T] (T = env.max_steps;
    -1 = the invalid action) from each task's start with the environment's own ``step`` and
    write every step as the rollout would have: the same prompt (``prompt_history`` pairs) and
    the action's word and EOS as the response (PAD after, up to ``max_response``). Jittable.
    The data of a supervised warm start (``bepo_jax.agent.train.sft``)."""
    words = word_table(env.action_words, max(len(w) for w in env.action_words))
    A = words.shape[1] - 1
    _check_response_fits(config, A)
    R = config.max_response
    responses = np.full((words.shape[0] + 1, R), PAD, np.int32)
    responses[:-1, : A + 1] = words  # the last row: the invalid action (an empty response)
    responses = np.where(np.cumsum(responses == EOS, axis=1) > 1, PAD, responses)  # nothing after the first EOS
    prompter = _Prompts(env, config.prompt_history, words)

    def replay(tasks, actions) -> Replay:
        N = jax.tree_util.tree_leaves(tasks)[0].shape[0]
        state = jax.vmap(lambda task: env_reset(env, task))(tasks)

        def one_step(carry, action):
            state, hist = carry
            obs, prompts, pmasks = prompter(state.inner, hist)
            resp = jnp.asarray(responses)[jnp.where(action < 0, words.shape[0], action)]
            new_state, _, valid = jax.vmap(lambda s, a: env_step(env, s, a))(state, action)
            seq = jnp.concatenate([prompts, resp], axis=1)
            rmask = jnp.concatenate([jnp.zeros_like(pmasks), resp != PAD], axis=1) & valid[:, None]
            msk = jnp.concatenate([pmasks, resp != PAD], axis=1) & valid[:, None]
            return (new_state, prompter.push(hist, obs, action)), (seq, msk, rmask, valid)

        (final, _), (seq, msk, rmask, valid) = jax.lax.scan(one_step, (state, prompter.start(N)),
                                                            jnp.swapaxes(jnp.asarray(actions, jnp.int32), 0, 1))
        sw = lambda x: jnp.swapaxes(x, 0, 1)
        return Replay(sw(seq), sw(msk), sw(rmask), sw(valid), final.success)

    return replay


def finish_rollout(key_obs, reward, penalty, valid, seq, msk, resp, logp, action, success, terminal,
                   hidden=None, obs_tokens=None, action_key=None) -> Rollout:
    """Outcomes and the Rollout tuple (shared with the host loop): SUCCESS if the episode
    succeeded, FAILURE if the environment ended it otherwise (even on the last allowed
    step), TRUNCATED if only the time limit ended it. ``action_key``: the batch's action keys
    (the host loops pass the chosen commands' texts, hashed); None: the action ids', as the
    jitted loop's actions are indices into the environment's fixed action set (-1 invalid)."""
    outcome = outcome_codes(success, terminal)
    if action_key is None:
        action_key = action_id_keys(jnp.where(valid, action, -1))
    batch = StepBatch(obs_key=key_obs, reward=reward, mask=valid, outcome=outcome, penalty=penalty,
                      action_key=action_key)
    return Rollout(batch, seq, msk, resp, logp, action, success, hidden, obs_tokens)
