"""A run's config in parts: each piece of a run receives the part it reads, and only that.

``RunConfig`` is the run's one flat spelling (the command line's flags, the recipes, every run
directory's ``config.json``, which therefore keep loading); ``RunConfig.parts`` is the same config as
six frozen parts, each validated where it is defined:

    env       EnvPart        the tasks: the environment and its knobs, the training pool, the seed they come from
    policy    PolicyPart     the character policy's shape, or a pretrained model (dtype, LoRA, top blocks); init_from
    rollout   RolloutPart    an episode: trajectories per task, the prompt, sampling, the reply
    credit    CreditPart     the estimator, its config, and state merging (similarity)
    optim     OptimPart      the PPO update
    schedule  SchedulePart   iterations, groups per iteration, evaluations, checkpoints, the seed

``RunConfig.from_parts(parts)`` goes back. A part's errors name the flat field (``RunConfig.temperature``):
the name a user wrote, as a flag or a key of ``config.json``. The seed is the run's one seed; the parts
that draw from it (the tasks, the policy's initial parameters, the iteration keys) each carry it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from ...credit.configs import check_bool, check_choice, check_int, check_range, with_dict_methods

N = "RunConfig"  # the flat spelling every error names


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvPart:
    """The tasks: ``name`` (RunConfig.env: a built-in, registered or import-path environment), max_steps
    (0 = the environment's own), task_pool (the training tasks; 0 = the environment's default), the
    knobs boxes (Sokoban) and rooms / objects / quest_length (TextWorld), and the seed the pools are drawn
    from. What an environment factory (``envs.registry``) is called with."""

    name: str
    max_steps: int
    task_pool: int
    boxes: int
    rooms: int
    objects: int
    quest_length: int
    seed: int

    def __post_init__(self):
        from ..envs.registry import check_env_name

        check_env_name(self.name)
        for f in ("boxes", "rooms", "objects", "quest_length"):
            check_int(N, f, getattr(self, f), lo=1)
        for f in ("max_steps", "task_pool", "seed"):
            check_int(N, f, getattr(self, f), lo=0)


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyPart:
    """The policy: a pretrained ``model`` (a name of ``bepo-jax models list``, a GGUF file or a Hugging Face
    directory) in ``dtype``, training LoRA adapters (lora_rank > 0, lora_alpha, lora_targets: comma-separated
    projections) or its top train_layers blocks (0 = all); or, where ``model`` is "", the character policy
    of layers x width with heads, its output head's init scaled by head_init_scale. init_from: a run
    directory whose newest parameters start this run ("" = fresh from the seed)."""

    model: str
    layers: int
    width: int
    heads: int
    head_init_scale: float
    dtype: str
    lora_rank: int
    lora_alpha: float
    lora_targets: str
    train_layers: int
    init_from: str
    seed: int

    @property
    def pretrained(self) -> bool:
        return bool(self.model)

    def __post_init__(self):
        from ..models.llama import DTYPES
        from ..models.lora import LoRAConfig

        for f in ("layers", "width", "heads"):
            check_int(N, f, getattr(self, f), lo=1)
        for f in ("lora_rank", "train_layers", "seed"):
            check_int(N, f, getattr(self, f), lo=0)
        check_range(N, "head_init_scale", self.head_init_scale, lo=0.0, lo_open=True)
        if not isinstance(self.init_from, str):
            raise ValueError(f"RunConfig.init_from={self.init_from!r} must be a path (a string; \"\" for none).")
        if not isinstance(self.model, str):
            raise ValueError(f"RunConfig.model={self.model!r} must be a model name or path (a string; \"\" for the "
                             "character policy).")
        check_choice(N, "dtype", self.dtype, DTYPES)
        if self.lora_rank:
            LoRAConfig(rank=self.lora_rank, alpha=self.lora_alpha, targets=tuple(self.lora_targets.split(",")))
        if self.width % self.heads:
            raise ValueError(f"RunConfig.width={self.width} must be a multiple of heads={self.heads}.")


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutPart:
    """An episode: group_size K trajectories per task, prompt_history earlier observation/action pairs in
    the prompt, sampling at temperature, constrained decoding, invalid_penalty for an unparsable action;
    a pretrained policy's replies: max_reply tokens, max_prompt (longer chats drop their oldest turns),
    action_format ("bare" | "tag"), state_with_commands (states hash the admissible commands too)."""

    group_size: int
    prompt_history: int
    temperature: float
    constrained: bool
    invalid_penalty: float
    max_reply: int
    max_prompt: int
    action_format: str
    state_with_commands: bool

    def __post_init__(self):
        from ..rollouts.chat import FORMATS

        check_int(N, "group_size", self.group_size, lo=1)
        check_int(N, "prompt_history", self.prompt_history, lo=0)
        check_int(N, "max_reply", self.max_reply, lo=2)
        check_int(N, "max_prompt", self.max_prompt, lo=1)
        check_range(N, "temperature", self.temperature, lo=0.0, lo_open=True)
        check_range(N, "invalid_penalty", self.invalid_penalty, hi=0.0)
        check_choice(N, "action_format", self.action_format, FORMATS)
        check_bool(N, "constrained", self.constrained)
        check_bool(N, "state_with_commands", self.state_with_commands)


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class CreditPart:
    """The credit: ``name`` (RunConfig.estimator, a registry name), ``config`` (RunConfig.estimator_config:
    the estimator's config or a dict of its fields, stored as the fields that differ from its defaults),
    similarity (> 0: states whose texts' estimated n-gram Jaccard similarity reaches it are merged,
    ``credit.similarity``; 0 = exact text)."""

    name: str
    config: dict
    similarity: float

    def __post_init__(self):
        from ...credit.estimators.registry import ESTIMATORS, estimator_settings

        check_choice(N, "estimator", self.name, ESTIMATORS)
        # validated in the registry, the one home of estimator settings
        object.__setattr__(self, "config", estimator_settings(self.name, self.config, what="RunConfig.estimator_config"))
        check_range(N, "similarity", self.similarity, lo=0.0, hi=1.0)


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimPart:
    """The update: AdamW at learning_rate (cosine over the run's iterations), ppo_epochs over
    num_minibatches of the iteration's batch, each of grad_accum micro-batches, entropy_coef and kl_coef
    (k3 KL to the initial policy) in the PPO loss."""

    learning_rate: float
    ppo_epochs: int
    num_minibatches: int
    entropy_coef: float
    kl_coef: float
    grad_accum: int

    def __post_init__(self):
        for f in ("ppo_epochs", "num_minibatches", "grad_accum"):
            check_int(N, f, getattr(self, f), lo=1)
        check_range(N, "learning_rate", self.learning_rate, lo=0.0, lo_open=True)
        check_range(N, "entropy_coef", self.entropy_coef, lo=0.0)
        check_range(N, "kl_coef", self.kl_coef, lo=0.0)


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class SchedulePart:
    """The run: iterations, groups B tasks per iteration, an evaluation every eval_every iterations (and at
    the last) on eval_tasks held-out tasks and as many training tasks (eval_train False: held-out only),
    eval_episodes episodes each (0 = the group size, which the rollout part holds: ``episodes``), a
    checkpoint every checkpoint_every iterations keeping keep_checkpoints, and the seed of the iteration
    keys and evaluation keys."""

    iterations: int
    groups: int
    eval_tasks: int
    eval_every: int
    eval_train: bool
    eval_episodes: int
    checkpoint_every: int
    keep_checkpoints: int
    seed: int

    def __post_init__(self):
        for f in ("iterations", "groups", "eval_tasks", "eval_every", "checkpoint_every", "keep_checkpoints"):
            check_int(N, f, getattr(self, f), lo=1)
        for f in ("eval_episodes", "seed"):
            check_int(N, f, getattr(self, f), lo=0)
        check_bool(N, "eval_train", self.eval_train)


PARTS = (EnvPart, PolicyPart, RolloutPart, CreditPart, OptimPart, SchedulePart)
# the flat fields whose part spells them otherwise: flat name -> (part, field)
RENAMED_IN_PART = {"env": ("env", "name"), "estimator": ("credit", "name"), "estimator_config": ("credit", "config")}


class RunParts(NamedTuple):
    """A run's config as its six parts (module docstring)."""

    env: EnvPart
    policy: PolicyPart
    rollout: RolloutPart
    credit: CreditPart
    optim: OptimPart
    schedule: SchedulePart

    @property
    def episodes_per_evaluation(self) -> int:
        """Episodes an evaluation plays per task: ``eval_episodes``, or the group size where it is 0."""
        return self.schedule.eval_episodes or self.rollout.group_size


def _homes() -> dict[str, list[tuple[str, str]]]:
    """flat name -> the (part, field) pairs that hold it, read once from the dataclasses."""
    homes: dict[str, list[tuple[str, str]]] = {}
    inverse = {v: k for k, v in RENAMED_IN_PART.items()}
    for part, cls in zip(RunParts._fields, PARTS):
        for f in dataclasses.fields(cls):
            homes.setdefault(inverse.get((part, f.name), f.name), []).append((part, f.name))
    return homes


HOMES = _homes()


def split(flat: dict[str, Any]) -> RunParts:
    """The parts of a flat config's fields (every field of ``RunConfig``; each goes to the parts that read
    it, the seed to all that draw from it)."""
    kw: dict[str, dict] = {p: {} for p in RunParts._fields}
    for key, value in flat.items():
        if key not in HOMES:
            raise ValueError(f"RunConfig field {key!r} belongs to no part of train.parts; add it to one.")
        for part, field in HOMES[key]:
            kw[part][field] = value
    return RunParts(*(cls(**kw[p]) for p, cls in zip(RunParts._fields, PARTS)))


def join(parts: RunParts) -> dict[str, Any]:
    """The flat fields of ``parts`` (``split``'s inverse); parts that disagree on the seed raise."""
    flat: dict[str, Any] = {}
    for key, homes in HOMES.items():
        for pname, field in homes:
            value = getattr(getattr(parts, pname), field)
            if key in flat and flat[key] != value:
                raise ValueError(f"RunParts: the parts disagree on {key} ({flat[key]!r} and {pname}.{field}="
                                 f"{value!r}); a run has one {key}.")
            flat[key] = value
    return flat
