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
listed and checked in ``compat``.

The package's modules: ``engine`` (the turns: ``StepCollectEngine``, ``conversation_state``,
``Ending``), ``credit`` (``split_groups``, ``GroupCredit``, the per-group metrics), ``estimators``
(Tunix's advantage registry), ``config`` (``StepCreditConfig``), ``learner``
(``StepCreditGRPOLearner``, ``unpad_multi_turn``), ``sampling`` (``fresh_sampling_seeds``,
``serial_model_calls``), ``compat`` (every touch of Tunix's internals, checked) and ``models``
(a pretrained checkpoint in Tunix's own model classes: ``to_tunix``, docs/tunix.md).
"""

from __future__ import annotations

try:
    import tunix  # noqa: F401
    from tunix.rl.agentic import agentic_grpo_learner  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("bepo_jax.integrations.tunix needs google-tunix: pip install 'bepo-jax[tunix]' "
                      "(Python 3.12 with current JAX; see docs/tunix.md).") from e

from ..turns import Turn
from .config import StepCreditConfig
from .credit import GroupCredit, split_groups
from .engine import Ending, StepCollectEngine, conversation_state
from .estimators import PREFIX, register_tunix_estimators
from .learner import StepCreditGRPOLearner, unpad_multi_turn
from .sampling import fresh_sampling_seeds, serial_model_calls

__all__ = ["StepCreditConfig", "StepCreditGRPOLearner", "StepCollectEngine", "GroupCredit", "Ending", "PREFIX",
           "register_tunix_estimators", "conversation_state", "split_groups", "fresh_sampling_seeds",
           "serial_model_calls", "unpad_multi_turn", "Turn"]
