"""The run configuration (``config.json`` of every run directory)."""

from __future__ import annotations

import dataclasses

from ...credit.configs import check_int, check_range, with_dict_methods
from ..envs.registry import check_env_name
from ...credit.estimators.registry import ESTIMATORS, estimator_settings
from ...credit.configs import check_choice

EVAL_SEED_OFFSET = 1_000_003  # held-out tasks are drawn with seed + this


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a run needs (written to ``config.json``).

    env ("sokoban" | "maze" | "textworld", a name given to ``register_env``, or an import
    path "package.module:factory"), estimator (a registry name) and estimator_config
    (the estimator's own config, e.g. GatedBEPOConfig(lam=0.5), or its field overrides as a
    dict, {"lam": 0.5}; stored as the dict of the fields that differ from the defaults); iterations, groups B per iteration, group_size
    K; rollout: prompt_history h (observation/action pairs in the prompt), temperature,
    constrained decoding, invalid_penalty, max_steps (0 = the environment's default);
    policy: layers, width, heads, head_init_scale (the output head's LeCun init times this;
    0.01 starts near-uniform); update: learning_rate, ppo_epochs, num_minibatches,
    entropy_coef; tasks: task_pool (the training tasks, 0 = the environment's default:
    32 Sokoban levels / 32 mazes / 8 TextWorld games), eval_tasks (held-out tasks, and as
    many training tasks up to the pool, evaluated every eval_every iterations, eval_episodes
    episodes each, 0 = group_size; eval_train False: the held-out tasks only, e.g. where an
    evaluation is dear); checkpoint_every,
    keep_checkpoints; seed. Environment knobs: boxes (Sokoban max boxes),
    rooms/objects/quest_length (TextWorld). init_from: a run directory (``bepo-jax sft``'s warm
    start, or any run of the same policy and environment) whose newest parameters start this run
    ("" = fresh parameters from the seed); the optimizer starts fresh.

    A pretrained policy (``model``: a name of ``bepo-jax models list`` or a GGUF file / Hugging
    Face directory; "" = the small character policy above): it plays TextWorld, or a JAX
    environment's rendered text (Sokoban, ...), through its chat template (``rollouts.chat``);
    max_reply tokens per turn,
    max_prompt (longer chats drop their oldest turns), action_format ("bare" | "tag"),
    state_with_commands (states hash the admissible commands too); it trains LoRA adapters
    (lora_rank > 0, lora_alpha, lora_targets: comma-separated projections) or the top
    train_layers blocks (0 = all) or everything, with kl_coef (k3 KL to the initial policy),
    grad_accum micro-batches per minibatch, in dtype ("float32" | "bfloat16"); similarity > 0
    merges states whose texts' estimated n-gram Jaccard similarity is at least that
    (``credit.similarity``; 0 = exact text). layers, width,
    heads, head_init_scale and constrained's default do not apply to it."""

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
    def episodes_per_evaluation(self) -> int:
        """Episodes an evaluation plays per task: ``eval_episodes``, or the group size where it is 0."""
        return self.eval_episodes or self.group_size

    @property
    def pretrained(self) -> bool:
        """Whether the policy is a pretrained model (``model`` set)."""
        return bool(self.model)

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
        n = "RunConfig"
        check_env_name(self.env)
        check_choice(n, "estimator", self.estimator, ESTIMATORS)
        # the estimator's own config or a dict of its fields, stored as the fields that differ from the
        # defaults; validated in the registry, the one home of estimator settings
        object.__setattr__(self, "estimator_config", estimator_settings(self.estimator, self.estimator_config,
                                                                            what="RunConfig.estimator_config"))
        for f in ("iterations", "groups", "group_size", "layers", "width", "heads", "ppo_epochs", "num_minibatches",
                  "eval_tasks", "eval_every", "checkpoint_every", "keep_checkpoints", "boxes", "rooms", "objects",
                  "quest_length"):
            check_int(n, f, getattr(self, f), lo=1)
        for f in ("prompt_history", "max_steps", "task_pool", "seed", "eval_episodes"):
            check_int(n, f, getattr(self, f), lo=0)
        check_range(n, "temperature", self.temperature, lo=0.0, lo_open=True)
        check_range(n, "invalid_penalty", self.invalid_penalty, hi=0.0)
        check_range(n, "learning_rate", self.learning_rate, lo=0.0, lo_open=True)
        check_range(n, "head_init_scale", self.head_init_scale, lo=0.0, lo_open=True)
        check_range(n, "entropy_coef", self.entropy_coef, lo=0.0)
        if not isinstance(self.init_from, str):
            raise ValueError(f"RunConfig.init_from={self.init_from!r} must be a path (a string; \"\" for none).")
        self._check_pretrained()
        if self.width % self.heads:
            raise ValueError(f"RunConfig.width={self.width} must be a multiple of heads={self.heads}.")

    def _check_pretrained(self) -> None:
        from ..rollouts.chat import FORMATS
        from ..models.lora import LoRAConfig
        from ..models.llama import DTYPES

        n = "RunConfig"
        if not isinstance(self.model, str):
            raise ValueError(f"RunConfig.model={self.model!r} must be a model name or path (a string; \"\" for the "
                             "character policy).")
        for f in ("max_reply", "max_prompt", "grad_accum"):
            check_int(n, f, getattr(self, f), lo=1 if f != "max_reply" else 2)
        for f in ("lora_rank", "train_layers"):
            check_int(n, f, getattr(self, f), lo=0)
        check_range(n, "kl_coef", self.kl_coef, lo=0.0)
        check_range(n, "similarity", self.similarity, lo=0.0, hi=1.0)
        check_choice(n, "action_format", self.action_format, FORMATS)
        check_choice(n, "dtype", self.dtype, DTYPES)
        if self.lora_rank:
            LoRAConfig(rank=self.lora_rank, alpha=self.lora_alpha, targets=tuple(self.lora_targets.split(",")))
