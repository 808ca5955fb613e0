"""Step-level credit in Tunix's agentic GRPO learner (``pip install 'bepo-jax[tunix]'``, Python 3.12).

Tunix's agentic learner collects multi-turn trajectories with real models, but hands its
advantage estimators one reward per trajectory. ``StepCreditGRPOLearner`` gives it every
bepo_jax estimator at the step level (docs/tunix.md has the whole contract):

1. **Turns.** ``StepCollectEngine`` records, for every model call, the state the model
   acted on (``state_fn(messages, observation)``; default ``conversation_state``: the
   messages the environment added since the model last spoke -- user or tool -- and the
   environment's raw observation when it added none), the step reward, the assistant and
   environment token counts, and how the episode really ended: "env" when the
   environment's own step ended it, "step_limit" when only ``max_steps`` did (Tunix records
   such episodes as SUCCEEDED), "context_limit", "time_limit", "env_timeout".
2. **Groups.** One ``_process_results`` call may hold several groups (with
   ``compute_logps_micro_batch_size > 1`` Tunix hands over a whole micro-batch): they are
   split by Tunix's group id (else chunks of ``num_generations``; anything else is refused).
3. **Outcomes.** ``outcome_fn(trajectory) -> code`` when given; else TRUNCATED for every
   limit, and for an environment's ending SUCCESS/FAILURE from the final step's
   ``info[success_key]`` (default "success"); where the environment reports none, the
   sign of its final step reward decides (counted in ``bepo/outcome/from_reward``, warned
   once). Never the trajectory's total: a cost-style reward or a ``reward_fns`` bonus
   would flip it.
4. **Rewards.** A turn's reward is the environment's. Tunix's ``reward_fns`` score the
   first assistant message of the conversation; their share of the total (Tunix's reward
   minus the environment's) goes on that turn (``reward_fns_turn="first"``; "last" puts it
   on the last turn).
5. **Credit.** All groups of the call go through the estimator in one call, padded to
   power-of-two buckets (few compilations, none after warm-up), on ``credit_device``
   ("cpu" by default, so credit never queues behind sampling on the accelerator).
   A[k, t] is laid on turn t's assistant tokens of Tunix's completion mask: the policy
   loss receives per-token advantages [G, L]; environment tokens and padding get 0.
6. **Degenerate groups.** Tunix's ``degenerate_group_masking`` zeroes the mask of groups
   with equal trajectory rewards before it computes the sampler importance weights -- the
   very groups step credit rescues. It is refused here; ``mask_zero_credit_groups`` drops
   a group whose step credit is all 0, after the weights are computed.
7. **Metrics** (Tunix's metrics logger, one value per group): ``bepo/states``,
   ``bepo/states_per_turn``, ``bepo/collapsed`` (1 when a multi-turn group's turns all
   map to one state: the state capture sees nothing), ``bepo/gated_share``,
   ``bepo/converged``, ``bepo/iterations``, ``bepo/advantage/{abs_mean,max,min}``,
   ``bepo/advantage/turn_spread`` (mean over turn positions of the spread of A across the
   group), ``bepo/outcome/{success,failure,truncated,from_reward}``. Each group's credit
   is also kept in ``learner.credit_log`` (``GroupCredit``, the newest 256) and passed to
   ``on_credit`` when given. Tunix's own ``rewards/advantage/*`` are its GRPO advantages
   of the trajectory rewards (computed cheaply; not ours).

Also here: ``register_tunix_estimators()`` (every estimator in Tunix's advantage registry
as "bepo_jax/<name>", and under its plain name where Tunix has none, for Tunix's
single-reward learners: each trajectory is one step from one shared state),
``fresh_sampling_seeds`` and ``serial_model_calls`` (both applied by the learner to Tunix's
vanilla engine by default) and ``unpad_multi_turn``. Every touch of Tunix's internals is
listed and checked in ``tunix_compat``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import json
import logging
import threading
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

try:
    import jax.numpy as jnp
    from tunix.rl import function_registry
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.agentic import agentic_grpo_learner
    from tunix.rl.agentic.trajectory import trajectory_collect_engine
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("bepo_jax.integrations.tunix needs google-tunix: pip install 'bepo-jax[tunix]' "
                      "(Python 3.12 with current JAX; see docs/tunix.md).") from e

from ..credit.estimators.registry import ESTIMATORS, make_config
from ..credit.similarity import SimilarityConfig
from ..credit.types import FAILURE, SUCCESS, TRUNCATED
from . import tunix_compat
from .turns import (BucketWatch, Turn, add_trajectory_reward, credit_for_groups, outcome_of, token_advantages)

PREFIX = "bepo_jax/"
log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- states


def _text(content) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True, default=str)


def conversation_state(messages: Sequence[dict], observation: Any = None) -> str:
    """The state a turn acts on: every message after the model's last reply (the
    environment's latest feedback: user and tool messages; on the first turn the system
    prompt and the task), each as ``"<role>: <content>"``, joined by newlines. When the
    environment added no message (an agent that renders some observations as nothing),
    ``"observation: <the raw observation>"`` (strings as they are, anything else as
    sorted-key JSON). Tool-call ids and other message fields are not part of the state."""
    run = []
    for m in reversed(messages):
        if m.get("role") == "assistant":
            break
        run.append(m)
    if run:
        return "\n".join(f"{m.get('role', '')}: {_text(m.get('content', ''))}" for m in reversed(run))
    return "observation: " + _text(observation)


def _check_state_fn(state_fn):
    try:
        inspect.signature(state_fn).bind(None, None)
    except (TypeError, ValueError):
        raise ValueError("state_fn must accept (messages, observation): the conversation so far and the "
                         "environment's latest observation; e.g. lambda messages, obs: str(obs).") from None
    return state_fn


# ----------------------------------------------------------------------------- collection


@dataclasses.dataclass(frozen=True)
class Ending:
    """How an episode ended: ``kind`` ("env" or one of ``turns.LIMIT_ENDINGS``), the
    environment's ``info`` and ``reward`` at its last step (empty / 0 without a step)."""

    kind: str
    info: dict
    reward: float


_STATUS_ENDINGS = {"MAX_STEPS_REACHED": "step_limit", "MAX_CONTEXT_LIMIT_REACHED": "context_limit",
                   "TIMEOUT": "time_limit", "ENV_TIMEOUT": "env_timeout"}


class _EnvRecorder:
    """Wraps ``reset`` / ``step`` / ``_step_impl`` of ONE environment instance to record the
    latest observation, info and reward, and whether the environment's own step said done
    (``BaseTaskEnv.step`` also returns done when ``max_steps`` is reached)."""

    def __init__(self, env):
        self.observation, self.info, self.reward, self.env_done = None, {}, 0.0, None
        reset, step, impl = env.reset, env.step, getattr(env, "_step_impl", None)

        def reset_(*a, **k):
            out = reset(*a, **k)
            self.observation = out[0] if isinstance(out, tuple) else out
            return out

        def step_(action):
            self.env_done = None
            obs, rew, done, info = step(action)
            self.observation, self.info, self.reward = obs, dict(info or {}), float(rew or 0.0)
            if self.env_done is None:  # no _step_impl (a BaseEnv): its done is its own
                self.env_done = bool(done)
            return obs, rew, done, info

        def impl_(action):
            result = impl(action)
            self.env_done = bool(result.done)
            return result

        env.reset, env.step = reset_, step_
        if impl is not None:
            env._step_impl = impl_


class StepCollectEngine(trajectory_collect_engine.TrajectoryCollectEngine):
    """Tunix's collector; in "Token" mode the result also holds ``bepo_turns`` (one ``Turn``
    per model call, its state from ``state_fn(messages, observation)`` taken just before
    the call) and ``bepo_ending`` (an ``Ending``).

    A reply that exhausts the response-token budget (``max_response_length``) ends the
    episode before Tunix records a Step for it, and its tokens never enter the stream. Its
    model call is still a decision: it becomes a last turn with no tokens and reward 0, and
    the episode ends "context_limit" (TRUNCATED). Without it, an episode whose first reply
    blew the budget would have no turn and drop out of its group's statistics."""

    def __init__(self, *args, state_fn: Callable[[Sequence[dict], Any], str] = conversation_state,
                 repeats: Optional[_Repeats] = None, **kwargs):
        super().__init__(*args, **kwargs)
        repeats = repeats or _Repeats()  # the learner passes its own: one count per run
        self._state_fn = state_fn
        self._bepo_states: list[str] = []
        self._bepo_cut: Optional[str] = None  # the state of a model call cut by the token budget
        self._env_rec = _EnvRecorder(self.env)
        call = self.model_call

        def model_call(*args, **kwargs):  # runs in Tunix's executor thread: the identity travels with the call
            extra = getattr(self.env, "extra_kwargs", {}) or {}
            ident = (_key_part(extra.get("group_id")), _key_part(extra.get("pair_index")),
                     len(self.agent.trajectory.steps))
            _SAMPLING.identity = ident + (repeats.next(ident),)
            try:
                return call(*args, **kwargs)
            finally:
                _SAMPLING.identity = None

        self.model_call = model_call

    async def _reset(self):
        await super()._reset()
        self._bepo_states, self._bepo_cut = [], None

    async def _one_step(self) -> bool:
        before, spent = len(self.agent.trajectory.steps), self._response_token_count
        state = self._state_fn(self.agent.chat_completions, self._env_rec.observation)
        done = await super()._one_step()
        if len(self.agent.trajectory.steps) > before:
            self._bepo_states.append(state)
        elif self._response_token_count > spent:  # the model replied, the reply exhausted the budget: no Step
            self._bepo_cut = state
        return done

    def _ending(self) -> Ending:
        status = self.agent.trajectory.status.name
        rec = self._env_rec
        if rec.env_done:  # the environment ended it on its own step: a limit Tunix records after that
            kind = "env"  # (a TIMEOUT on the final step) does not relabel a success or a failure as TRUNCATED
        elif status == "SUCCEEDED":
            kind = "step_limit"
        elif status in _STATUS_ENDINGS:
            kind = _STATUS_ENDINGS[status]
        else:
            raise RuntimeError(f"StepCollectEngine: the episode ended with Tunix status {status}, which step credit "
                               f"does not know ({tunix_compat.SUPPORTED}).")
        return Ending(kind, rec.info, rec.reward)

    async def collect(self, mode: str = "Conversation") -> Any:
        out = await super().collect(mode)
        if mode == "Token":
            steps = self.agent.trajectory.steps
            if len(steps) != len(self._bepo_states):
                raise RuntimeError(f"StepCollectEngine: the agent recorded {len(steps)} steps in "
                                   f"{len(self._bepo_states)} model calls; step credit needs one Step per model call.")
            out["bepo_turns"] = [Turn(s, float(st.reward or 0.0), _len(getattr(st, "assistant_tokens", None)),
                                      _len(getattr(st, "env_tokens", None)), _action_text(st))
                                 for s, st in zip(self._bepo_states, steps)]
            if self._bepo_cut is not None:  # the reply that exhausted the budget: a turn without tokens
                out["bepo_turns"].append(Turn(self._bepo_cut, 0.0, 0, 0, ""))
            out["bepo_ending"] = self._ending()
            out["bepo_max_steps"] = int(self.max_steps)
        return out


def _len(tokens) -> int:
    return 0 if tokens is None else len(tokens)


def _action_text(step) -> Optional[str]:
    """The text of a Tunix Step's parsed action (``Step.action``, an ``Action`` whose ``.action`` is the
    payload): a string as it is, any other payload (tool calls) as sorted-key JSON; None when the step
    recorded no action."""
    payload = getattr(getattr(step, "action", None), "action", getattr(step, "action", None))
    if payload is None or isinstance(payload, str):
        return payload
    return json.dumps(payload, sort_keys=True, default=str)


def split_groups(trajectories: Sequence[Any], num_generations: int) -> list[list[int]]:
    """Indices of each group's trajectories, in order of first appearance: by Tunix's group
    id (``item.group_id``, else the trajectory's "group_id"), else consecutive chunks of
    ``num_generations``. Refused when some trajectories have an id and others not, or when
    there are no ids and the count is not a multiple of ``num_generations``."""
    ids = []
    for item in trajectories:
        gid = getattr(item, "group_id", None)
        if gid is None and isinstance(getattr(item, "traj", None), dict):
            gid = item.traj.get("group_id")
        ids.append(gid)
    n = len(ids)
    if all(g is None for g in ids):
        if n % int(num_generations):
            raise ValueError(f"StepCreditGRPOLearner: {n} trajectories without group ids is not a multiple of "
                             f"num_generations={num_generations}; the groups cannot be told apart.")
        return [list(range(i, i + num_generations)) for i in range(0, n, num_generations)]
    if any(g is None for g in ids):
        raise ValueError("StepCreditGRPOLearner: some trajectories carry a group id and others none; the groups "
                         "cannot be told apart (give every TrajectoryItem its group_id).")
    groups: dict = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


# ----------------------------------------------------------------------------- registry

_INSIDE = threading.local()  # set while StepCreditGRPOLearner runs Tunix's own _process_results


def _outcome_estimator(name: str):
    def estimator(rewards, num_generations: int):
        r = np.asarray(rewards, np.float32).reshape(-1, int(num_generations))
        if getattr(_INSIDE, "active", False):
            # Inside StepCreditGRPOLearner Tunix's trajectory-level call only feeds its own
            # rewards/advantage metrics; the step credit replaces it: Tunix's GRPO, not ours twice.
            return function_registry.get_advantage_estimator("grpo")(rewards=r.reshape(-1),
                                                                     num_generations=num_generations)
        groups = [[[Turn("", float(x), 1, 0)] for x in row] for row in r]
        outcomes = [[SUCCESS if x > 0 else FAILURE for x in row] for row in r]
        adv, _ = credit_for_groups(groups, outcomes, name)
        return np.asarray([float(a[0]) for g in adv for a in g], np.float32)

    estimator.bepo_jax = True
    estimator.__name__ = f"bepo_jax_{name}"
    estimator.__doc__ = (f"bepo_jax's {name} on one-step trajectories (one reward per trajectory; SUCCESS when it "
                         "is positive), all groups in one call.")
    return estimator


def register_tunix_estimators() -> list[str]:
    """Register every bepo_jax estimator in Tunix's advantage registry (idempotent); returns
    the names that call bepo_jax (``bepo_jax/<name>`` always, the plain name where Tunix
    has no estimator of its own under it)."""
    names = []
    for name in ESTIMATORS:
        for key in (PREFIX + name, name):
            try:
                current = function_registry.get_advantage_estimator(key)
            except LookupError:
                current = None
            if current is None:
                function_registry.register_advantage_estimator(key)(_outcome_estimator(name))
            elif not getattr(current, "bepo_jax", False):
                continue  # Tunix's own estimator keeps its name ("grpo")
            names.append(key)
    return names


register_tunix_estimators()

# ----------------------------------------------------------------------------- config


@dataclasses.dataclass(kw_only=True)
class StepCreditConfig(agentic_grpo_learner.GRPOConfig):
    """Tunix's GRPOConfig with step credit.

    advantage_estimator: a bepo_jax estimator name ("gated_bepo" by default; "bepo_jax/<name>"
      is accepted too).   estimator_config: its config fields, e.g. {"lam": 0.25}.
    mask_zero_credit_groups: drop (mask 0) a group whose step credit is 0 on every token --
      in place of Tunix's ``degenerate_group_masking``, which is refused (module docstring, 6).
    reward_fns_turn: the turn that carries the ``reward_fns`` share of Tunix's reward:
      "first" (the assistant message the reward functions score, default) or "last".
    success_key: the key of the final step's ``info`` that says whether the environment's
      ending is a success (module docstring, 3).
    credit_device: where the estimator runs: "cpu" (the host; default), None (JAX's
      default device: the accelerator), or a platform name for ``jax.devices``.
    similarity: None (equal state strings merge) or SimilarityConfig fields, e.g.
      {"threshold": 0.9}: nearly equal states merge (docs/similarity.md).
    buckets: pad each call's batch to power-of-two shapes, with at least num_generations
      trajectories and the environment's ``max_steps`` turns (up to 64), so that after the
      first call of each group count nothing compiles; False pads to the batch's size.
    """

    advantage_estimator: str = "gated_bepo"
    estimator_config: dict = dataclasses.field(default_factory=dict)
    mask_zero_credit_groups: bool = False
    reward_fns_turn: str = "first"
    success_key: str = "success"
    credit_device: Optional[str] = "cpu"
    similarity: Optional[dict] = None
    buckets: bool = True

    def __post_init__(self):
        super().__post_init__()
        name = self.step_estimator
        if name not in ESTIMATORS:
            raise ValueError(f"StepCreditConfig.advantage_estimator={self.advantage_estimator!r} is not a bepo_jax "
                             f"estimator; valid names: {', '.join(ESTIMATORS)}.")
        if not isinstance(self.estimator_config, dict):
            raise ValueError("StepCreditConfig.estimator_config must be a dict of the estimator's config fields.")
        make_config(name, self.estimator_config)  # unknown fields raise, listing the valid ones
        if getattr(self, "degenerate_group_masking", False):
            raise ValueError("StepCreditConfig.degenerate_group_masking: Tunix masks groups whose trajectory rewards "
                             "are equal, and zeroes their sampler importance weights with them -- exactly the groups "
                             "step credit rescues. Set mask_zero_credit_groups=True instead (drops a group whose step "
                             "credit is all 0).")
        if self.reward_fns_turn not in ("first", "last"):
            raise ValueError(f"StepCreditConfig.reward_fns_turn={self.reward_fns_turn!r}; use 'first' (the reply "
                             "Tunix's reward_fns score) or 'last'.")
        if not isinstance(self.success_key, str) or not self.success_key:
            raise ValueError("StepCreditConfig.success_key must be a non-empty string (a key of the step info).")
        if self.similarity is not None:
            if not isinstance(self.similarity, dict):
                raise ValueError("StepCreditConfig.similarity must be None or a dict of SimilarityConfig fields.")
            self.similarity_config  # noqa: B018 - validates the fields

    @property
    def step_estimator(self) -> str:
        """The bepo_jax registry name."""
        a = self.advantage_estimator
        return a[len(PREFIX):] if a.startswith(PREFIX) else a

    @property
    def similarity_config(self) -> Optional[SimilarityConfig]:
        if self.similarity is None:
            return None
        try:
            return SimilarityConfig(**self.similarity)
        except TypeError as e:
            raise ValueError(f"StepCreditConfig.similarity: {e}; the fields are those of "
                             "bepo_jax.credit.similarity.SimilarityConfig.") from None


# ----------------------------------------------------------------------------- learner


@dataclasses.dataclass(frozen=True)
class GroupCredit:
    """One group's step credit, as the learner computed it (``learner.credit_log``).

    group_id: Tunix's group id (None without one).   states[k][t]: the state of turn t.
    rewards[k][t]: the rewards the estimator saw (environment's, plus the reward_fns
    share).   outcomes[k]: codes.   endings[k]: ``Ending.kind``.   advantages[k][t]: A[k, t].
    diagnostics: the estimator's (``states``, ``gated_share``, ...); empty when the group
    had fewer than two trajectories with turns.   collapsed: a multi-turn group whose turns
    all map to one state.   mode: "train" or "eval" (Tunix's mode of the batch: evaluation
    groups are logged too, marked, so diagnostics of training can leave them out)."""

    group_id: Any
    states: list
    rewards: list
    outcomes: list
    endings: list
    advantages: list
    diagnostics: dict
    collapsed: bool
    mode: str = "train"

    def table(self) -> str:
        """Per trajectory: outcome, then each turn's state (its last 32 characters), reward
        and advantage -- what a user reads to see that the credit is sane."""
        names = {SUCCESS: "SUCCESS", FAILURE: "FAILURE", TRUNCATED: "TRUNCATED"}
        d = self.diagnostics
        head = (f"group {self.group_id}: {d.get('states', float('nan')):.0f} states, gated share "
                f"{d.get('gated_share', float('nan')):.2f}" + (", ALL TURNS ONE STATE" if self.collapsed else ""))
        lines = [head]
        for k, (st, rw, a) in enumerate(zip(self.states, self.rewards, self.advantages)):
            cells = "  ".join(f"[{s[-32:]!r} r={r:+.2f} A={v:+.3f}]"
                              for s, r, v in zip(st, rw, a))
            lines.append(f"  k={k} {names.get(self.outcomes[k], self.outcomes[k])} ({self.endings[k]}): {cells}")
        return "\n".join(lines)


def _key_part(x) -> int:
    """A stable 31-bit integer for a group id or trajectory index (ints as they are, anything else by CRC32)."""
    import zlib

    if isinstance(x, (int, np.integer)) and 0 <= int(x) < 2**31:
        return int(x)
    return zlib.crc32(repr(x).encode()) & 0x7FFFFFFF


class _Repeats:
    """How many calls with one key (a model call's (group, trajectory, turn)) came before (thread-safe)."""

    def __init__(self):
        self._lock, self._seen = threading.Lock(), collections.Counter()

    def next(self, identity: tuple) -> int:
        with self._lock:
            n = self._seen[identity]
            self._seen[identity] += 1
            return n


_SAMPLING = threading.local()  # the (group, trajectory, turn, repeat) of the model call this thread is making


def fresh_sampling_seeds(rl_cluster, seed: int = 0) -> None:
    """Give every rollout call its own sampling key (idempotent).

    Tunix's "vanilla" rollout engine samples with ``RolloutConfig.seed`` -- with the default
    ``seed=None`` PRNGKey(0) -- on every call: the trajectories of a group, all started
    from one prompt, come out identical and every group-relative advantage is 0. This
    wraps that cluster's rollout object so that each call samples with its own key on a copy
    of the config it was given (calls stay concurrent; engines that draw their own
    randomness, such as vLLM, do not need it). A call made by ``StepCollectEngine`` gets
    fold_in(PRNGKey(seed), group, trajectory, turn, repeat) (repeat: how many earlier episodes
    had the same group, trajectory and turn), so a run samples the same tokens whatever
    ``max_concurrency`` and the threads' order; any other call gets fold_in(PRNGKey(seed), i)
    for the i-th such call. ``StepCreditGRPOLearner`` applies it to the vanilla engine unless
    ``sampling_seed=None``."""
    import jax

    def fresh_keys(generate):
        calls = _Repeats()  # the calls made outside a collect engine, counted

        def generate_with_fresh_key(prompts, rollout_config, *args, **kwargs):
            key = jax.random.PRNGKey(seed)
            identity = getattr(_SAMPLING, "identity", None)
            if identity is None:
                identity = (calls.next(()) + 1,)
            for part in identity:
                key = jax.random.fold_in(key, part)
            return generate(prompts, dataclasses.replace(rollout_config, seed=key), *args, **kwargs)

        return generate_with_fresh_key

    _wrap_generate(rl_cluster, "bepo_fresh_seeds", fresh_keys)


def _wrap_generate(rl_cluster, marker: str, wrapper: Callable[[Callable], Callable]) -> None:
    """Replace the cluster's ``rollout.generate`` by ``wrapper(generate)`` unless a wrapper marked
    ``marker`` is already in it (idempotent, in any order: each wrapper carries the markers of the
    ones inside it)."""
    rollout = rl_cluster.rollout
    if getattr(rollout.generate, marker, False):
        return
    wrapped = functools.wraps(rollout.generate)(wrapper(rollout.generate))
    setattr(wrapped, marker, True)
    rollout.generate = wrapped


def serial_model_calls(rl_cluster) -> None:
    """Make the cluster's rollout calls one at a time (idempotent): a lock around ``generate``.

    JAX 0.12's jit is not safe when several threads make the first call of one jitted function
    at once (a cache miss in each): Tunix's vanilla sampler does that under ``max_concurrency`` >
    1, every time a sampler meets a new shape, and the process segfaults then or at exit, or hangs
    at exit in ``jax.clear_backends`` (docs/tunix.md, "Sampling"). With the lock the episodes stay
    concurrent -- their environment steps, parsing and the collect engine's bookkeeping -- and only
    the model calls queue; on one device they shared it anyway. ``StepCreditGRPOLearner`` applies
    it to the vanilla engine unless ``serial_generate=False``; apply it after
    ``fresh_sampling_seeds`` so that the keys' own small programs run under the lock too."""
    def one_at_a_time(generate):
        lock = threading.Lock()

        def generate_one_at_a_time(*args, **kwargs):
            with lock:
                return generate(*args, **kwargs)

        return generate_one_at_a_time

    _wrap_generate(rl_cluster, "bepo_serial", one_at_a_time)


class StepCreditGRPOLearner(agentic_grpo_learner.GRPOLearner):
    """Tunix's agentic GRPO learner with bepo_jax step credit (module docstring).

    Takes the same arguments as ``GRPOLearner``; ``algo_config`` must be a
    ``StepCreditConfig``. Keywords of its own:
    state_fn(messages, observation) -> str: a turn's state (default ``conversation_state``).
    outcome_fn(trajectory) -> SUCCESS | FAILURE | TRUNCATED: the outcome of a collected
      trajectory (Tunix's "Token" dict, with ``bepo_turns`` and ``bepo_ending``); default:
      module docstring, 3.
    on_credit(GroupCredit): called for every group credited.
    sampling_seed: the base key of ``fresh_sampling_seeds``, applied to the vanilla
      rollout engine (None: leave Tunix's sampling as it is).
    serial_generate: the vanilla engine's model calls one at a time (``serial_model_calls``;
      False: as Tunix makes them, concurrently, which can crash JAX 0.12 under max_concurrency > 1).
    Refused: sequence packing (``max_seq_token_per_tpu``): Tunix 0.1.7's unpacking cuts a
    multi-turn stream at sum(mask) tokens and drops its tail (``unpad_multi_turn``)."""

    def __init__(self, *args, state_fn: Callable[[Sequence[dict], Any], str] = conversation_state,
                 outcome_fn: Optional[Callable[[dict], int]] = None,
                 on_credit: Optional[Callable[[GroupCredit], None]] = None,
                 sampling_seed: Optional[int] = 0, serial_generate: bool = True, **kwargs):
        tunix_compat.check_tunix()
        cfg = kwargs.get("algo_config", args[1] if len(args) > 1 else None)
        if not isinstance(cfg, StepCreditConfig):
            raise ValueError(f"StepCreditGRPOLearner: algo_config must be a StepCreditConfig (Tunix's GRPOConfig plus "
                             f"estimator_config), got {type(cfg).__name__}.")
        if outcome_fn is not None and not callable(outcome_fn):
            raise ValueError("StepCreditGRPOLearner: outcome_fn must be callable(trajectory) -> outcome code.")
        if not isinstance(serial_generate, bool):
            raise ValueError(f"StepCreditGRPOLearner: serial_generate must be True or False, got {serial_generate!r}.")
        self._state_fn = _check_state_fn(state_fn)
        self._sampling_repeats = _Repeats()  # sampling keys by (group, trajectory, turn, repeat): fresh_sampling_seeds
        self.buckets = BucketWatch()  # the credit programs' shapes: overflows after warm-up are counted and said
        self._outcome_fn = outcome_fn
        self._on_credit = on_credit
        self._local = threading.local()
        self._warned: set = set()
        self.credit_log: collections.deque = collections.deque(maxlen=256)
        super().__init__(*args, **kwargs)
        self.metric_fns = [self._deferred(fn) for fn in (self.metric_fns or [])]
        engine = tunix_compat.engine_of(self)
        training = engine.cluster_config.training_config
        if getattr(training, "max_seq_token_per_tpu", None) is not None:
            raise ValueError("StepCreditGRPOLearner: sequence packing (RLTrainingConfig.max_seq_token_per_tpu) is "
                             "not supported: Tunix 0.1.7 unpads each completion to sum(completion_mask) tokens, "
                             "which cuts a multi-turn stream and drops its last assistant tokens and their "
                             "advantages (bepo_jax.integrations.tunix.unpad_multi_turn is the correct cut). "
                             "Set max_seq_token_per_tpu=None.")
        if engine.cluster_config.rollout_engine == "vanilla":
            if sampling_seed is not None:
                fresh_sampling_seeds(engine, sampling_seed)
            if serial_generate:
                serial_model_calls(engine)

    @property
    def _engine(self):
        return tunix_compat.engine_of(self)

    def _build_orchestrator(self):
        orchestrator = super()._build_orchestrator()
        tunix_compat.check_orchestrator(orchestrator)
        state_fn, repeats = self._state_fn, self._sampling_repeats

        def engine(*args, **kwargs):
            return StepCollectEngine(*args, state_fn=state_fn, repeats=repeats, **kwargs)

        orchestrator.engine_cls = engine
        return orchestrator

    def _compute_rewards(self, *args, **kwargs):
        rewards = super()._compute_rewards(*args, **kwargs)
        self._local.rewards = np.asarray(rewards, np.float64)
        return rewards

    def _deferred(self, fn):
        """``fn`` (a user's metric_fn) as Tunix calls it inside ``_process_results``: the call is kept
        and made again once the step credit is known, with ``advantages`` = each sequence's mean step
        credit over its completion tokens [N] (the shape Tunix passes) and ``step_advantages`` = the
        per-token credit the loss uses [N, L] -- not Tunix's trajectory-level GRPO advantages."""

        def call(**kwargs):
            if not getattr(_INSIDE, "active", False):
                return fn(**kwargs)
            self._local.metric_calls.append((fn, kwargs))
            return {}

        return call

    def _metrics_with_step_credit(self, adv: np.ndarray, mask: np.ndarray, mode, step) -> None:
        on = (mask != 0).astype(np.float32)
        per_seq = (adv * on).sum(-1) / np.maximum(on.sum(-1), 1.0)
        for fn, kwargs in self._local.metric_calls:
            out = fn(**{**kwargs, "advantages": per_seq, "step_advantages": adv})
            self._engine.buffer_metrics_async(out, mode=mode, step=step)

    def _warn_once(self, key: str, message: str):
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def outcome(self, trajectory: dict) -> tuple[int, bool]:
        """The trajectory's outcome code, and whether it came from the reward fallback."""
        if self._outcome_fn is not None:
            code = self._outcome_fn(trajectory)
            if isinstance(code, (bool, np.bool_)) or code not in (SUCCESS, FAILURE, TRUNCATED):
                raise ValueError(f"outcome_fn returned {code!r}; return SUCCESS (0), FAILURE (1) or TRUNCATED (2) "
                                 "from bepo_jax.credit.types.")
            return int(code), False
        ending: Ending = trajectory["bepo_ending"]
        key = self.algo_config.success_key
        if ending.kind != "env" or key in ending.info:
            return outcome_of(ending.kind, bool(ending.info.get(key))), False
        self._warn_once("from_reward", f"StepCreditGRPOLearner: the environment ended an episode without "
                        f"info[{key!r}]; its outcome is SUCCESS when the final step's reward is positive. Report "
                        f"success in the step info, set StepCreditConfig.success_key, or pass outcome_fn.")
        return outcome_of("env", ending.reward > 0), True

    def step_credit(self, trajectories: List[Any], groups: Optional[List[List[int]]] = None,
                    totals: Optional[Sequence[float]] = None) -> list[GroupCredit]:
        """Every group's step credit (what ``_process_results`` lays onto the tokens).
        ``groups``: indices per group (default ``split_groups``); ``totals``: the
        trajectories' rewards as Tunix scored them (default: the environment's)."""
        cfg = self.algo_config
        if groups is None:
            groups = split_groups(trajectories, cfg.num_generations)
        turns, outcomes, endings, from_reward = [], [], [], []
        for i, item in enumerate(trajectories):
            t = item.traj.get("bepo_turns")
            if t is None or "bepo_ending" not in item.traj:
                raise RuntimeError("StepCreditGRPOLearner: a trajectory has no per-turn record ('bepo_turns'); it was "
                                   "not collected by StepCollectEngine (keep _build_orchestrator's engine).")
            t = list(t)
            if totals is not None:
                t = add_trajectory_reward(t, float(totals[i]) - float(sum(x.reward for x in t)),
                                          turn=cfg.reward_fns_turn)
            code, fallback = self.outcome(item.traj)
            turns.append(t)
            outcomes.append(code)
            endings.append(item.traj["bepo_ending"].kind)
            from_reward.append(fallback)
        # pad turns to the environment's step limit (at most 64): one shape per group count
        max_steps = min(max(int(item.traj.get("bepo_max_steps") or 2) for item in trajectories), 64)
        adv, diags = credit_for_groups([[turns[i] for i in idx] for idx in groups],
                                       [[outcomes[i] for i in idx] for idx in groups], cfg.step_estimator,
                                       cfg.estimator_config, buckets=cfg.buckets, device=cfg.credit_device,
                                       similarity=cfg.similarity_config,
                                       min_shape=(1, cfg.num_generations, max_steps), watch=self.buckets)
        for dim, (size, b) in self.buckets.last.items():
            self._warn_once(f"bucket_{dim}", f"StepCreditGRPOLearner: {dim} reached {size} (padded to {b}), larger "
                            f"than any earlier credit call, so its programs compiled again: {self.buckets.hint(dim)}. "
                            "bepo/bucket_overflows and bepo/credit_compiles count such calls.")
        out = []
        for idx, a, d in zip(groups, adv, diags):
            states = [[x.state for x in turns[i]] for i in idx]
            n_turns = sum(len(s) for s in states)
            collapsed = n_turns > len(idx) and len({s for ss in states for s in ss}) == 1
            gid = getattr(trajectories[idx[0]], "group_id", None)
            credit = GroupCredit(group_id=gid, states=states, rewards=[[x.reward for x in turns[i]] for i in idx],
                                 outcomes=[outcomes[i] for i in idx], endings=[endings[i] for i in idx],
                                 advantages=a, diagnostics={**d, "from_reward": float(np.mean(
                                     [from_reward[i] for i in idx]))}, collapsed=collapsed)
            if collapsed:
                self._warn_once("collapsed", "StepCreditGRPOLearner: every turn of a multi-turn group maps to one "
                                "state; the graph estimators see one state (check state_fn and how the agent renders "
                                "observations; bepo/collapsed counts such groups).")
            out.append(credit)
        return out

    def _process_results(self, trajectories: List[Any], mode=rl_cluster_lib.Mode.TRAIN,
                         expected_step: Optional[int] = None):
        groups = split_groups(trajectories, self.algo_config.num_generations)
        self._local.rewards = None
        self._local.metric_calls = []
        _INSIDE.active = True
        try:
            examples = super()._process_results(trajectories, mode=mode, expected_step=expected_step)
        finally:
            _INSIDE.active = False
        if len(examples) != 1:
            raise RuntimeError(f"StepCreditGRPOLearner: Tunix built {len(examples)} TrainExamples for one call; "
                               f"this integration expects one ({tunix_compat.SUPPORTED}).")
        ex = examples[0]
        totals = self._local.rewards
        reward_fns = getattr(getattr(self, "reward_manager", None), "reward_fns", None)
        if totals is None and reward_fns:  # Tunix did not score this batch with reward_fns: say so, count it
            self._warn_once("reward_fns_unscored", "StepCreditGRPOLearner: Tunix built this batch without calling "
                            "_compute_rewards, so the reward_fns share of the reward is not in the step credit (the "
                            "environment's rewards alone are); bepo/reward_fns_unscored counts such batches.")
        self._engine.buffer_metrics_async({"bepo/reward_fns_unscored": (float(totals is None and bool(reward_fns)),
                                                                        np.mean)}, mode=mode, step=expected_step)
        before = self.buckets.compiles_after_warmup
        credits = self.step_credit(trajectories, groups, None if totals is None else list(totals))
        self._engine.buffer_metrics_async({
            "bepo/bucket_overflows": (float(len(self.buckets.last)), np.mean),
            "bepo/credit_compiles": (float(self.buckets.compiles_after_warmup - before), np.mean)},
            mode=mode, step=expected_step)
        mask = np.asarray(ex.completion_mask)
        adv = np.zeros(mask.shape, np.float32)
        keep = np.ones(mask.shape[0], bool)
        engine = self._engine
        for idx, credit in zip(groups, credits):
            rows = np.asarray(idx)
            adv[rows] = token_advantages([trajectories[i].traj["bepo_turns"] for i in idx], credit.advantages,
                                         mask[rows])
            if self.algo_config.mask_zero_credit_groups and not adv[rows].any():
                keep[rows] = False
            engine.buffer_metrics_async(_group_metrics(credit, adv[rows], mask[rows]), mode=mode, step=expected_step)
            credit = dataclasses.replace(credit, mode=str(getattr(mode, "name", mode)).lower())
            self.credit_log.append(credit)
            if self._on_credit is not None:
                self._on_credit(credit)
        self._metrics_with_step_credit(adv, mask, mode, expected_step)
        updates = {"advantages": jnp.asarray(adv)}
        if not keep.all():
            updates["completion_mask"] = jnp.asarray(mask * keep[:, None].astype(mask.dtype))
            weights = getattr(ex, "sampler_is_weights", None)
            if weights is not None:
                updates["sampler_is_weights"] = jnp.asarray(np.asarray(weights) * keep[:, None])
        return [dataclasses.replace(ex, **updates)]


def _group_metrics(credit: GroupCredit, adv: np.ndarray, mask: np.ndarray) -> dict:
    on = mask != 0
    vals = adv[on] if on.any() else np.zeros(1, np.float32)
    n_turns = sum(len(s) for s in credit.states)
    T = max((len(a) for a in credit.advantages), default=0)
    spread = [np.std([a[t] for a in credit.advantages if len(a) > t]) for t in range(T)]
    codes = np.asarray(credit.outcomes)
    d = credit.diagnostics
    metrics = {f"bepo/{k}": (v, np.mean) for k, v in d.items() if k != "from_reward"}
    metrics.update({
        "bepo/states_per_turn": (d["states"] / max(n_turns, 1) if "states" in d else 0.0, np.mean),
        "bepo/collapsed": (float(credit.collapsed), np.mean),
        "bepo/advantage/abs_mean": (float(np.abs(vals).mean()), np.mean),
        "bepo/advantage/max": (float(vals.max()), np.max),
        "bepo/advantage/min": (float(vals.min()), np.min),
        "bepo/advantage/turn_spread": (float(np.mean(spread)) if spread else 0.0, np.mean),
        "bepo/outcome/success": (float(np.mean(codes == SUCCESS)), np.mean),
        "bepo/outcome/failure": (float(np.mean(codes == FAILURE)), np.mean),
        "bepo/outcome/truncated": (float(np.mean(codes == TRUNCATED)), np.mean),
        "bepo/outcome/from_reward": (d["from_reward"], np.mean),
    })
    return metrics


def unpad_multi_turn(example) -> list[dict]:
    """Tunix's ``utils.unpad_train_example`` for multi-turn streams, cut at the last
    masked-in token instead of at ``sum(completion_mask)`` tokens (Tunix 0.1.7's cut, which
    drops a multi-turn stream's last assistant tokens while sequence packing is on). Not
    installed anywhere (the learner refuses packing rather than patch Tunix process-wide);
    for a packing loop of one's own."""
    from tunix.rl import utils as rl_utils

    c_mask = np.asarray(example.completion_mask)
    items = rl_utils.unpad_train_example(example.replace(completion_mask=np.ones_like(c_mask)))
    for i, item in enumerate(items):
        on = np.flatnonzero(c_mask[i])
        n = int(on[-1]) + 1 if on.size else 0
        for k in _PER_TOKEN:
            if item.get(k) is not None and (k != "advantages" or item.get("adv_is_per_token")):
                item[k] = item[k][:n]
        item["completion_mask"] = c_mask[i, :n]
    return items


_PER_TOKEN = ("completion_ids", "advantages", "ref_per_token_logps", "old_per_token_logps", "returns", "old_values")

__all__ = ["StepCreditConfig", "StepCreditGRPOLearner", "StepCollectEngine", "GroupCredit", "Ending",
           "register_tunix_estimators", "conversation_state", "split_groups", "fresh_sampling_seeds",
           "serial_model_calls",
           "unpad_multi_turn", "Turn"]
