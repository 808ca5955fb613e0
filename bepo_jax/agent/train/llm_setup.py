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
(``train.loop``), and the same iteration (``Setup.iterate``): only the policy's side differs,
``ChatPolicy`` (the interface ``setup.PolicySide``), and ``LLMSetup`` only builds the pieces. The turn
sequences of an iteration are left-padded to its longest prompt bucket P (a multiple of
``ChatRolloutConfig.bucket``), so the update compiles once per bucket and scores only from
position P - 1 on (``TrainConfig.score_from``: the output head never sees the prompt).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from ...credit.similarity import SimilarityConfig, merge_similar
from ..rl.train_step import Trainer
from ..rollouts.chat import ChatRollout
from ..rollouts.jitted import Rollout
from . import pieces
from .config import RunConfig
from .setup import DEFAULT_HELD_OUT, Setup


class ChatPolicy:
    """A pretrained chat model's side of an iteration (``setup.PolicySide``): chat rollouts; the update
    over the chosen parameters (LoRA adapters, the top blocks, or all) with a trainer per prompt bucket,
    the frozen parameters and the KL reference passed in; similar state texts merged before the
    estimator (``similarity`` > 0); the rollout's timings and reply lengths as metrics."""

    def __init__(self, pretrained, trainer: Trainer, train_cfg, trainable, *, chat_env, max_steps: int,
                 max_reply: int, similarity: float, kl: bool):
        self.pretrained, self.trainer, self.train_cfg, self.trainable = pretrained, trainer, train_cfg, trainable
        self.chat_env, self.max_steps, self.max_reply, self.similarity = chat_env, max_steps, max_reply, similarity
        self.reference = trainer.init_state().params if kl else None
        self.trainers: dict[int, Trainer] = {}

    def make_rollout(self, config, *, evaluation: bool = False):
        """The chat rollout of ``config``; an evaluation's keeps no frozen blocks' output (``capture``)."""
        return ChatRollout(self.pretrained, self.trainer.graphdef, self.trainer.rest, self.chat_env, config,
                           max_steps=self.max_steps, capture=False if evaluation else None)

    def frozen_inputs(self):
        """The frozen parameters (``Trainer.rest``) and the KL reference's parameters: inputs of the
        jitted update, not constants compiled into it."""
        return {"rest": self.trainer.rest, "reference": self.reference}

    def trainer_for(self, length: int) -> Trainer:
        """The trainer of sequences of ``length`` = P + max_reply tokens: it scores from P - 1."""
        P = length - self.max_reply
        if P not in self.trainers:
            cfg = dataclasses.replace(self.train_cfg, score_from=P - 1)
            self.trainers[P] = Trainer(self.pretrained.model, cfg, trainable=self.trainable)
        return self.trainers[P]

    def reference_logp(self, ro: Rollout, frozen):
        """log pi_ref of every token under the initial parameters (the KL term's reference), at the
        sampling temperature; 0 before the reply (traceable). ``frozen``: ``frozen_inputs()``."""
        L = ro.tokens.shape[-1]
        model = nnx.merge(self.trainer.graphdef, frozen["reference"], frozen["rest"])
        flat = lambda x: x.reshape(-1, L)
        hidden = None if ro.hidden is None else ro.hidden.reshape((-1, L) + ro.hidden.shape[-1:])
        logp, _ = self.trainer_for(L).logprobs(model, flat(ro.tokens), flat(ro.mask), hidden)
        return jax.lax.stop_gradient(jnp.where(flat(ro.response_mask), logp, 0.0)).reshape(ro.tokens.shape)

    def credit_batch(self, ro: Rollout):
        if self.similarity > 0:  # similar state texts merged into one state (credit.similarity)
            return merge_similar(ro.batch, ro.obs_tokens, SimilarityConfig(threshold=self.similarity))
        return ro.batch

    def update_args(self, ro: Rollout, frozen) -> dict:
        ref = self.reference_logp(ro, frozen) if self.reference is not None else None
        return {"trainer": self.trainer_for(ro.tokens.shape[-1]), "ref_logp": ref, "rest": frozen["rest"]}

    def rollout_metrics(self, rollout, seconds: float) -> dict:
        """Reply length (tokens), seconds spent decoding replies and stepping games, reply tokens per
        second of decoding, the rest of the iteration (``update_s``: advantages, the update, building
        prompts), sampling programs compiled so far, the live rows' prompt tokens and the tokens the
        model ran (the rest came from the episodes' carried caches: ``ChatRolloutConfig.reuse_cache``)."""
        tok = self.pretrained.tokenizer
        replies = [len(tok.encode(t["reply"], add_special_tokens=False)) for ep in rollout.episodes for t in ep]
        timing = rollout.timing
        return {"reply_tokens": sum(replies) / max(len(replies), 1),
                "rollout/decode_s": timing["decode_s"], "rollout/env_s": timing["env_s"],
                "rollout/reply_tokens_per_s": sum(replies) / max(timing["decode_s"], 1e-9),
                "update_s": seconds - timing["decode_s"] - timing["env_s"],  # advantages, update, prompt building
                "rollout/compiles": float(rollout.compiles),
                "rollout/prompt_tokens": float(timing["prompt_tokens"]),  # the live rows' prompts
                "rollout/prefill_tokens": float(timing["prefill_tokens"])}  # what ran through the model


class LLMSetup(Setup):
    """``Setup`` for a pretrained policy: the same iteration and evaluation; its pieces built here (the
    model with adapters when ``lora_rank``, the trainer of the chosen parameters, the chat rollout) and
    its side of the iteration a ``ChatPolicy``."""

    def __init__(self, cfg: RunConfig, *, cache_dir: Optional[Path] = None, reuse_frozen: bool = True,
                 held_out: str = DEFAULT_HELD_OUT):
        """``reuse_frozen`` (training the top N blocks): the update starts from the frozen blocks'
        output the rollout recorded (True) or runs them again (False: the benchmarks' baseline);
        ``held_out``: a JAX environment's held-out pools (``Setup``)."""
        # the pieces in order, each from its part: tasks, policy, rollout, trainer, credit
        parts = self._tasks(cfg, cache_dir=cache_dir, held_out=held_out, chat=True)
        self.pretrained, trainable = pieces.chat_policy(parts.policy)
        self.model = self.pretrained.model
        top = parts.policy.train_layers
        if top and reuse_frozen:  # the blocks below are frozen: the rollout records their output
            self.model.capture_layer = len(self.model.layers) - top
        self.rollout_cfg = pieces.chat_rollout_config(parts.rollout)
        pieces.check_batch(parts, self.max_steps)
        train_cfg = pieces.train_config(parts.optim, iterations=parts.schedule.iterations, seed=parts.schedule.seed,
                                        pretrained=True, temperature=parts.rollout.temperature)
        self.trainer = Trainer(self.model, train_cfg, trainable=trainable)
        self.estimator, self.est_cfg = pieces.estimator(parts.credit)
        self.policy = ChatPolicy(self.pretrained, self.trainer, train_cfg, trainable, chat_env=self.env.chat_env,
                                 max_steps=self.max_steps, max_reply=self.rollout_cfg.max_reply,
                                 similarity=parts.credit.similarity, kl=parts.optim.kl_coef > 0)
        self._start()
