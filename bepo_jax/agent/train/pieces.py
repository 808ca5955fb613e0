"""The run's pieces, each built from its part of the config (``train.parts``) and nothing else, in the
order a run needs them:

    tasks      <- env part (+ the env parts of the runs it starts from, whose pools its held-out tasks
                  avoid: ``init_from.earlier_env_parts``; + the schedule's eval_tasks)
    rollout    <- rollout part (+ the tasks' longest action word, for the character policy's response)
    policy     <- policy part (+ the prompt's length: the character policy's context)
    trainer    <- optim part (+ the schedule's iterations: the learning-rate schedule's length)
    credit     <- credit part

``Setup`` (the character policy) and ``LLMSetup`` (a pretrained chat model) call these; they differ only
where the policy does (its model, its rollout, which parameters train).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

from ...credit.estimators.registry import get_estimator, make_config
from ..envs.pools import DEFAULT_HELD_OUT, HELD_OUT_POOLS
from ..envs.registry import env_part, is_host_env, make_host_env, make_jax_env
from ..rl.loss import PPOLossConfig
from ..rl.train_step import TrainConfig
from .config import EVAL_SEED_OFFSET
from .parts import CreditPart, EnvPart, OptimPart, PolicyPart, RolloutPart, RunParts

MIN_RESPONSE = 8  # response tokens at least (the action word and its EOS must fit)
DEFAULT_POOL = 32  # training tasks of a JAX environment when task_pool is 0


def training_pool(env, tasks: EnvPart):
    """A JAX environment's training tasks for the env part ``tasks`` (or a ``RunConfig``): the first
    ``task_pool`` (default DEFAULT_POOL) of ``env.sample_tasks(., seed)``."""
    return env.sample_tasks(tasks.task_pool or DEFAULT_POOL, tasks.seed)


def held_out_pool(env, tasks: EnvPart, n: int, train_tasks=None, *, pools: str = DEFAULT_HELD_OUT,
                  earlier: Optional[Sequence[EnvPart]] = None):
    """A JAX environment's first ``n`` held-out tasks for the env part ``tasks`` (or a ``RunConfig``): the
    sequence from ``seed + EVAL_SEED_OFFSET`` without any task whose content (``task_signatures``) is in the
    run's training pool, in the pool of a run it starts from (``earlier``: their env parts,
    ``init_from.earlier_env_parts``; read from a RunConfig's ``init_from`` when not given: a warm start's
    demonstration levels), or earlier in the pool (``envs.pools``); "structural" and "disjoint" are the
    same here (a level's arrays are its structure). An environment without ``task_signatures``, or
    ``pools`` "seeded" (a run written before the pools were disjoint: ``rundir.held_out_pools``), keeps the
    plain seeded sequence. ``train_tasks``: the run's own training pool, when already drawn."""
    from ..envs.pools import disjoint_tasks, has_signatures

    if pools not in HELD_OUT_POOLS:
        raise ValueError(f"held-out pools {pools!r}: choose one of {', '.join(HELD_OUT_POOLS)}.")
    seed = tasks.seed + EVAL_SEED_OFFSET
    if pools == "seeded" or not has_signatures(env):
        return env.sample_tasks(n, seed)
    if earlier is None:
        from .init_from import earlier_env_parts

        earlier = earlier_env_parts(tasks) if hasattr(tasks, "parts") else []
    exclude = set(env.task_signatures(train_tasks if train_tasks is not None else training_pool(env, tasks)))
    for part in earlier:
        exclude.update(env.task_signatures(training_pool(env, part)))
    return disjoint_tasks(env, n, seed, exclude)


class Tasks(NamedTuple):
    """A run's tasks: ``env`` (a JAX environment; a host one, ``TextWorldRun``; or, for a chat model, a
    JAX environment's tasks as text games, ``JaxTextGames``), whether it runs on the host, the training
    tasks and their number, the episode's step limit, and the first ``n_eval`` held-out tasks."""

    env: Any
    host: bool
    train: Any
    pool_size: int
    max_steps: int
    eval_pool: Any


def tasks(env: EnvPart, *, n_eval: int, earlier: Sequence[EnvPart] = (), cache_dir: Optional[Path] = None,
          held_out: str = DEFAULT_HELD_OUT, instance=None, chat: bool = False) -> Tasks:
    """The run's tasks from its env part: the environment (``instance`` when given: a JaxEnv to use
    instead of building ``env.name``), its training pool, its first ``n_eval`` held-out tasks, kept apart
    in content from the training pools of this run and of the runs it starts from (``earlier``:
    ``init_from.earlier_env_parts``); ``chat``: a JAX environment's tasks as text games for a chat model."""
    if instance is None and is_host_env(env.name):
        run = make_host_env(env.name, env, cache_dir, eval_seed_offset=EVAL_SEED_OFFSET, held_out=held_out)
        return Tasks(run, True, run.train_tasks, run.pool, run.max_steps, run.held_out(n_eval))
    jax_env = instance if instance is not None else make_jax_env(env.name, env)
    if chat:
        games = JaxTextGames(jax_env, env, held_out=held_out, earlier=earlier)
        return Tasks(games, True, games.train_tasks, games.pool, games.max_steps, games.held_out(n_eval))
    train = training_pool(jax_env, env)
    held = held_out_pool(jax_env, env, n_eval, train, pools=held_out, earlier=earlier)
    return Tasks(jax_env, False, train, env.task_pool or DEFAULT_POOL, jax_env.max_steps, held)


class JaxTextGames:
    """A JAX environment (Sokoban, the maze, a registered one) as text games for a chat model:
    each episode is a ``JaxEnvOnHost`` (the rendered observation as text, the action words as the
    admissible commands, the environment's ``objective`` attribute as the task); the run's
    training pool (``task_pool``, default 32) and held-out tasks as the character policy's runs
    draw them (``training_pool``, ``held_out_pool``: disjoint in content)."""

    def __init__(self, env, tasks: EnvPart, *, held_out: str = DEFAULT_HELD_OUT, earlier: Sequence[EnvPart] = ()):
        """``tasks``: the run's env part (or its ``RunConfig``); ``earlier``: the env parts of the runs it
        starts from (``init_from.earlier_env_parts``), whose pools its held-out tasks avoid."""
        import jax
        import numpy as np

        from ..envs.pools import has_signatures

        tasks = env_part(tasks)
        self.jax_env, self.tasks, self.held_out_pools, self.earlier = env, tasks, held_out, list(earlier)
        self.pool = tasks.task_pool or DEFAULT_POOL
        self.max_steps = tasks.max_steps or env.max_steps
        self._train = training_pool(env, tasks)
        self.train_tasks = self._split(self._train, self.pool)
        if has_signatures(env):  # content ids for per-task results (envs.pools.task_ids)
            self.task_signatures = lambda tasks: env.task_signatures(
                jax.tree_util.tree_map(lambda *x: np.stack(x), *tasks))

    @staticmethod
    def _split(tasks, n: int) -> list:
        import jax

        return [jax.tree_util.tree_map(lambda x, i=i: x[i], tasks) for i in range(n)]

    def held_out(self, n: int) -> list:
        return self._split(held_out_pool(self.jax_env, self.tasks, n, self._train, pools=self.held_out_pools,
                                         earlier=self.earlier), n)

    def chat_env(self):
        from ..rollouts.host import JaxEnvOnHost

        return JaxEnvOnHost(self.jax_env)


def estimator(credit: CreditPart):
    """The registered estimator and its config."""
    return get_estimator(credit.name), make_config(credit.name, **credit.config)


def train_config(optim: OptimPart, *, iterations: int, seed: int, pretrained: bool, **extra) -> TrainConfig:
    """The trainer's config: the optim part, the learning-rate schedule over ``iterations``; ``extra``:
    what the policy fixes (``score_from``, the sampling ``temperature``). The character policy's update
    takes no micro-batches and no KL term (``grad_accum`` and ``kl_coef`` are a pretrained model's)."""
    accum, kl = (optim.grad_accum, optim.kl_coef) if pretrained else (1, 0.0)
    return TrainConfig(learning_rate=optim.learning_rate, total_steps=iterations, ppo_epochs=optim.ppo_epochs,
                       num_minibatches=optim.num_minibatches, grad_accum=accum, seed=seed,
                       loss=PPOLossConfig(entropy_coef=optim.entropy_coef, kl_coef=kl), **extra)


def char_rollout_config(rollout: RolloutPart, *, word: int):
    """The character policy's rollout config: the response holds the longest action word (or command,
    ``word`` characters) and its EOS, at least ``MIN_RESPONSE`` tokens."""
    from ..rollouts.jitted import RolloutConfig

    return RolloutConfig(group_size=rollout.group_size, prompt_history=rollout.prompt_history,
                         temperature=rollout.temperature, constrained=rollout.constrained,
                         invalid_penalty=rollout.invalid_penalty, max_response=max(MIN_RESPONSE, word + 1))


def chat_rollout_config(rollout: RolloutPart):
    """A pretrained model's chat rollout config."""
    from ..rollouts.chat import ChatRolloutConfig

    return ChatRolloutConfig(group_size=rollout.group_size, prompt_history=rollout.prompt_history,
                             temperature=rollout.temperature, max_reply=rollout.max_reply,
                             invalid_penalty=rollout.invalid_penalty, action_format=rollout.action_format,
                             constrained=rollout.constrained, state_with_commands=rollout.state_with_commands,
                             max_prompt=rollout.max_prompt)


def char_policy(policy: PolicyPart, *, context: int):
    """The character policy (``DecoderLM``) of ``context`` tokens, its parameters drawn from the seed."""
    from flax import nnx

    from ..envs.text import VOCAB
    from ..models import DecoderLM, TransformerConfig

    return DecoderLM(TransformerConfig(vocab=VOCAB, layers=policy.layers, width=policy.width, heads=policy.heads,
                                       head_init_scale=policy.head_init_scale, context=context),
                     rngs=nnx.Rngs(policy.seed))


def chat_policy(policy: PolicyPart):
    """A pretrained model (with LoRA adapters when ``lora_rank``) and which of its parameters train."""
    from ..models.lora import LoRAConfig, add_lora, trainable
    from ..models.pretrained import load_pretrained

    pretrained = load_pretrained(policy.model, dtype=policy.dtype)
    if policy.lora_rank:
        add_lora(pretrained.model, LoRAConfig(rank=policy.lora_rank, alpha=policy.lora_alpha,
                                              targets=tuple(policy.lora_targets.split(",")), seed=policy.seed))
    return pretrained, trainable(pretrained.model, lora=bool(policy.lora_rank), top_layers=policy.train_layers)


def check_batch(parts: RunParts, max_steps: int) -> None:
    """A pretrained run's turn sequences split evenly into minibatches of micro-batches."""
    n = parts.schedule.groups * parts.rollout.group_size * max_steps
    per = parts.optim.num_minibatches * parts.optim.grad_accum
    if n % per:
        raise ValueError(f"RunConfig: an iteration has groups x group_size x max_steps = {n} turn sequences, not a "
                         f"multiple of num_minibatches x grad_accum = {per}; change grad_accum or num_minibatches.")


__all__: Sequence[str] = ("DEFAULT_POOL", "training_pool", "held_out_pool", "Tasks", "tasks", "JaxTextGames",
                          "estimator", "train_config", "char_rollout_config", "chat_rollout_config", "char_policy",
                          "chat_policy", "check_batch")
