"""The credit-quality lab: exact advantages on enumerated models, and every estimator
measured against them (docs/credit-lab.md).

    model = enumerate_states(env, task, horizon)      # TabularModel
    ev = evaluate(model, probs, gamma=1.0)           # .V [H+1, S], .Q/.A [H, S, A], .gradient
    report = credit_quality([model], [probs], DEFAULT_SUITE, LabConfig(group_size=8))
"""

from ..agent.envs.diagnostic import DIAGNOSTIC_ENVS, GraphWorld, make_diagnostic
from .exact import Evaluation, boltzmann_policy, evaluate, occupancy, optimal_q, softmax_policy, uniform_policy
from .model import TabularModel, enumerate_states, obs_keys
from .quality import DEFAULT_SUITE, EstimatorSpec, LabConfig, credit_quality, parse_spec, spec
from .sample import Sampled, group_trajectories, sample_groups
from .token_policy import token_policy_probs

__all__ = ["TabularModel", "enumerate_states", "obs_keys", "Evaluation", "evaluate", "occupancy", "optimal_q",
           "softmax_policy", "uniform_policy", "boltzmann_policy", "GraphWorld", "DIAGNOSTIC_ENVS",
           "make_diagnostic", "credit_quality", "LabConfig", "EstimatorSpec", "spec", "parse_spec", "DEFAULT_SUITE",
           "sample_groups", "Sampled", "group_trajectories", "token_policy_probs"]
