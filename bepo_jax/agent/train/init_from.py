"""``RunConfig.init_from``: a run's first parameters from another run directory (a warm start).

The newest checkpoint's parameters of the run directory ``init_from`` (``bepo-jax sft``'s warm start, or
any run of the same policy and environment) replace the fresh ones; the optimizer state, step and RNG stay
fresh. The source's ``ARCHITECTURE`` fields must equal the run's (the parameters' shapes and the prompts they
were trained on); otherwise a ValueError names the fields.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..rl.checkpoint import Checkpointer
from ..rl.train_step import Trainer, TrainState
from .config import RunConfig

ARCHITECTURE = ("env", "layers", "width", "heads", "prompt_history", "max_steps", "boxes", "rooms", "objects",
                "quest_length")  # what fixes the parameters' shapes and the prompts they were trained on


def source_run(cfg: RunConfig) -> tuple[Path, RunConfig]:
    """The run directory ``cfg.init_from`` names and its stored config, whose ``ARCHITECTURE``
    fields must equal ``cfg``'s (a ValueError names the fields, or says it is not a run directory)."""
    src = Path(cfg.init_from)
    run = src.parent if src.name == "checkpoints" else src
    cfg_path = run / "config.json"
    if not cfg_path.exists():
        raise ValueError(f"RunConfig.init_from={cfg.init_from!r} is not a run directory (no config.json in {run}); "
                         "give the --out of a `bepo-jax sft` or `bepo-jax train` run.")
    stored = RunConfig.from_stored(json.loads(cfg_path.read_text()))
    diff = [f for f in ARCHITECTURE if getattr(stored, f) != getattr(cfg, f)]
    if diff:
        raise ValueError(f"RunConfig.init_from={cfg.init_from!r}: that run's {diff} differ from this run's "
                         f"({', '.join(f'{f}={getattr(stored, f)!r} there, {getattr(cfg, f)!r} here' for f in diff)}); "
                         "its parameters do not fit this policy. Train the warm start with the same settings.")
    return run, stored


def load_initial_params(cfg: RunConfig, trainer: Trainer, state: TrainState) -> TrainState:
    """``state`` with its parameters from ``cfg.init_from`` (a run directory or its checkpoints/):
    the newest checkpoint's parameters; the optimizer state, step and RNG stay fresh. The source's
    architecture and environment must equal ``cfg``'s (``ARCHITECTURE``)."""
    run, stored = source_run(cfg)
    ckpt = Checkpointer(run / "checkpoints", max_to_keep=stored.keep_checkpoints)
    try:
        loaded, _, _ = ckpt.restore_latest(trainer.abstract_state())
    finally:
        ckpt.close()
    return state._replace(params=loaded.params)


def trained_configs(cfg: RunConfig) -> list[RunConfig]:
    """``cfg`` and every run it starts from (``init_from``, followed back): the configs whose
    training pools (a warm start's demonstration levels among them) its held-out tasks must avoid."""
    out, seen = [cfg], set()
    while out[-1].init_from:
        run, stored = source_run(out[-1])
        if run.resolve() in seen:
            raise ValueError(f"RunConfig.init_from={out[-1].init_from!r}: the chain of warm starts loops back to {run}.")
        seen.add(run.resolve())
        out.append(stored)
    return out


def earlier_env_parts(cfg: RunConfig) -> list:
    """The env parts (``train.parts.EnvPart``) of every run ``cfg`` starts from (``trained_configs``
    after ``cfg`` itself): their training pools are kept out of ``cfg``'s held-out tasks."""
    return [c.parts.env for c in trained_configs(cfg)[1:]]
