"""Every bepo_jax estimator in Tunix's advantage registry (``register_tunix_estimators``), for Tunix's
single-reward learners: each trajectory is one step from one shared state."""

from __future__ import annotations

import threading

import numpy as np
from tunix.rl import function_registry

from ...credit.estimators.registry import ESTIMATORS
from ...credit.types import FAILURE, SUCCESS
from ..turns import Turn, credit_for_groups

PREFIX = "bepo_jax/"

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
