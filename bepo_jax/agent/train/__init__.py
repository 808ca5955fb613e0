"""The run code: train a token policy with an estimator's credit in an environment.

Modules, each importing only the ones listed before it:

    parts      the config's six frozen parts (EnvPart, PolicyPart, RolloutPart, CreditPart, OptimPart,
               SchedulePart; RunParts): what each piece of a run receives
    config     RunConfig (config.json, the flat spelling; RunConfig.parts), EVAL_SEED_OFFSET
    init_from  a run's first parameters from another run directory (RunConfig.init_from)
    report     intervals (mean_ci, paired_change, paired_combination), trailing means, iterations_to, run_summary
    pieces     the run's pieces, each built from its part: tasks, rollout config, policy, trainer config, credit
    plots      draw_curve / plot_curve (one run), plot_comparison (estimators x seeds)
    setup      Setup: environment, policy, trainer; the iteration as pure functions; evaluation
    llm_setup  LLMSetup: the same for a pretrained chat model (chat rollouts, LoRA / top blocks)
    multiseed  SeedBatch: S seeds vmapped into one program (run axis, shardable)
    rundir     the run directory: config.json, metrics.jsonl, TensorBoard, summary.json
    loop       train (one run), train_seeds (seeds as one program), load_run
    compare    compare: estimators x seeds, one table and one plot
    sft        sft: a supervised warm start (demonstrations replayed, maximum likelihood), a run directory

``bepo-jax train`` runs ``train``; ``bepo-jax compare`` runs ``compare``.
"""

from .config import EVAL_SEED_OFFSET, RunConfig
from .parts import CreditPart, EnvPart, OptimPart, PolicyPart, RolloutPart, RunParts, SchedulePart
from .loop import load_run, train, train_seeds
from .multiseed import SeedBatch
from .plots import draw_curve, plot_comparison, plot_curve
from .report import iterations_to, mean_ci, paired_change, paired_combination, run_summary, trailing_mean
from .rundir import is_finished, read_metrics
from .setup import Setup

__all__ = ["EVAL_SEED_OFFSET", "RunConfig", "RunParts", "EnvPart", "PolicyPart", "RolloutPart", "CreditPart",
           "OptimPart", "SchedulePart", "Setup", "SeedBatch", "train", "train_seeds", "load_run", "compare",
           "draw_curve", "plot_curve", "plot_comparison", "mean_ci", "paired_change", "paired_combination",
           "trailing_mean", "iterations_to", "run_summary", "read_metrics", "is_finished"]


def __getattr__(name):  # compare imports loop; loaded on first use
    if name == "compare":
        from .compare import compare

        return compare
    raise AttributeError(name)
