"""``StepCreditGRPOLearner``: Tunix's agentic GRPO learner with bepo_jax step credit (the package's
docstring has the whole contract)."""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Any, Callable, List, Optional, Sequence

import jax.numpy as jnp
import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.agentic import agentic_grpo_learner

from ...credit.types import FAILURE, SUCCESS, TRUNCATED
from ..turns import BucketWatch, add_trajectory_reward, credit_for_groups, outcome_of, token_advantages
from . import compat as tunix_compat
from .config import StepCreditConfig
from .credit import GroupCredit, _group_metrics, split_groups
from .engine import Ending, StepCollectEngine, _check_state_fn, conversation_state
from .estimators import _INSIDE
from .sampling import _Repeats, fresh_sampling_seeds, serial_model_calls

log = logging.getLogger(__name__)


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
