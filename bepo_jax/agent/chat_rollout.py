"""Multi-turn rollouts of a pretrained chat model in text environments (``HostEnv``).

Each turn of each episode is one chat: the checkpoint's own chat template over

    system     the game's objective and the reply format
    user       an example observation and its commands     (``example``: one worked turn;
    assistant  an example reply                              the offline 135M model needs it)
    user / assistant  the last ``prompt_history`` turns: what was seen, what the model replied
    user       the current observation and the admissible commands

with the generation prompt; the reply is sampled (temperature, at most ``max_reply`` tokens,
ending at the model's end-of-turn token) and parsed into a command: ``action_format``
"bare" reads the reply's first line, "tag" what stands between ``<action>`` and
``</action>`` (verl-agent's format); the text is matched to the admissible commands after
normalising case, whitespace and end punctuation. A reply that names none is an invalid
action: the environment does not move and the turn gets ``invalid_penalty`` (as the
character policy's rollouts). ``constrained`` samples only replies that spell an admissible
command (in the format) then end the turn; the log-probs recorded are those of the
unconstrained policy at the sampling temperature in every case, which is what the update
evaluates (``TrainConfig.temperature`` set to the same value).

All B x K episodes of an iteration decode together (``rollout.sample_responses`` over the
model's KV cache), left-padded to a multiple of ``bucket`` tokens. Each distinct prompt of a turn
is prefilled once (the K episodes of a game share their first turn's prompt; finished episodes
are left out) and its cache copied to its rows; the distinct prompts are padded to a power of
two, so the compiled programs are one per (prompt bucket, power of two) met
(``ChatRollout.compiles`` counts them). A finished episode's row keeps decoding (fixed shapes)
and its output is dropped.

States for the estimators: the observation text, hashed (``hash_observations``); with
``state_with_commands`` the admissible commands too (as verl-agent's ALFWorld anchor). The
texts also travel as bytes (``Rollout.obs_tokens``), so similar states can be merged before the
estimator (``credit.similarity``; ``RunConfig.similarity``).
The turn sequences are re-padded on the left to the longest prompt of the iteration:
``Rollout.tokens`` [B, K, T, P + R], the reply tokens (through the end-of-turn token) in
``response_mask`` — the loss covers exactly them. When the model records its frozen blocks'
output (``LlamaLM.capture_layer``: training the top N blocks), ``Rollout.hidden`` holds it at
every position, and the update runs only the blocks above (the lower ones ran once, here).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..credit._config import check_bool, check_choice, check_int, check_range
from ..credit.hashing import action_keys, hash_observations
from .models.generate import left_pad
from .rollout import Rollout, finish_rollout, sample_responses

FORMATS = ("bare", "tag")
# The worked turn (``example``): a made-up room whose objects no generated game shares, so copying
# the example's reply is never an admissible command.
EXAMPLE_OBJECTIVE = "Take the shovel."
EXAMPLE_OBSERVATION = "You are in a garden. There is a shovel on the ground. You are carrying nothing."
EXAMPLE_COMMANDS = ("go east", "look", "take shovel")
EXAMPLE_COMMAND = "take shovel"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatRolloutConfig:
    """group_size K (4), prompt_history (2 earlier turns in the chat), temperature (1.0),
    max_reply tokens (24, the end-of-turn token included), invalid_penalty (-0.1, <= 0),
    action_format ("bare" | "tag"), constrained (False), example (True: one worked turn
    after the system message), state_with_commands (False: states are the observation text),
    bucket (64: prompts are left-padded to a multiple of it), max_prompt (1024 tokens: a
    longer prompt drops its oldest turns, and one that still does not fit raises)."""

    group_size: int = 4
    prompt_history: int = 2
    temperature: float = 1.0
    max_reply: int = 24
    invalid_penalty: float = -0.1
    action_format: str = "bare"
    constrained: bool = False
    example: bool = True
    state_with_commands: bool = False
    bucket: int = 64
    max_prompt: int = 1024

    def __post_init__(self):
        n = "ChatRolloutConfig"
        check_int(n, "group_size", self.group_size, lo=1)
        check_int(n, "prompt_history", self.prompt_history, lo=0)
        check_range(n, "temperature", self.temperature, lo=0.0, lo_open=True)
        check_int(n, "max_reply", self.max_reply, lo=2)
        check_range(n, "invalid_penalty", self.invalid_penalty, hi=0.0)
        check_choice(n, "action_format", self.action_format, FORMATS)
        for f in ("constrained", "example", "state_with_commands"):
            check_bool(n, f, getattr(self, f))
        check_int(n, "bucket", self.bucket, lo=1)
        check_int(n, "max_prompt", self.max_prompt, lo=self.bucket)


# ------------------------------------------------------------------------------------------ text


def normalize_command(text: str) -> str:
    """Lower case, single spaces, no surrounding quotes, backticks or end punctuation."""
    text = " ".join(text.lower().split())
    return text.strip(" \"'`*").rstrip(".!?;:,").strip(" \"'`*")


def format_command(command: str, action_format: str) -> str:
    """The reply that names ``command`` in ``action_format``."""
    return f"<action>{command}</action>" if action_format == "tag" else command


def parse_reply(reply: str, commands: Sequence[str], action_format: str) -> int:
    """The index of the admissible command ``reply`` names, or -1 (module docstring)."""
    if action_format == "tag":
        m = re.search(r"<action>(.*?)</action>", reply, re.S)
        if m is None:
            return -1
        text = m.group(1)
    else:
        lines = reply.strip().splitlines()
        text = lines[0] if lines else ""
    key = normalize_command(text)
    for i, c in enumerate(commands):
        if key and normalize_command(c) == key:
            return i
    return -1


def system_message(objective: str, action_format: str) -> str:
    how = ("reply with exactly one of the admissible commands inside <action></action>, for example "
           "<action>go east</action>" if action_format == "tag"
           else "reply with exactly one of the admissible commands and nothing else")
    return (f"You are playing a text adventure game. {objective.strip()}\n"
            f"Each turn you see where you are and the admissible commands; {how}.")


def user_message(observation: str, commands: Sequence[str]) -> str:
    """The observation, then the admissible commands one per line (one line each halved the
    offline 135M model's invalid replies against a comma-separated list: 47% against 84% of 32
    first turns at temperature 0.7)."""
    listed = "\n".join(commands)
    return f"Observation: {observation.strip()}\nAdmissible commands:\n{listed}\nYour command:"


def turn_messages(objective: str, turns: Sequence[tuple[str, Sequence[str], str]], observation: str,
                  commands: Sequence[str], config: ChatRolloutConfig) -> list[dict]:
    """The chat of one turn: ``turns`` = the earlier (observation, commands, reply) shown."""
    msgs = [{"role": "system", "content": system_message(objective, config.action_format)}]
    if config.example:
        msgs += [{"role": "user", "content": user_message(EXAMPLE_OBSERVATION, EXAMPLE_COMMANDS)},
                 {"role": "assistant", "content": format_command(EXAMPLE_COMMAND, config.action_format)}]
    for obs, cmds, rep in turns:
        msgs += [{"role": "user", "content": user_message(obs, cmds)}, {"role": "assistant", "content": rep}]
    return msgs + [{"role": "user", "content": user_message(observation, commands)}]


STATE_BYTES = 1024  # the states' texts for similarity merging: their first bytes


def state_bytes(texts: np.ndarray) -> np.ndarray:
    """int32 [..., STATE_BYTES]: each state text's UTF-8 bytes + 1 (0 = no byte), cut at STATE_BYTES --
    the tokens ``credit.similarity.merge_similar`` compares."""
    out = np.zeros(texts.shape + (STATE_BYTES,), np.int32)
    flat = out.reshape(-1, STATE_BYTES)
    for i, t in enumerate(texts.reshape(-1)):
        b = np.frombuffer(str(t).encode()[:STATE_BYTES], np.uint8)
        flat[i, : len(b)] = b.astype(np.int32) + 1
    return out


# ------------------------------------------------------------------------------------------ rollout


class ChatRollout:
    """``ChatRollout(pretrained, graphdef, frozen, make_env, config, max_steps=8)``;
    ``rollout(params, tasks, key) -> Rollout`` for B tasks (K episodes each).

    ``graphdef`` / ``frozen``: the split of the model a ``Trainer`` made (its ``graphdef`` and
    ``rest``), so ``params`` are the trained parameters only. After a call, ``episodes``
    holds every episode's turns (observation, commands, reply, action, reward), ``state_texts``
    [B, K, T] the text each state key was hashed from ("" past an episode's end) and
    ``timing`` the seconds spent decoding and stepping environments; ``compiles`` counts the
    sampling programs traced so far."""

    def __init__(self, pretrained, graphdef, frozen, make_env: Callable[[], Any],
                 config: ChatRolloutConfig = ChatRolloutConfig(), *, max_steps: int = 8):
        check_int("ChatRollout", "max_steps", max_steps, lo=1)
        self.pre, self.tok, self.config, self.max_steps = pretrained, pretrained.tokenizer, config, max_steps
        self.graphdef, self.frozen, self.make_env = graphdef, frozen, make_env
        self.stop = tuple(int(i) for i in self.tok.end_of_turn_ids)
        if not self.stop:
            raise ValueError("ChatRollout: the tokenizer has no end-of-turn token, so a reply cannot end; load a chat "
                             "(instruct) checkpoint.")
        self.pad = int(self.tok.pad_id)
        context = pretrained.config.context
        if config.max_prompt + config.max_reply > context:
            raise ValueError(f"ChatRolloutConfig: max_prompt={config.max_prompt} + max_reply={config.max_reply} "
                             f"exceeds the model's context of {context} tokens; lower max_prompt.")
        self.envs: list = []
        self.episodes: list[list[dict]] = []
        self.timing = {"decode_s": 0.0, "env_s": 0.0}
        self.compiles = 0
        # the model records its frozen blocks' output for the update (``LlamaLM.capture_layer``)
        self.capture = getattr(pretrained.model, "capture_layer", None) is not None
        self._sample = jax.jit(self._sample_fn, static_argnames=("constrained",))

    def _sample_fn(self, params, frozen, prompts, masks, key, table, table_valid, expand, *, constrained: bool):
        self.compiles += 1  # runs only while tracing
        model = nnx.merge(self.graphdef, params, frozen)
        return sample_responses(model, prompts, masks, key, max_response=self.config.max_reply,
                                temperature=self.config.temperature, table=table if constrained else None,
                                table_valid=table_valid if constrained else None, decode="cached",
                                stop_ids=self.stop, pad_id=self.pad, logp_temperature=self.config.temperature,
                                return_hidden=self.capture, expand=expand)

    # -- prompts ----------------------------------------------------------------------------
    def prompt_ids(self, objective: str, turns: list, observation: str, commands: Sequence[str]) -> list[int]:
        """The token ids of one turn's chat, dropping the oldest shown turns while it exceeds
        ``max_prompt`` (a prompt that does not fit even without them raises)."""
        h = self.config.prompt_history
        shown = list(turns[-h:]) if h else []
        while True:
            ids = self.pre.prompt_ids(turn_messages(objective, shown, observation, commands, self.config))
            if len(ids) <= self.config.max_prompt:
                return ids
            if not shown:
                raise ValueError(f"a turn's prompt has {len(ids)} tokens, more than ChatRolloutConfig.max_prompt="
                                 f"{self.config.max_prompt} with no earlier turn shown; raise max_prompt (the model's "
                                 "context allows it) or shorten the observation.")
            shown = shown[1:]

    def _distinct(self, rows: list[list[int]], live: np.ndarray, width: int):
        """The distinct prompts of the live rows (the K episodes of a game share their first prompt),
        padded with copies to a power of two (bounded compiles), and each row's index among them
        (a finished row points at the first: its reply is dropped)."""
        index: dict[tuple, int] = {}
        expand = np.zeros(len(rows), np.int32)
        for i in np.flatnonzero(live):
            expand[i] = index.setdefault(tuple(rows[i]), len(index))
        distinct = [list(r) for r in index] or [rows[0]]
        U = 1 << (len(distinct) - 1).bit_length()
        ids, mask = left_pad(distinct + [distinct[0]] * (U - len(distinct)), width, self.pad)
        return ids, mask, expand

    def _table(self, commands: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        """Constrained decoding: each row's replies that name a command, as token ids then end-of-turn."""
        fmt = self.config.action_format
        words = [[self.tok.encode(format_command(c, fmt)) + [self.stop[0]] for c in cmds] for cmds in commands]
        R = self.config.max_reply
        A = max(1, max(len(w) for w in words))
        table = np.full((len(words), A, R), self.stop[0], np.int32)
        valid = np.zeros((len(words), A), bool)
        for i, ws in enumerate(words):
            for j, w in enumerate(ws):
                if len(w) <= R:  # a command longer than the reply cannot be named
                    table[i, j, : len(w)] = w
                    valid[i, j] = True
        return table, valid

    def _bucket(self, n: int) -> int:
        b = self.config.bucket
        return min(-(-n // b) * b, self.config.max_prompt)

    # -- the rollout ------------------------------------------------------------------------
    def __call__(self, params, tasks: Sequence[Any], key) -> Rollout:
        cfg, K, T = self.config, self.config.group_size, self.max_steps
        B = len(tasks)
        N = B * K
        while len(self.envs) < N:
            self.envs.append(self.make_env())
        envs = self.envs[:N]
        t0 = time.perf_counter()
        started = [envs[i].reset(tasks[i // K]) for i in range(N)]
        obs, cmds = [s[0] for s in started], [list(s[1]) for s in started]
        objective = [getattr(e, "objective", "") for e in envs]
        env_s, decode_s = time.perf_counter() - t0, 0.0
        history: list[list] = [[] for _ in range(N)]
        episodes: list[list[dict]] = [[] for _ in range(N)]
        done, ended, success = np.zeros(N, bool), np.zeros(N, bool), np.zeros(N, bool)
        raw = np.empty((N, T), object)
        raw[:] = ""
        reward, penalty = np.zeros((N, T), np.float32), np.zeros((N, T), np.float32)
        valid, action_out = np.zeros((N, T), bool), np.full((N, T), -1, np.int32)
        action_text = np.full((N, T), "", object)  # the chosen command ("" = no valid command, and padding)
        turns = []  # per turn: (prompt rows, reply tokens [N, R], reply mask, logp)
        frozen = self.frozen
        for t in range(T):
            live = ~done  # a finished episode's row gets a one-token stand-in prompt; its reply is dropped
            rows = [self.prompt_ids(objective[i], history[i], obs[i], cmds[i]) if live[i] else [self.pad]
                    for i in range(N)]
            P = self._bucket(max(len(r) for r in rows))
            prompts, masks, expand = self._distinct(rows, live, P)
            table, table_valid = self._table(cmds)
            key, sub = jax.random.split(key)
            t1 = time.perf_counter()
            seq, _, resp, logp, *hidden = jax.device_get(self._sample(
                params, frozen, prompts, masks, sub, table, table_valid, expand, constrained=cfg.constrained))
            decode_s += time.perf_counter() - t1
            reply_tok, reply_mask, reply_logp = seq[:, P:], resp[:, P:], logp[:, P:]
            t1 = time.perf_counter()
            for i in np.flatnonzero(live):
                toks = [int(x) for x, m in zip(reply_tok[i], reply_mask[i]) if m and int(x) not in self.stop]
                text = self.tok.decode(toks, skip_special_tokens=True)
                a = parse_reply(text, cmds[i], cfg.action_format)
                raw[i, t] = obs[i] + ("\n" + "\n".join(cmds[i]) if cfg.state_with_commands else "")
                turn = {"observation": obs[i], "commands": list(cmds[i]), "reply": text, "action": a, "reward": 0.0}
                history[i].append((obs[i], list(cmds[i]), text))
                if a >= 0:
                    action_text[i, t] = cmds[i][a]
                    obs[i], r, d, won, new_cmds = envs[i].step(cmds[i][a])
                    cmds[i] = list(new_cmds)
                    reward[i, t] = turn["reward"] = float(r)
                    success[i] |= won
                    ended[i] = done[i] = bool(d or won)
                else:
                    penalty[i, t] = cfg.invalid_penalty
                    turn["reward"] = cfg.invalid_penalty
                episodes[i].append(turn)
                action_out[i, t] = a
                done[i] |= t + 1 >= T
            env_s += time.perf_counter() - t1
            valid[:, t] = live
            turns.append((rows, np.where(live[:, None], reply_tok, self.pad), reply_mask & live[:, None],
                          np.where(live[:, None] & reply_mask, reply_logp, 0.0), hidden[0] if hidden else None))
            if done.all():
                break
        self.episodes, self.timing = episodes, {"decode_s": decode_s, "env_s": env_s}
        self.state_texts = raw.reshape(B, K, T)  # what each state key was hashed from (ProxMO's TF-IDF reads it)
        return self._assemble(turns, raw, reward, penalty, valid, action_out, action_text, success, ended, B, K)

    def _assemble(self, turns, raw, reward, penalty, valid, action_out, action_text, success, ended, B, K) -> Rollout:
        """The turns as one [B, K, T, P + R] batch, left-padded to the iteration's longest prompt bucket."""
        N, T, R = raw.shape[0], raw.shape[1], self.config.max_reply
        P = self._bucket(max(len(r) for rows, *_ in turns for r in rows))
        L = P + R
        tokens = np.full((N, T, L), self.pad, np.int32)
        mask = np.zeros((N, T, L), bool)
        resp = np.zeros((N, T, L), bool)
        logp = np.zeros((N, T, L), np.float32)
        hidden = None
        for t, (rows, rtok, rmask, rlogp, hid) in enumerate(turns):
            live = valid[:, t]
            ids, pm = left_pad(rows, P, self.pad)
            tokens[:, t, :P], mask[:, t, :P] = ids, pm & live[:, None]
            tokens[:, t, P:], mask[:, t, P:] = rtok, rmask
            resp[:, t, P:], logp[:, t, P:] = rmask, rlogp
            if hid is not None:  # this turn's bucket P_t <= P: shift right by P - P_t (left padding)
                if hidden is None:
                    hidden = np.zeros((N, T, L, hid.shape[-1]), hid.dtype)
                hidden[:, t, L - hid.shape[1]:] = hid
        keys = hash_observations(raw.reshape(-1).tolist()).reshape(N, T, 2)
        obs_bytes = state_bytes(raw)
        shape = lambda x: jnp.asarray(x.reshape((B, K) + x.shape[1:]))
        return finish_rollout(shape(keys), shape(reward), shape(penalty), shape(valid), shape(tokens), shape(mask),
                              shape(resp), shape(logp), shape(action_out), shape(success), shape(ended),
                              None if hidden is None else shape(hidden), shape(obs_bytes),
                              action_key=shape(action_keys(action_text)))
