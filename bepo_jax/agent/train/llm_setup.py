"""A run whose policy is a pretrained chat model (``RunConfig.model``): ``LLMSetup``.

    for it in 1..iterations:
        tasks   <- B games from the training pool (K episodes each)
        rollout -> per turn: the chat prompt, the sampled reply (its log-probs at the sampling
                   temperature), the parsed command; states = the observation texts, hashed
        A       <- the estimator's per-turn credit, broadcast to the reply's tokens
        state   <- PPO on the reply tokens only (clip, optional k3 KL to the initial policy),
                   micro-batches with gradient accumulation, over the trained parameters:
                   LoRA adapters, the top N blocks, or all

The same loop, run directory, checkpoints and resume as the character policy's runs
(``train.loop``); only the policy, the rollout and the update's shapes differ. The turn
sequences of an iteration are left-padded to its longest prompt bucket P (a multiple of
``ChatRolloutConfig.bucket``), so the update compiles once per bucket and scores only from
position P - 1 on (``TrainConfig.score_from``: the output head never sees the prompt).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ...credit.estimators.registry import get_estimator, make_config
from ...credit.similarity import SimilarityConfig, merge_similar
from ..rollouts.chat import ChatRollout, ChatRolloutConfig
from ..envs.pools import has_signatures
from ..envs.registry import is_host_env, make_host_env, make_jax_env
from ..rollouts.host import JaxEnvOnHost
from ..models.lora import LoRAConfig, add_lora, trainable
from ..models.pretrained import load_pretrained
from ..rl.loss import PPOLossConfig
from ..rl.train_step import TrainConfig, Trainer, TrainState
from ..rollouts.jitted import Rollout
from .config import EVAL_SEED_OFFSET, RunConfig
from .setup import DEFAULT_HELD_OUT, DEFAULT_POOL, Setup, held_out_pool, training_pool


class JaxTextGames:
    """A JAX environment (Sokoban, the maze, a registered one) as text games for a chat model:
    each episode is a ``JaxEnvOnHost`` (the rendered observation as text, the action words as the
    admissible commands, the environment's ``objective`` attribute as the task); the run's
    training pool (``task_pool``, default 32) and held-out tasks as the character policy's runs
    draw them (``setup.training_pool``, ``setup.held_out_pool``: disjoint in content)."""

    def __init__(self, env, cfg: RunConfig, *, held_out: str = DEFAULT_HELD_OUT):
        self.jax_env, self.cfg, self.held_out_pools = env, cfg, held_out
        self.pool = cfg.task_pool or DEFAULT_POOL
        self.max_steps = cfg.max_steps or env.max_steps
        self._train = training_pool(env, cfg)
        self.train_tasks = self._split(self._train, self.pool)
        if has_signatures(env):  # content ids for per-task results (envs.pools.task_ids)
            self.task_signatures = lambda tasks: env.task_signatures(
                jax.tree_util.tree_map(lambda *x: np.stack(x), *tasks))

    @staticmethod
    def _split(tasks, n: int) -> list:
        return [jax.tree_util.tree_map(lambda x, i=i: x[i], tasks) for i in range(n)]

    def held_out(self, n: int) -> list:
        return self._split(held_out_pool(self.jax_env, self.cfg, n, self._train, pools=self.held_out_pools), n)

    def chat_env(self) -> JaxEnvOnHost:
        return JaxEnvOnHost(self.jax_env)


class LLMSetup(Setup):
    """``Setup`` for a pretrained policy: the model (with adapters when ``lora_rank``), the
    trainer of the chosen parameters, the chat rollout, and the iteration."""

    def __init__(self, cfg: RunConfig, *, cache_dir: Optional[Path] = None, reuse_frozen: bool = True,
                 held_out: str = DEFAULT_HELD_OUT):
        """``reuse_frozen`` (training the top N blocks): the update starts from the frozen blocks'
        output the rollout recorded (True) or runs them again (False: the benchmarks' baseline);
        ``held_out``: a JAX environment's held-out pools (``Setup``)."""
        self.cfg = cfg
        self.host = True
        self.held_out = held_out
        self.env = (make_host_env(cfg.env, cfg, cache_dir, eval_seed_offset=EVAL_SEED_OFFSET, held_out=held_out)
                    if is_host_env(cfg.env)
                    else JaxTextGames(make_jax_env(cfg.env, cfg), cfg, held_out=held_out))
        self.max_steps = self.env.max_steps
        self.train_tasks = self.env.train_tasks
        self.pool_size = self.env.pool
        self.eval_pool = self.env.held_out(cfg.eval_tasks)
        self.pretrained = load_pretrained(cfg.model, dtype=cfg.dtype)
        self.model = self.pretrained.model
        if cfg.lora_rank:
            add_lora(self.model, LoRAConfig(rank=cfg.lora_rank, alpha=cfg.lora_alpha,
                                            targets=tuple(cfg.lora_targets.split(",")), seed=cfg.seed))
        self._trainable = trainable(self.model, lora=bool(cfg.lora_rank), top_layers=cfg.train_layers)
        if cfg.train_layers and reuse_frozen:  # the blocks below are frozen: the rollout records their output
            self.model.capture_layer = len(self.model.layers) - cfg.train_layers
        self.rollout_cfg = ChatRolloutConfig(group_size=cfg.group_size, prompt_history=cfg.prompt_history,
                                             temperature=cfg.temperature, max_reply=cfg.max_reply,
                                             invalid_penalty=cfg.invalid_penalty, action_format=cfg.action_format,
                                             constrained=cfg.constrained, state_with_commands=cfg.state_with_commands,
                                             max_prompt=cfg.max_prompt)
        N = cfg.groups * cfg.group_size * self.max_steps
        per = cfg.num_minibatches * cfg.grad_accum
        if N % per:
            raise ValueError(f"RunConfig: an iteration has groups x group_size x max_steps = {N} turn sequences, not a "
                             f"multiple of num_minibatches x grad_accum = {per}; change grad_accum or num_minibatches.")
        self._train_cfg = TrainConfig(
            learning_rate=cfg.learning_rate, total_steps=cfg.iterations, ppo_epochs=cfg.ppo_epochs,
            num_minibatches=cfg.num_minibatches, grad_accum=cfg.grad_accum, seed=cfg.seed,
            temperature=cfg.temperature, loss=PPOLossConfig(entropy_coef=cfg.entropy_coef, kl_coef=cfg.kl_coef))
        self.trainer = Trainer(self.model, self._train_cfg, trainable=self._trainable)
        self._trainers: dict[int, Trainer] = {}
        self._reference = self.trainer.init_state().params if cfg.kl_coef > 0 else None
        self.rollout = self._make_rollout(self.rollout_cfg)
        self._rollouts = {}
        self.estimator = get_estimator(cfg.estimator)
        self.est_cfg = make_config(cfg.estimator, **cfg.estimator_config)
        self._iteration = self._update = None
        self._eval = {}

    def _make_rollout(self, rollout_cfg):
        """The chat rollout of the run's model under ``rollout_cfg``."""
        return ChatRollout(self.pretrained, self.trainer.graphdef, self.trainer.rest, self.env.chat_env, rollout_cfg,
                           max_steps=self.max_steps)

    def trainer_for(self, length: int) -> Trainer:
        """The trainer of sequences of ``length`` = P + max_reply tokens: it scores from P - 1."""
        P = length - self.rollout_cfg.max_reply
        if P not in self._trainers:
            cfg = dataclasses.replace(self._train_cfg, score_from=P - 1)
            self._trainers[P] = Trainer(self.model, cfg, trainable=self._trainable)
        return self._trainers[P]

    def frozen_inputs(self):
        """The frozen parameters (``Trainer.rest``) and the KL reference's parameters: inputs of the
        jitted update, not constants compiled into it."""
        return {"rest": self.trainer.rest, "reference": self._reference}

    def reference_logp(self, ro: Rollout, frozen=None):
        """log pi_ref of every token under the initial parameters (the KL term's reference), at the
        sampling temperature; 0 before the reply (traceable). ``frozen``: ``frozen_inputs()``."""
        frozen = frozen or self.frozen_inputs()
        L = ro.tokens.shape[-1]
        model = nnx.merge(self.trainer.graphdef, frozen["reference"], frozen["rest"])
        flat = lambda x: x.reshape(-1, L)
        hidden = None if ro.hidden is None else ro.hidden.reshape((-1, L) + ro.hidden.shape[-1:])
        logp, _ = self.trainer_for(L).logprobs(model, flat(ro.tokens), flat(ro.mask), hidden)
        return jax.lax.stop_gradient(jnp.where(flat(ro.response_mask), logp, 0.0)).reshape(ro.tokens.shape)

    def _learn(self, state: TrainState, ro: Rollout, frozen=None, credit: tuple = ()):
        frozen = frozen or self.frozen_inputs()
        ref = self.reference_logp(ro, frozen) if self._reference is not None else None
        batch = ro.batch
        if self.cfg.similarity > 0:  # similar state texts merged into one state (credit.similarity)
            batch = merge_similar(batch, ro.obs_tokens, SimilarityConfig(threshold=self.cfg.similarity))
        return self.learn_from(state, ro, self.advantages(batch, credit), trainer=self.trainer_for(ro.tokens.shape[-1]),
                               ref_logp=ref, rest=frozen["rest"])

    def iterate(self, state: TrainState, it: int):
        """One iteration (``Setup.iterate``) and the rollout's own numbers: reply length (tokens),
        seconds spent decoding replies and stepping games, reply tokens per second of decoding, the
        rest of the iteration (``update_s``: advantages, the update, building prompts), sampling
        programs compiled so far, the live rows' prompt tokens and the tokens the model ran (the
        rest came from the episodes' carried caches: ``ChatRolloutConfig.reuse_cache``)."""
        t0 = time.perf_counter()
        state, m = super().iterate(state, it)
        total = time.perf_counter() - t0
        ro = self.rollout
        tok = self.pretrained.tokenizer
        replies = [len(tok.encode(t["reply"], add_special_tokens=False)) for ep in ro.episodes for t in ep]
        m["reply_tokens"] = sum(replies) / max(len(replies), 1)
        m["rollout/decode_s"], m["rollout/env_s"] = ro.timing["decode_s"], ro.timing["env_s"]
        m["rollout/reply_tokens_per_s"] = sum(replies) / max(ro.timing["decode_s"], 1e-9)
        m["update_s"] = total - ro.timing["decode_s"] - ro.timing["env_s"]  # advantages, update, prompt building
        m["rollout/compiles"] = float(ro.compiles)
        m["rollout/prompt_tokens"] = float(ro.timing["prompt_tokens"])  # the live rows' prompts
        m["rollout/prefill_tokens"] = float(ro.timing["prefill_tokens"])  # what ran through the model (cache reuse)
        return state, m
