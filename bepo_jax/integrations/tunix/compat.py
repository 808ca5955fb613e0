"""Every place where bepo_jax.integrations.tunix touches Tunix's internals, checked at once.

The adapter overrides or reads these (google-tunix 0.1.7, the version it is tested with;
Tunix's main branch renames the learner's ``rl_cluster`` to ``rl_engine``, accepted too):

* ``agentic_grpo_learner.GRPOLearner._process_results`` (overridden: step credit replaces
  the trajectory-level advantages of the TrainExample Tunix builds),
  ``._build_orchestrator`` (its orchestrator's ``engine_cls`` becomes ``StepCollectEngine``),
  ``._compute_rewards`` (read: the rewards Tunix scored, environment total + ``reward_fns``);
* ``TrajectoryCollectEngine._one_step`` / ``._reset`` / ``.collect`` (extended: the state
  before each model call, the environment's own ending) and the engine's ``agent`` / ``env``;
* ``BaseTaskEnv._step_impl`` of the episode's environment instance (wrapped on that
  instance only: whether the environment itself ended the episode or its step limit did);
* the learner's engine (``rl_engine`` or ``rl_cluster``): ``buffer_metrics_async``,
  ``cluster_config``, ``rollout`` (``fresh_sampling_seeds`` and ``serial_model_calls`` wrap
  that one rollout object's ``generate``).

Nothing is patched process-wide. ``check_tunix()`` runs when a learner is built and
raises a ``TunixVersionError`` naming what is missing and the supported versions, so a
Tunix that moved these fails at construction, never with an AttributeError mid-training.
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED = "google-tunix 0.1.7 (tested); its main branch's rl_engine rename is accepted"

_CLASS_MEMBERS = {
    "tunix.rl.agentic.agentic_grpo_learner.GRPOLearner": ("_process_results", "_build_orchestrator",
                                                          "_compute_rewards", "train"),
    "tunix.rl.agentic.trajectory.trajectory_collect_engine.TrajectoryCollectEngine": ("_one_step", "_reset",
                                                                                      "collect"),
    "tunix.rl.agentic.environments.base_environment.BaseTaskEnv": ("_step_impl", "step", "reset"),
}
_ENGINE_MEMBERS = ("buffer_metrics_async", "cluster_config", "rollout")


class TunixVersionError(RuntimeError):
    """This Tunix lacks a piece the adapter relies on."""


def tunix_version() -> str:
    try:
        return metadata.version("google-tunix")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source checkout
        return "unknown"


def _fail(what: str):
    raise TunixVersionError(f"bepo_jax.integrations.tunix supports {SUPPORTED}; the installed google-tunix "
                            f"{tunix_version()} lacks {what}. Install google-tunix==0.1.7 "
                            "(pip install 'bepo-jax[tunix]') or report the new Tunix version.")


def check_tunix() -> None:
    """Raise ``TunixVersionError`` if a class member the adapter overrides or calls is gone."""
    import importlib

    for path, members in _CLASS_MEMBERS.items():
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name, None)
        if cls is None:
            _fail(path)
        missing = [m for m in members if not hasattr(cls, m)]
        if missing:
            _fail(f"{path}.{', '.join(missing)}")


def engine_of(learner):
    """The learner's RL engine: ``rl_engine`` (Tunix main) or ``rl_cluster`` (0.1.7), checked."""
    engine = getattr(learner, "rl_engine", None) or getattr(learner, "rl_cluster", None)
    if engine is None:
        _fail("the learner's rl_cluster / rl_engine attribute")
    missing = [m for m in _ENGINE_MEMBERS if not hasattr(engine, m)]
    if missing:
        _fail(f"RLCluster.{', '.join(missing)}")
    return engine


def check_orchestrator(orchestrator) -> None:
    if not hasattr(orchestrator, "engine_cls"):
        _fail("RolloutOrchestrator.engine_cls")


def loss_value(out):
    """The scalar loss of a Tunix policy-loss function's result: 0.1.7 returns (loss, aux); its main
    branch returns a ``LossOutput`` whose ``primary_loss`` is a ``WeightedMetric`` (``compute()``
    gives the loss) or an array."""
    primary = getattr(out, "primary_loss", None)
    if primary is None:
        return out[0]
    return primary.compute() if hasattr(primary, "compute") else primary
