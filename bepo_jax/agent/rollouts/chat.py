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

The earlier replies in a chat are the tokens that were sampled (``chat_ids``: the template's
text around them, the reply's own end-of-turn token in place of the template's), so a turn's
prompt extends the previous turn's prompt and reply while no shown turn drops out of the window.

Cache reuse (RadixAttention-style prefix reuse, per episode). A turn's cache has P + R slots
(P: ``bucket`` x 2^k holding the turn's longest prompt, at most ``max_prompt``; R =
``max_reply``) with each row's prompt right-aligned to end at slot P and its reply after it;
positions count real tokens only, so moving a row's tokens to other slots changes nothing. A
turn keeps from each row's cache the longest prefix of its new prompt the cache holds (all of
the previous prompt and reply when the chat only grew; the shared system part when
``prompt_history`` slid the window and an old turn dropped out: then the rest is run again)
and runs only the remaining tokens through the model (``LlamaLM.extend``, a chunked prefill).
The prefix all first prompts share is computed once per call (it depends on the weights). Rows
with the same prompt run once (the K episodes of a game share their first prompt) and their
cache is copied. Replies decode together over the cache (``rollout.decode_responses``),
stopping when every row has ended. The compiled programs: one prompt program per (distinct rows
padded to a power of two, new tokens padded to a multiple of ``bucket``, P) met, one decoding
program per (rows, P), and the small programs that move caches (``ChatRollout.compiles`` counts
them all). A finished
episode's row keeps its place (fixed shapes) and its output is dropped. ``reuse_cache=False``
runs every turn's whole prompt: the same tokens, and the same samples and log-probs to float32
tolerance (tested).

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
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ...credit.configs import check_bool, check_choice, check_int
from ...credit.hashing import action_keys, hash_observations
from .memory import release
from ..models.generate import left_pad
from .jitted import Rollout, check_sampling_fields, decode_responses, finish_rollout

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
    bucket (64: a turn's new tokens and the assembled turns are left-padded to a multiple of
    it), max_prompt (1024 tokens: a longer prompt drops its oldest turns, and one that still
    does not fit raises), reuse_cache (True: carry each episode's KV cache from turn to turn
    and compute the prefix all first prompts share once, so a turn runs only the tokens its
    cache lacks; False: run every turn's whole prompt; the same tokens either way).

    >>> cfg = ChatRolloutConfig(group_size=8, prompt_history=3, temperature=0.7)
    >>> cfg.max_reply, cfg.reuse_cache
    (24, True)
    >>> ChatRolloutConfig(max_reply=1)
    Traceback (most recent call last):
    ...
    ValueError: ChatRolloutConfig.max_reply=1 is out of range; it must be >= 2.
    """

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
    reuse_cache: bool = True

    def __post_init__(self):
        n = "ChatRolloutConfig"
        check_sampling_fields(n, self, "max_reply")
        check_choice(n, "action_format", self.action_format, FORMATS)
        for f in ("constrained", "example", "state_with_commands", "reuse_cache"):
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


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ChatRollout:
    """``ChatRollout(pretrained, graphdef, frozen, make_env, config, max_steps=8)``;
    ``rollout(params, tasks, key) -> Rollout`` for B tasks (K episodes each).

    ``graphdef`` / ``frozen``: the split of the model a ``Trainer`` made (its ``graphdef`` and
    ``rest``), so ``params`` are the trained parameters only. After a call, ``episodes``
    holds every episode's turns (observation, commands, reply, action, reward), ``state_texts``
    [B, K, T] the text each state key was hashed from ("" past an episode's end) and
    ``timing`` the seconds spent decoding and stepping environments and the tokens prefilled
    (``prefill_tokens``: computed; ``prompt_tokens``: the live rows' prompts, what a rollout
    without reuse computes; ``shared_prefix``: the prefix tokens computed once); ``compiles``
    counts the programs traced so far. ``capture``: record the frozen blocks' output for the update
    (``Rollout.hidden``); None: when the model records it (``LlamaLM.capture_layer``), False for
    an evaluation, which scores replies only (the same tokens and log-probs: tested).

    Memory: a turn's cache holds rows x (P + R) slots of keys and values in every block (the
    recipe's 64 evaluation rows at P = 1024: 3 GiB); the reply loop writes into the cache it is
    given (donated), and after each turn the freed memory goes back to the system
    (``rollouts.memory.release``)."""

    def __init__(self, pretrained, graphdef, frozen, make_env: Callable[[], Any],
                 config: ChatRolloutConfig = ChatRolloutConfig(), *, max_steps: int = 8,
                 capture: Optional[bool] = None):
        check_int("ChatRollout", "max_steps", max_steps, lo=1)
        self.pre, self.tok, self.config, self.max_steps = pretrained, pretrained.tokenizer, config, max_steps
        self.graphdef, self.frozen, self.make_env = graphdef, frozen, make_env
        self.stop = tuple(int(i) for i in self.tok.end_of_turn_ids)
        if not self.stop:
            raise ValueError("ChatRollout: the tokenizer has no end-of-turn token, so a reply cannot end; load a chat "
                             "(instruct) checkpoint.")
        if not callable(getattr(pretrained.model, "extend", None)):
            raise ValueError(f"ChatRollout needs a model with extend() (LlamaLM); {type(pretrained.model).__name__} "
                             "has none.")
        self.pad = int(self.tok.pad_id)
        context = pretrained.config.context
        if config.max_prompt + config.max_reply > context:
            raise ValueError(f"ChatRolloutConfig: max_prompt={config.max_prompt} + max_reply={config.max_reply} "
                             f"exceeds the model's context of {context} tokens; lower max_prompt.")
        self.envs: list = []
        self.episodes: list[list[dict]] = []
        self.timing: dict = {"decode_s": 0.0, "env_s": 0.0}
        self.compiles = 0
        # the model records its frozen blocks' output for the update (``LlamaLM.capture_layer``);
        # ``capture=False``: not here (an evaluation scores replies only)
        can = getattr(pretrained.model, "capture_layer", None) is not None
        if capture and not can:
            raise ValueError("ChatRollout(capture=True): the model records no block's output; set "
                             "LlamaLM.capture_layer (the first trained block) first.")
        self.capture = can if capture is None else bool(capture)
        self._move = jax.jit(self._move_fn, static_argnames=("length",))
        self._extend = jax.jit(self._extend_fn)
        # the cache is donated: the reply loop writes into it instead of a copy (one cache less at the peak)
        self._decode = jax.jit(self._decode_fn, static_argnames=("constrained",), donate_argnames=("cache",))
        self._prefix = jax.jit(self._prefix_fn)

    # -- the compiled programs -------------------------------------------------------------
    def _empty_cache(self, model, rows: int, slots: int):
        """``model.empty_cache`` without the recorded blocks' output unless this rollout keeps it."""
        cache = model.empty_cache(rows, slots)
        return cache if self.capture else cache._replace(hidden=None)

    def _prefix_fn(self, params, frozen, tokens, mask):
        """The shared prefix's cache: one row, ending at slot P = its chunk's width."""
        self.compiles += 1  # runs only while tracing
        model = nnx.merge(self.graphdef, params, frozen)
        return model.extend(self._empty_cache(model, 1, tokens.shape[1] + self.config.max_reply), tokens, mask, 0)[1]

    def _move_fn(self, cache, src_row, len_old, len_new, kept, *, length: int):
        """Each distinct row's first ``kept`` tokens from its source row of ``cache`` (whose prompts
        end at slot P_old = its slots - R), moved so its prompt of ``len_new`` tokens ends at slot
        P = ``length`` of a cache of P + R slots; nothing else visible. Exact: a slot's keys and
        values carry its position, not its slot."""
        self.compiles += 1  # runs only while tracing
        P, R = length, self.config.max_reply
        S, S_old = P + R, cache.valid.shape[1]
        j = jnp.arange(S)[None]
        lo = P - len_new[:, None]
        keep = (j >= lo) & (j < lo + kept[:, None])
        src = jnp.clip(j + (S_old - S) + (len_new - len_old)[:, None], 0, S_old - 1)
        move = lambda x: x[src_row[:, None], src]  # [rows, slots, ...]
        move_kv = lambda x: jnp.take_along_axis(x[src_row], src[:, None, :, None], axis=2)  # [rows, heads, slots, D]
        return type(cache)(k=tuple(map(move_kv, cache.k)), v=tuple(map(move_kv, cache.v)), valid=keep,
                           position=kept.astype(jnp.int32), hidden=None if cache.hidden is None else move(cache.hidden))

    def _extend_fn(self, params, frozen, cache, chunk, chunk_mask, expand):
        """The rest of each distinct row's prompt (``chunk``, right-aligned to end at slot P = the
        cache's slots - R) run through the model, then the logits and caches copied to the N rows
        (``expand``)."""
        self.compiles += 1  # runs only while tracing
        model = nnx.merge(self.graphdef, params, frozen)
        P = cache.valid.shape[1] - self.config.max_reply
        logits, cache = model.extend(cache, chunk, chunk_mask, P - chunk.shape[1])
        return jax.tree_util.tree_map(lambda x: x[expand], (logits, cache))

    def _decode_fn(self, params, frozen, logits, cache, key, table, table_valid, *, constrained: bool):
        """The N rows' replies, decoded together at slots P .. P + R - 1 (P = the cache's slots - R)."""
        self.compiles += 1  # runs only while tracing
        model = nnx.merge(self.graphdef, params, frozen)
        return decode_responses(
            model, logits, cache, cache.valid.shape[1] - self.config.max_reply, key, max_response=self.config.max_reply,
            temperature=self.config.temperature, table=table if constrained else None,
            table_valid=table_valid if constrained else None, stop=jnp.asarray(self.stop, jnp.int32), pad=self.pad,
            logp_temperature=self.config.temperature)

    # -- prompts ----------------------------------------------------------------------------
    def chat_ids(self, objective: str, shown: Sequence[tuple], observation: str, commands: Sequence[str]) -> list[int]:
        """The token ids of one turn's chat: the template's text around the earlier replies, and
        each earlier reply as the tokens that were sampled (``shown``: (observation, commands,
        reply ids); a reply ending in its end-of-turn token stands in for the template's). Where
        the template changes what an assistant turn says, the replies' texts are rendered and
        encoded instead."""
        marks = [f"\ue000{j}\ue001" for j in range(len(shown))]
        msgs = turn_messages(objective, [(o, c, m) for (o, c, _), m in zip(shown, marks)], observation, commands,
                             self.config)
        text = self.pre.chat_template(msgs, add_generation_prompt=True)
        pieces, rest = [], text
        for m in marks:
            head, found, rest = rest.partition(m)
            if not found or any(x in head or x in rest for x in marks if x != m):
                replies = [(o, c, self.tok.decode([i for i in r if i not in self.stop], skip_special_tokens=True))
                           for o, c, r in shown]
                return self.pre.prompt_ids(turn_messages(objective, replies, observation, commands, self.config))
            pieces.append(head)
        more = lambda t: self.tok.encode(t, add_special_tokens=False) if t else []
        ids = more(pieces[0] if pieces else rest)
        for j, (_, _, reply) in enumerate(shown):
            after = pieces[j + 1] if j + 1 < len(pieces) else rest
            reply = list(reply)
            if reply and reply[-1] in self.stop:
                end = self.tok.decode([reply[-1]])
                if after.startswith(end):
                    after = after[len(end):]
                else:  # the template ends the turn with another token: its text stands
                    reply = reply[:-1]
            ids += reply + more(after)
        return ids

    def prompt_ids(self, objective: str, turns: list, observation: str, commands: Sequence[str]) -> list[int]:
        """``chat_ids`` of the last ``prompt_history`` turns, dropping the oldest shown turns while it
        exceeds ``max_prompt`` (a prompt that does not fit even without them raises)."""
        h = self.config.prompt_history
        shown = list(turns[-h:]) if h else []
        while True:
            ids = self.chat_ids(objective, shown, observation, commands)
            if len(ids) <= self.config.max_prompt:
                return ids
            if not shown:
                raise ValueError(f"a turn's prompt has {len(ids)} tokens, more than ChatRolloutConfig.max_prompt="
                                 f"{self.config.max_prompt} with no earlier turn shown; raise max_prompt (the model's "
                                 "context allows it) or shorten the observation.")
            shown = shown[1:]

    def plan(self, rows: list, live: np.ndarray, cached: list) -> dict:
        """What one turn computes. Each live row keeps the longest prefix of its new prompt its cache
        holds (``cached[i]``: the tokens there; at most all but the last prompt token) and runs the
        rest; rows with the same prompt and kept length run once (the K episodes of a game share
        their first prompt). Returns per distinct row (padded with copies of the first to a power of
        two: bounded compiles) its source row, kept count, prompt length and new tokens
        (right-aligned in a chunk of a multiple of ``bucket`` tokens), and each row's index among them
        (``expand``; a finished row points at the first: its reply is dropped)."""
        index: dict[tuple, int] = {}
        src, kept, todo = [], [], []
        expand = np.zeros(len(rows), np.int32)
        for i in np.flatnonzero(live):
            m = min(_common_prefix(cached[i], rows[i]), len(rows[i]) - 1) if self.config.reuse_cache else 0
            k = index.setdefault((tuple(rows[i]), m), len(index))
            expand[i] = k
            if k == len(src):
                src.append(i)
                kept.append(m)
                todo.append(rows[i])
        if not src:  # nothing live (not reached by __call__)
            src, kept, todo = [0], [0], [rows[0] or [self.pad]]
        U = 1 << (len(src) - 1).bit_length()
        pad = U - len(src)
        src, kept, todo = src + src[:1] * pad, kept + kept[:1] * pad, todo + todo[:1] * pad
        new = [r[m:] for r, m in zip(todo, kept)]
        C = self._bucket(max(len(x) for x in new))
        chunk, chunk_mask = left_pad(new, C, self.pad)
        return {"src": np.asarray(src, np.int32), "kept": np.asarray(kept, np.int32),
                "len_new": np.asarray([len(r) for r in todo], np.int32), "chunk": chunk, "chunk_mask": chunk_mask,
                "expand": expand, "computed": sum(len(x) for x in new[: U - pad])}

    def _table(self, commands: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        """Constrained decoding: each row's replies that name a command, as token ids then end-of-turn."""
        fmt = self.config.action_format
        spell = lambda c: self.tok.encode(format_command(c, fmt), add_special_tokens=False) + [self.stop[0]]
        words = [[spell(c) for c in cmds] for cmds in commands]
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

    def _length(self, n: int) -> int:
        """A turn's prompt slots: the smallest bucket x 2^k holding n tokens, at most ``max_prompt``
        (the decoding steps attend over them; few sizes, few programs)."""
        c = self.config.bucket
        while c < n:
            c *= 2
        return min(c, self.config.max_prompt)

    def _bucket(self, n: int) -> int:
        b = self.config.bucket
        return min(-(-n // b) * b, self.config.max_prompt)

    # -- the rollout ------------------------------------------------------------------------
    def __call__(self, params, tasks: Sequence[Any], key) -> Rollout:
        cfg, K, T = self.config, self.config.group_size, self.max_steps
        R = cfg.max_reply
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
        turns = []  # per turn: (prompt rows, reply tokens [N, R], reply mask, logp, hidden)
        frozen = self.frozen
        empty = lambda: self._empty_cache(self.pre.model, 1, cfg.bucket + R)  # no prefix kept: nothing visible
        computed = prompted = 0
        # the prefix every row's first prompt shares, computed once (the weights change each call)
        first = [self.prompt_ids(objective[i], [], obs[i], cmds[i]) for i in range(N)]
        shared = first[0][: min(min(len(r) for r in first) - 1,
                                min(_common_prefix(first[0], r) for r in first))] if cfg.reuse_cache else []
        t1 = time.perf_counter()
        if shared:
            ids, pm = left_pad([shared], self._bucket(len(shared)), self.pad)
            cache = self._prefix(params, frozen, ids, pm)
        else:
            cache = empty()
        decode_s += time.perf_counter() - t1
        cached = [list(shared)] * N
        len_old = np.full(N, len(shared), np.int32)
        source = np.zeros(N, np.int32)  # each row's row in ``cache``
        for t in range(T):
            live = ~done  # a finished episode's row gets a one-token stand-in prompt; its reply is dropped
            rows = [(first[i] if t == 0 else self.prompt_ids(objective[i], history[i], obs[i], cmds[i]))
                    if live[i] else [self.pad] for i in range(N)]
            plan = self.plan(rows, live, cached)
            table, table_valid = self._table(cmds) if cfg.constrained else (None, None)
            key, sub = jax.random.split(key)
            t1 = time.perf_counter()
            src = source[plan["src"]]
            length = self._length(max(len(rows[i]) for i in np.flatnonzero(live)))
            cache = self._move(cache, src, len_old[src], plan["len_new"], plan["kept"], length=length)
            logits, cache = self._extend(params, frozen, cache, plan["chunk"], plan["chunk_mask"], plan["expand"])
            toks, alive, logp, cache = self._decode(params, frozen, logits, cache, sub, table, table_valid,
                                                    constrained=cfg.constrained)
            reply_tok, reply_mask, reply_logp = map(np.asarray, jax.device_get((toks, alive, logp)))
            hid = np.asarray(jax.device_get(cache.hidden)) if self.capture else None
            release()  # the turn's freed caches back to the system (``memory.release``)
            decode_s += time.perf_counter() - t1
            computed += plan["computed"]
            prompted += sum(len(rows[i]) for i in np.flatnonzero(live))
            if not cfg.reuse_cache:  # every turn starts from nothing
                cache = empty()
            source = np.arange(N, dtype=np.int32) if cfg.reuse_cache else np.zeros(N, np.int32)
            t1 = time.perf_counter()
            for i in np.flatnonzero(live):
                n = int(reply_mask[i].sum())
                reply_ids = [int(x) for x in reply_tok[i, :n]]
                cached[i] = rows[i] + reply_ids[: min(n, R - 1)]  # the last token is never written
                len_old[i] = len(rows[i])
                text = self.tok.decode([x for x in reply_ids if x not in self.stop], skip_special_tokens=True)
                a = parse_reply(text, cmds[i], cfg.action_format)
                raw[i, t] = obs[i] + ("\n" + "\n".join(cmds[i]) if cfg.state_with_commands else "")
                turn = {"observation": obs[i], "commands": list(cmds[i]), "reply": text, "action": a, "reward": 0.0}
                history[i].append((obs[i], list(cmds[i]), reply_ids))
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
                          np.where(live[:, None] & reply_mask, reply_logp, 0.0), hid))
            if done.all():
                break
        self.episodes = episodes
        self.timing = {"decode_s": decode_s, "env_s": env_s, "prefill_tokens": computed + len(shared),
                       "prompt_tokens": prompted, "shared_prefix": len(shared), "turns": len(turns)}
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
            if hid is not None:  # the turn's cache: every prompt ends at slot P_t (its slots - R), its reply after
                if hidden is None:
                    hidden = np.zeros((N, T, L, hid.shape[-1]), hid.dtype)
                n = min(L, hid.shape[1])
                hidden[:, t, L - n:] = hid[:, hid.shape[1] - n:]
        keys = hash_observations(raw.reshape(-1).tolist()).reshape(N, T, 2)
        obs_bytes = state_bytes(raw)
        shape = lambda x: jnp.asarray(x.reshape((B, K) + x.shape[1:]))
        return finish_rollout(shape(keys), shape(reward), shape(penalty), shape(valid), shape(tokens), shape(mask),
                              shape(resp), shape(logp), shape(action_out), shape(success), shape(ended),
                              None if hidden is None else shape(hidden), shape(obs_bytes),
                              action_key=shape(action_keys(action_text)))
