"""``StepCreditConfig``: Tunix's GRPOConfig with step credit."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tunix.rl.agentic import agentic_grpo_learner

from ...credit.estimators.registry import ESTIMATORS, make_config
from ...credit.similarity import SimilarityConfig
from .estimators import PREFIX


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
