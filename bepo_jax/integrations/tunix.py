"""Step-level credit in Tunix's agentic GRPO learner (``pip install 'bepo-jax[tunix]'``, Python 3.12).

Tunix's agentic learner collects multi-turn trajectories with real models, but hands its
advantage estimators one reward per trajectory. This module gives it every bepo_jax
estimator at the step level:

* ``StepCreditGRPOLearner`` -- Tunix's ``GRPOLearner`` with ``StepCreditConfig``
  (its ``GRPOConfig`` plus ``estimator_config``); ``advantage_estimator`` names any
  bepo_jax estimator ("gated_bepo", "gigpo", "hgpo", ...). Per group of
  ``num_generations`` trajectories it records every turn (the observation the model acted
  on, the environment's step reward, how many assistant and environment tokens the turn
  added), builds a StepBatch (equal observation strings = one state of the empirical
  graph), runs the estimator and lays A[k, t] on turn t's assistant tokens: the policy
  loss receives per-token advantages [G, L] (environment tokens and padding 0).
  Rewards: a turn's reward is the environment's; the trajectory's total as Tunix's
  ``reward_fns`` scored it minus the sum of its turn rewards is added to its last turn
  (zero when the reward functions return the environment's total). Outcomes: SUCCESS when
  the environment ended the episode with a positive total, FAILURE when it ended it
  otherwise, TRUNCATED for step/context limits and timeouts.
  Metrics (Tunix's metrics logger, per group): ``bepo/states``, ``bepo/gated_share``,
  ``bepo/converged``, ``bepo/iterations``, ``bepo/advantage/abs_mean``, ``/max``,
  ``/min``. Tunix's own ``rewards/advantage/*`` metrics stay those of the trajectory-level
  call below. With ``degenerate_group_masking`` a group is dropped when all of its
  per-token advantages are 0 (not when its trajectory rewards are equal: step credit can
  be non-zero there).
* ``register_tunix_estimators()`` -- every bepo_jax estimator in Tunix's advantage
  registry as ``"bepo_jax/<name>"`` (and under its plain name where Tunix has none:
  every name but "grpo"). Tunix calls these with one reward per trajectory, so each
  trajectory is one step from one shared state: the outcome credit of the estimator.
  Importing this module registers them.
* ``StepCollectEngine`` -- Tunix's trajectory collector that also records the turns.
* ``fresh_sampling_seeds(cluster)`` -- one sampling key per rollout call (Tunix's vanilla
  engine samples every call with PRNGKey(0) when ``RolloutConfig.seed`` is None, which
  makes a group's trajectories identical).
* ``unpad_multi_turn`` -- what the learner's ``train`` unpads with while sequence packing
  is on (Tunix 0.1.7 cuts multi-turn completions at ``sum(mask)`` tokens).

The learner calls Tunix's own ``_process_results`` (padding, log-probabilities, reference
model, rewards, metrics) and replaces only the advantages (and, with degenerate-group
masking, the mask) of the TrainExample it builds.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

try:
    import jax.numpy as jnp
    from tunix.rl import function_registry
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl import utils as rl_utils
    from tunix.rl.agentic import agentic_grpo_learner
    from tunix.rl.agentic import utils as agentic_utils
    from tunix.rl.agentic.trajectory import trajectory_collect_engine
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("bepo_jax.integrations.tunix needs google-tunix: pip install 'bepo-jax[tunix]' "
                      "(Python 3.12 with current JAX; see the README's 'Real LLMs with Tunix').") from e

from ..estimators.registry import ESTIMATORS, make_config
from .turns import Turn, group_step_advantages, outcome_code, token_advantages

PREFIX = "bepo_jax/"


def last_user_message(messages: Sequence[dict]) -> str:
    """The state a turn acts on: the content of the conversation's last user message
    (the environment's latest observation as the agent rendered it)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            c = m.get("content", "")
            return c if isinstance(c, str) else str(c)
    return ""


def _len(tokens) -> int:
    return 0 if tokens is None else len(tokens)


class StepCollectEngine(trajectory_collect_engine.TrajectoryCollectEngine):
    """Tunix's collector; in "Token" mode the result also holds ``bepo_turns``: one
    ``Turn`` per step, with ``state_fn(agent.chat_completions)`` taken just before the
    model is called for that step."""

    def __init__(self, *args, state_fn: Callable[[Sequence[dict]], str] = last_user_message, **kwargs):
        super().__init__(*args, **kwargs)
        self._state_fn = state_fn
        self._bepo_states: list[str] = []

    async def _reset(self):
        await super()._reset()
        self._bepo_states = []

    async def _one_step(self) -> bool:
        before = len(self.agent.trajectory.steps)
        state = self._state_fn(self.agent.chat_completions)
        done = await super()._one_step()
        if len(self.agent.trajectory.steps) > before:
            self._bepo_states.append(state)
        return done

    async def collect(self, mode: str = "Conversation") -> Any:
        out = await super().collect(mode)
        if mode == "Token":
            steps = self.agent.trajectory.steps
            if len(steps) != len(self._bepo_states):
                raise RuntimeError(f"StepCollectEngine: the agent recorded {len(steps)} steps in "
                                   f"{len(self._bepo_states)} model calls; step credit needs one Step per model call.")
            out["bepo_turns"] = [Turn(s, float(st.reward or 0.0), _len(getattr(st, "assistant_tokens", None)),
                                      _len(getattr(st, "env_tokens", None)))
                                 for s, st in zip(self._bepo_states, steps)]
        return out


def _outcome_estimator(name: str):
    def estimator(rewards, num_generations: int):
        r = np.asarray(rewards, np.float32).reshape(-1, int(num_generations))
        out = []
        for group in r:
            turns = [[Turn("", float(x), 1, 0)] for x in group]
            adv, _ = group_step_advantages(turns, [outcome_code(True, float(x)) for x in group], name)
            out.extend(float(a[0]) for a in adv)
        return np.asarray(out, np.float32)

    estimator.bepo_jax = True
    estimator.__name__ = f"bepo_jax_{name}"
    estimator.__doc__ = f"bepo_jax's {name} on one-step trajectories (one reward per trajectory)."
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


@dataclasses.dataclass(kw_only=True)
class StepCreditConfig(agentic_grpo_learner.GRPOConfig):
    """Tunix's GRPOConfig with step credit: ``advantage_estimator`` is a bepo_jax estimator
    name ("gated_bepo" by default; "bepo_jax/<name>" is accepted too), ``estimator_config``
    its config fields (e.g. {"lam": 0.25})."""

    advantage_estimator: str = "gated_bepo"
    estimator_config: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()
        name = self.step_estimator
        if name not in ESTIMATORS:
            raise ValueError(f"StepCreditConfig.advantage_estimator={self.advantage_estimator!r} is not a bepo_jax "
                             f"estimator; valid names: {', '.join(ESTIMATORS)}.")
        if not isinstance(self.estimator_config, dict):
            raise ValueError("StepCreditConfig.estimator_config must be a dict of the estimator's config fields.")
        make_config(name, self.estimator_config)  # unknown fields raise, listing the valid ones

    @property
    def step_estimator(self) -> str:
        """The bepo_jax registry name."""
        a = self.advantage_estimator
        return a[len(PREFIX):] if a.startswith(PREFIX) else a


def unpad_multi_turn(example) -> list[dict]:
    """Tunix's ``utils.unpad_train_example`` for multi-turn streams.

    Tunix (0.1.7) cuts each completion at ``sum(completion_mask)`` tokens before packing
    sequences (``max_seq_token_per_tpu``); with environment tokens in the middle of a
    multi-turn stream (mask 0) that drops the stream's last assistant tokens and their
    advantages. This cuts at the last masked-in token instead (the same cut for
    single-turn masks, which are a prefix of ones). ``StepCreditGRPOLearner.train`` uses
    it while sequence packing is on."""
    c_mask = np.asarray(example.completion_mask)
    items = _TUNIX_UNPAD(example.replace(completion_mask=np.ones_like(c_mask)))
    for i, item in enumerate(items):
        on = np.flatnonzero(c_mask[i])
        n = int(on[-1]) + 1 if on.size else 0
        for k in _PER_TOKEN:
            if item.get(k) is not None and (k != "advantages" or item.get("adv_is_per_token")):
                item[k] = item[k][:n]
        item["completion_mask"] = c_mask[i, :n]
    return items


_PER_TOKEN = ("completion_ids", "advantages", "ref_per_token_logps", "old_per_token_logps", "returns", "old_values")
_TUNIX_UNPAD = rl_utils.unpad_train_example


def fresh_sampling_seeds(rl_cluster, seed: int = 0) -> None:
    """Give every rollout call its own sampling key.

    Tunix's "vanilla" rollout engine samples with ``RolloutConfig.seed``, and with
    ``seed=None`` with PRNGKey(0) on every call: the trajectories of a group, all started
    from one prompt, come out identical and every group-relative advantage is 0. This
    wraps the cluster's rollout so that call i samples with fold_in(PRNGKey(seed), i) on
    a copy of the config it was given (calls stay concurrent; engines that draw their own
    randomness, such as vLLM, do not need it)."""
    import jax

    rollout = rl_cluster.rollout
    generate = rollout.generate
    lock = threading.Lock()
    count = [0]

    def generate_with_fresh_key(prompts, rollout_config, *args, **kwargs):
        with lock:
            count[0] += 1
            i = count[0]
        config = dataclasses.replace(rollout_config, seed=jax.random.fold_in(jax.random.PRNGKey(seed), i))
        return generate(prompts, config, *args, **kwargs)

    rollout.generate = generate_with_fresh_key


class StepCreditGRPOLearner(agentic_grpo_learner.GRPOLearner):
    """Tunix's agentic GRPO learner with bepo_jax step credit (module docstring).

    Takes the same arguments as ``GRPOLearner``; ``algo_config`` must be a
    ``StepCreditConfig``. ``state_fn(messages) -> str`` chooses a turn's state from the
    conversation so far (default: the last user message)."""

    def __init__(self, *args, state_fn: Callable[[Sequence[dict]], str] = last_user_message, **kwargs):
        cfg = kwargs.get("algo_config", args[1] if len(args) > 1 else None)
        if not isinstance(cfg, StepCreditConfig):
            raise ValueError(f"StepCreditGRPOLearner: algo_config must be a StepCreditConfig (Tunix's GRPOConfig plus "
                             f"estimator_config), got {type(cfg).__name__}.")
        self._state_fn = state_fn
        self._local = threading.local()
        super().__init__(*args, **kwargs)

    def _build_orchestrator(self):
        orchestrator = super()._build_orchestrator()
        state_fn = self._state_fn

        def engine(*args, **kwargs):
            return StepCollectEngine(*args, state_fn=state_fn, **kwargs)

        orchestrator.engine_cls = engine
        return orchestrator

    def train(self, *args, **kwargs):
        """Tunix's ``train``; with sequence packing on, completions are unpadded by
        ``unpad_multi_turn`` (Tunix's own cut drops multi-turn tails)."""
        if self.rl_cluster.cluster_config.training_config.max_seq_token_per_tpu is None:
            return super().train(*args, **kwargs)
        rl_utils.unpad_train_example = unpad_multi_turn
        try:
            return super().train(*args, **kwargs)
        finally:
            rl_utils.unpad_train_example = _TUNIX_UNPAD

    def _compute_rewards(self, *args, **kwargs):
        rewards = super()._compute_rewards(*args, **kwargs)
        self._local.rewards = np.asarray(rewards, np.float64)
        return rewards

    def step_credit(self, trajectories: List[Any], totals: Optional[Sequence[float]] = None
                    ) -> tuple[list[list[Turn]], list[np.ndarray], dict]:
        """The group's turns, per-turn advantages and diagnostics (what ``_process_results``
        lays onto the tokens). ``totals``: the trajectories' rewards as scored by the
        reward functions (default: each trajectory's environment total)."""
        turns, ended = [], []
        for item in trajectories:
            t = item.traj.get("bepo_turns")
            if t is None:
                raise RuntimeError("StepCreditGRPOLearner: a trajectory has no per-turn record ('bepo_turns'); it was "
                                   "not collected by StepCollectEngine (keep _build_orchestrator's engine).")
            turns.append(list(t))
            ended.append(item.traj.get("status") == "SUCCEEDED")
        if totals is None:
            totals = [float(sum(x.reward for x in t)) for t in turns]
        outcomes = [outcome_code(e, float(r)) for e, r in zip(ended, totals)]
        cfg = self.algo_config
        adv, diag = group_step_advantages(turns, outcomes, cfg.step_estimator, cfg.estimator_config, totals=totals)
        return turns, adv, diag

    def _process_results(self, trajectories: List[Any], mode=rl_cluster_lib.Mode.TRAIN,
                         expected_step: Optional[int] = None):
        self._local.rewards = None
        examples = super()._process_results(trajectories, mode=mode, expected_step=expected_step)
        if len(examples) != 1:
            raise RuntimeError(f"StepCreditGRPOLearner: Tunix built {len(examples)} TrainExamples for one group; "
                               "this version of the integration expects one (google-tunix 0.1.7).")
        ex = examples[0]
        totals = self._local.rewards
        turns, step_adv, diag = self.step_credit(trajectories, None if totals is None else list(totals))
        L = ex.completion_ids.shape[-1]
        mask = np.stack([agentic_utils.right_pad(item.traj.get("conversation_masks"), L, 0)[:L]
                         for item in trajectories])
        adv = token_advantages(turns, step_adv, mask)
        completion_mask = ex.completion_mask
        if self.algo_config.degenerate_group_masking:
            completion_mask = jnp.asarray(mask if np.any(adv != 0) else np.zeros_like(mask))
        on = mask != 0
        vals = adv[on] if on.any() else np.zeros(1, np.float32)
        metrics = {f"bepo/{k}": (v, np.mean) for k, v in diag.items()}
        metrics.update({"bepo/advantage/abs_mean": (float(np.abs(vals).mean()), np.mean),
                        "bepo/advantage/max": (float(vals.max()), np.max),
                        "bepo/advantage/min": (float(vals.min()), np.min)})
        self.rl_cluster.buffer_metrics_async(metrics, mode=mode, step=expected_step)
        return [dataclasses.replace(ex, advantages=jnp.asarray(adv), completion_mask=completion_mask)]


__all__ = ["StepCreditConfig", "StepCreditGRPOLearner", "StepCollectEngine", "register_tunix_estimators",
           "last_user_message", "Turn"]
