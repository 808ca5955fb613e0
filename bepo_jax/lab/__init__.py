"""The credit-quality lab: exact advantages on enumerated models, and every estimator
measured against them (docs/credit-lab.md).

    model = enumerate_states(env, task, horizon)      # TabularModel
    ev = evaluate(model, probs, gamma=1.0)           # .V [H+1, S], .Q/.A [H, S, A], .gradient
    report = credit_quality([model], [probs], ESTIMATOR_SUITE, group_size=8)
"""

from .diagnostic import DIAGNOSTIC_ENVS, GraphWorld, make_diagnostic
from .exact import Evaluation, boltzmann_policy, evaluate, occupancy, optimal_q, softmax_policy, uniform_policy
from .model import TabularModel, enumerate_states, obs_keys

__all__ = ["TabularModel", "enumerate_states", "obs_keys", "Evaluation", "evaluate", "occupancy", "optimal_q",
           "softmax_policy", "uniform_policy", "boltzmann_policy", "GraphWorld", "DIAGNOSTIC_ENVS",
           "make_diagnostic"]
