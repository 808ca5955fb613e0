"""The run configuration (``config.json`` of every run directory): one flat record, the spelling of the
command line's flags and of every stored run; ``RunConfig.parts`` is the same config in the six frozen
parts that the run's pieces receive (``train.parts``)."""

from __future__ import annotations

import dataclasses

from ...credit.configs import with_dict_methods
from .parts import RunParts, join, split

EVAL_SEED_OFFSET = 1_000_003  # held-out tasks are drawn with seed + this


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a run needs (written to ``config.json``), field by field; each field belongs to one
    part of ``parts`` (the seed to every part that draws from it), where it is documented and validated:

    * env (``EnvPart``): env ("sokoban" | "maze" | "textworld", a name given to ``register_env``, or an
      import path "package.module:factory"), max_steps, task_pool, boxes, rooms, objects, quest_length;
    * policy (``PolicyPart``): model ("" = the character policy of layers, width, heads,
      head_init_scale), dtype, lora_rank, lora_alpha, lora_targets, train_layers, init_from;
    * rollout (``RolloutPart``): group_size, prompt_history, temperature, constrained, invalid_penalty,
      max_reply, max_prompt, action_format, state_with_commands;
    * credit (``CreditPart``): estimator, estimator_config (the estimator's config, e.g.
      GatedBEPOConfig(lam=0.5), or a dict of its fields; stored as the fields that differ from the
      defaults), similarity;
    * optim (``OptimPart``): learning_rate, ppo_epochs, num_minibatches, entropy_coef, kl_coef, grad_accum;
    * schedule (``SchedulePart``): iterations, groups, eval_tasks, eval_every, eval_train, eval_episodes,
      checkpoint_every, keep_checkpoints, seed.

    The character policy's fields are not read by a pretrained model's run, and the reply's
    (max_reply, max_prompt, action_format, state_with_commands) only by it."""

    env: str = "sokoban"
    estimator: str = "gated_bepo"
    estimator_config: dict = dataclasses.field(default_factory=dict)
    iterations: int = 60
    groups: int = 8
    group_size: int = 8
    prompt_history: int = 2
    temperature: float = 1.0
    constrained: bool = True
    invalid_penalty: float = -0.1
    max_steps: int = 0
    layers: int = 1
    width: int = 64
    heads: int = 4
    head_init_scale: float = 1.0
    learning_rate: float = 3e-3
    ppo_epochs: int = 1
    num_minibatches: int = 1
    entropy_coef: float = 0.0
    task_pool: int = 0
    eval_tasks: int = 32
    eval_every: int = 20
    eval_train: bool = True
    eval_episodes: int = 0
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    seed: int = 0
    boxes: int = 2
    rooms: int = 2
    objects: int = 3
    quest_length: int = 1
    init_from: str = ""
    model: str = ""
    max_reply: int = 24
    max_prompt: int = 512
    action_format: str = "bare"
    state_with_commands: bool = False
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: str = "q_proj,v_proj"
    train_layers: int = 0
    kl_coef: float = 0.0
    grad_accum: int = 1
    dtype: str = "float32"
    similarity: float = 0.0

    @property
    def parts(self) -> RunParts:
        """The config as its six frozen parts (``train.parts``): what each piece of a run receives."""
        return self._parts

    @classmethod
    def from_parts(cls, parts: RunParts) -> "RunConfig":
        """The flat config of ``parts`` (``RunConfig(...).parts`` back)."""
        return cls(**join(parts))

    @property
    def episodes_per_evaluation(self) -> int:
        """Episodes an evaluation plays per task: ``eval_episodes``, or the group size where it is 0."""
        return self._parts.episodes_per_evaluation

    @property
    def pretrained(self) -> bool:
        """Whether the policy is a pretrained model (``model`` set)."""
        return self._parts.policy.pretrained

    @classmethod
    def from_stored(cls, d: dict) -> "RunConfig":
        """A RunConfig from a run's config.json, including runs written before
        ``history`` was renamed ``prompt_history`` and runs that named an environment by an
        import path that is now a built-in name (``envs.registry.RENAMED``)."""
        from ..envs.registry import RENAMED

        d = dict(d)
        if "history" in d and "prompt_history" not in d:
            d["prompt_history"] = d.pop("history")
        d["env"] = RENAMED.get(d.get("env"), d.get("env", cls.env))
        return cls.from_dict(d)

    def __post_init__(self):
        # every field is validated in the part that holds it (train.parts); the estimator's config is
        # stored as its part normalised it (the fields that differ from the defaults)
        parts = split({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        object.__setattr__(self, "estimator_config", parts.credit.config)
        object.__setattr__(self, "_parts", parts)
