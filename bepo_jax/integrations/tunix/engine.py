"""The turns of a Tunix episode: ``StepCollectEngine`` records, for every model call, the state the model
acted on (``state_fn(messages, observation)``; default ``conversation_state``), the step reward, the
assistant and environment token counts, and how the episode really ended (``Ending``)."""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, Callable, Optional, Sequence

from tunix.rl.agentic.trajectory import trajectory_collect_engine

from ..turns import Turn
from . import compat as tunix_compat
from .sampling import _SAMPLING, _key_part, _Repeats


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
