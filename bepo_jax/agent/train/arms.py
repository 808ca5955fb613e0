"""Arms x seeds: the one runner behind ``bepo-jax compare`` and every experiment script.

An arm is a label, an estimator, that estimator's config fields and RunConfig overrides;
its seed ``s`` is an ordinary run directory ``out/<label>/seed<s>`` trained with
``arm.config_for(base).replace(seed=s)``. ``run_arm`` trains the seeds that are not
finished (all of them as one program on JAX environments, ``train_seeds``; one after
another on host environments) and resumes interrupted ones; a finished run of another
config in its place is refused, never read as this arm's.

Text form (``bepo-jax compare --arms``, ``credit``, ``learn``; one grammar,
``estimators.registry.parse_estimator_spec``)::

    gated_bepo,gigpo                           registry names (label = name)
    lam0=gated_bepo:lam=0,eta1=gated_bepo:eta_gated=1,grpo
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..envs.registry import is_host_env
from ...credit.estimators.registry import make_config, parse_estimator_spec
from .config import RunConfig
from .rundir import is_finished_run_of, read_metrics

# a seed whose largest sampled-action share exceeds this has collapsed onto one action
COLLAPSE = 0.9
_NOT_OVERRIDES = ("estimator", "estimator_config", "seed")


@dataclasses.dataclass(frozen=True)
class Arm:
    """``Arm(label, estimator, config={field: value}, run={RunConfig field: value})``.

    ``config``: the estimator's config fields over its defaults; ``run``: RunConfig fields
    over the experiment's base config (not ``estimator``, ``estimator_config`` or ``seed``:
    those are the arm's and the seed's)."""

    label: str
    estimator: str
    config: Mapping = dataclasses.field(default_factory=dict)
    run: Mapping = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.label or "/" in self.label or self.label.startswith("."):
            raise ValueError(f"Arm.label={self.label!r}: a label names a directory; use letters, digits, _ - . "
                             "(no '/', not empty, not starting with '.').")
        make_config(self.estimator, **dict(self.config))  # unknown estimator / fields raise, listing valid ones
        fields = {f.name for f in dataclasses.fields(RunConfig)}
        bad = sorted(k for k in self.run if k not in fields or k in _NOT_OVERRIDES)
        if bad:
            raise ValueError(f"Arm {self.label!r}: run overrides {bad} are not RunConfig fields an arm may set; "
                             f"valid: {', '.join(sorted(fields - set(_NOT_OVERRIDES)))}.")

    def config_for(self, base: RunConfig) -> RunConfig:
        """Every seed's config but for ``seed``: ``base`` with this arm's estimator, its config
        fields and its run overrides."""
        return base.replace(estimator=self.estimator, estimator_config=dict(self.config), **dict(self.run))

    def describe(self) -> str:
        over = [f"{k}={v}" for k, v in {**self.config, **self.run}.items()]
        return self.estimator + (f" ({', '.join(over)})" if over else "")

    def to_dict(self) -> dict:
        return {"label": self.label, "estimator": self.estimator, "config": dict(self.config), "run": dict(self.run)}


def parse_arm(text: str) -> Arm:
    """``"gigpo"`` or ``"LABEL=NAME:field=value:..."`` (the estimator's config fields)."""
    label, name, over = parse_estimator_spec(text)
    return Arm(label, name, over)


def parse_arms(text: str | Sequence[str]) -> tuple[Arm, ...]:
    """Comma-separated arm specs (or a sequence of specs / Arms); labels must be distinct."""
    items = [x for x in text.split(",")] if isinstance(text, str) else list(text)
    arms = tuple(x if isinstance(x, Arm) else parse_arm(x) for x in items if isinstance(x, Arm) or x.strip())
    if not arms:
        raise ValueError("--arms is empty; give comma-separated estimator names or LABEL=NAME:field=value specs "
                         "(e.g. grpo,gigpo,lam0=gated_bepo:lam=0).")
    labels = [a.label for a in arms]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ValueError(f"--arms: the labels {twice} appear twice; give each arm its own label "
                         "(LABEL=NAME:field=value).")
    return arms


def run_dirs(out: str | Path, arm: Arm, seeds: Sequence[int]) -> dict[int, Path]:
    """Seed number -> the arm's run directory ``out/<label>/seed<number>``."""
    return {s: Path(out) / arm.label / f"seed{s}" for s in seeds}


def run_arm(base: RunConfig, arm: Arm, seeds: Sequence[int], out: str | Path, *, progress: bool = True,
            mesh=None, seeds_in_one_program: Optional[bool] = None) -> list[list[dict]]:
    """Train every seed of ``arm`` that is not finished and return each seed's metrics rows
    (in ``seeds`` order). A finished run of another config where a seed's run belongs raises
    ``ValueError`` naming the fields that differ; an unfinished one of another config is
    refused by ``--resume``'s check the same way.

    ``seeds_in_one_program``: the seeds as one program (``train_seeds``; default on JAX
    environments); ``mesh``: shard that program's run axis over the mesh's "runs" axis."""
    from .loop import train, train_seeds

    import jax

    cfg = arm.config_for(base)
    host = is_host_env(cfg.env)
    if seeds_in_one_program and host:
        raise ValueError(f"seeds_in_one_program: env={cfg.env!r} runs through the host loop; its seeds run one "
                         "after another (seeds_in_one_program=False, or leave it unset).")
    one_program = (not host) if seeds_in_one_program is None else seeds_in_one_program
    dirs = run_dirs(out, arm, seeds)
    if jax.process_count() > 1:
        # across processes a run directory is on its owner's disk only: every process takes part in
        # every seed (a finished run resumes as a no-op) and gets every run's rows from its owner
        if not one_program:
            raise ValueError("with several processes the seeds run as one program (seeds_in_one_program=True).")
        res = train_seeds(cfg, list(dirs), list(dirs.values()), resume=True, progress=progress, mesh=mesh)
        return [r["rows"] for r in res]
    todo = [s for s, d in dirs.items() if not is_finished_run_of(d, cfg.replace(seed=s))]
    if todo and one_program:
        train_seeds(cfg, todo, [dirs[s] for s in todo], resume=True, progress=progress, mesh=mesh)
    for s in todo if not one_program else ():
        train(cfg.replace(seed=s), dirs[s], resume=(dirs[s] / "config.json").exists(), progress=progress)
    return [read_metrics(d) for d in dirs.values()]


def action_curves(rows: list[dict]) -> tuple[list[int], list[float], list[float]]:
    """Per training iteration (the rows that sampled actions): the iteration, the entropy of
    the sampled actions' shares (nats) and the largest share (a policy collapsed onto one
    action shows entropy near 0 and a share near 1)."""
    acts = [r for r in rows if "actions/entropy" in r]
    return ([r["iteration"] for r in acts], [float(r["actions/entropy"]) for r in acts],
            [max(v for k, v in r.items() if k.startswith("actions/share_")) for r in acts])


def collapsed(rows: list[dict]) -> bool:
    """The run's policy ended sampling one action more than ``COLLAPSE`` of the time (then every
    estimator's update sees the same batch, and arms cannot differ)."""
    _, _, top = action_curves(rows)
    return bool(top) and top[-1] > COLLAPSE
