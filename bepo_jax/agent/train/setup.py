"""A run: its pieces (``train.pieces``, each from its part of the config), the iteration written once
(``Setup.iterate``) over the one small interface a policy implements (``PolicySide``: the character
policy here, a pretrained chat model in ``llm_setup``), and evaluation.

    for it in 1..iterations:
        tasks  <- B tasks from the training pool (K trajectories each, identical resets)
        rollout -> StepBatch (+ tokens, masks, old log-probs)
        A      <- estimator(StepBatch)              (per step, broadcast to response tokens)
        state  <- Trainer update (PPO clip, AdamW)

For JAX environments (Sokoban, the maze, a registered one) the task draw, the rollout,
the advantages and the update are ONE jitted program per iteration (PureJaxRL style);
for host environments (TextWorld) the host loop rolls out and one jitted program
computes the advantages and the update.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Iterator, Optional, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from ..envs.pools import DEFAULT_HELD_OUT
from ..rollouts.memory import release
from ..rl.train_step import Trainer, TrainState, UpdateBatch
from ..rollouts.jitted import Rollout, prompt_length
from ..rollouts.jitted import make_rollout as make_jitted_rollout
from ...credit.tokens import to_token_advantages
from . import pieces
from .config import RunConfig
from .init_from import earlier_env_parts, load_initial_params
from .pieces import held_out_pool
from .report import mean_ci


def pool_digests(cfg: RunConfig, *, pools: str = DEFAULT_HELD_OUT, cache_dir: Optional[Path] = None) -> dict:
    """What fixes a run's tasks, as two digests: sha256 over the task signatures (``task_signatures``:
    a JAX environment's levels, a TextWorld game's content) of its training pool and of its first
    ``eval_tasks`` held-out tasks (``held_out_pool``; TextWorld: ``TextWorldRun.held_out``, generating the
    games into ``cache_dir`` when not there), in order. A recorded result carries them
    (``experiments/record_main_job.py``, ``experiments/llm_learning.py``), and a test recomputes them from
    the current code, so a change to either pool cannot leave the result quietly stale."""
    import hashlib

    t = pieces.tasks(cfg.parts.env, n_eval=cfg.eval_tasks, earlier=earlier_env_parts(cfg), cache_dir=cache_dir,
                     held_out=pools)
    env, train, held = t.env, t.train, t.eval_pool
    if not hasattr(env, "task_signatures"):
        raise ValueError(f"pool_digests: environment {cfg.env!r} has no task_signatures; its pools cannot be digested.")
    one = lambda tasks: hashlib.sha256("\n".join(env.task_signatures(tasks)).encode()).hexdigest()
    return {"train": one(train), "held_out": one(held)}


class PolicySide(Protocol):
    """What an iteration asks of its policy: the one small interface the character policy
    (``CharacterPolicy``) and a pretrained chat model (``llm_setup.ChatPolicy``) each implement;
    ``Setup.iterate`` is the iteration, written once for both."""

    def make_rollout(self, config, *, evaluation: bool = False):
        """A rollout ``(params, tasks, key) -> Rollout`` of ``config``'s episodes; ``evaluation``: one that
        records only what scoring needs."""

    def frozen_inputs(self):
        """The arrays the update reads but does not train (an argument of the jitted update, never a
        constant compiled into it), or None."""

    def credit_batch(self, ro: Rollout):
        """The StepBatch the estimator reads (traceable)."""

    def update_args(self, ro: Rollout, frozen) -> dict:
        """``Setup.learn_from``'s keywords for this rollout: the trainer of its shape, the KL reference's
        log-probs, the frozen parameters (traceable)."""

    def rollout_metrics(self, rollout, seconds: float) -> dict:
        """The host's numbers of an iteration that took ``seconds``, read from ``rollout`` (the object
        ``make_rollout`` returned)."""


class CharacterPolicy:
    """The character policy's side of an iteration (``PolicySide``): its rollouts (one jitted program
    with a JAX environment, the host loop with TextWorld), every parameter trained, the rollout's own
    StepBatch for the estimator, the run's trainer."""

    def __init__(self, model, env, host: bool):
        self.model, self.env, self.host = model, env, host

    def make_rollout(self, config, *, evaluation: bool = False):
        if self.host:
            from ..rollouts.host import make_host_rollout

            return make_host_rollout(self.model, config=config, **self.env.rollout_args())
        return make_jitted_rollout(self.model, self.env, config)

    def frozen_inputs(self):
        return None

    def credit_batch(self, ro: Rollout):
        return ro.batch

    def update_args(self, ro: Rollout, frozen) -> dict:
        return {}

    def rollout_metrics(self, rollout, seconds: float) -> dict:
        return {}


class Setup:
    """A run's pieces (``train.pieces``, each from its part of the config) and its iteration."""

    def __init__(self, cfg: RunConfig, *, cache_dir: Optional[Path] = None, env=None,
                 held_out: str = DEFAULT_HELD_OUT):
        """``env``: a JaxEnv instance to use instead of building ``cfg.env`` (the name is
        then only a label in ``config.json``); ``held_out``: the held-out pools (``HELD_OUT_POOLS``;
        an existing run's kind: ``rundir.held_out_pools``)."""
        # the pieces in order, each from its part: tasks, rollout, policy, trainer, credit
        parts = self._tasks(cfg, cache_dir=cache_dir, held_out=held_out, instance=env)
        if self.host:
            word = self.env.word_width
            P = prompt_length(self.env.obs_len, parts.rollout.prompt_history, word, self.env.task_len)
        else:
            word = max(len(w) for w in self.env.action_words)
            P = prompt_length(self.env.obs_len, parts.rollout.prompt_history, word)
        self.rollout_cfg = pieces.char_rollout_config(parts.rollout, word=word)
        self.model = pieces.char_policy(parts.policy, context=P + self.rollout_cfg.max_response)
        # the rollouts' responses start at position P (prompt + response layout)
        self.trainer = Trainer(self.model, pieces.train_config(parts.optim, iterations=parts.schedule.iterations,
                                                               seed=parts.schedule.seed, pretrained=False,
                                                               score_from=P - 1))
        self.estimator, self.est_cfg = pieces.estimator(parts.credit)
        self.policy: PolicySide = CharacterPolicy(self.model, self.env, self.host)
        self._start()

    def _tasks(self, cfg: RunConfig, *, cache_dir: Optional[Path], held_out: str, instance=None,
               chat: bool = False):
        """The run's config, its parts and its tasks (``pieces.tasks``) on this object, the first piece of
        every setup; returns the parts."""
        self.cfg, self.parts, self.held_out = cfg, cfg.parts, held_out
        self.earlier = earlier_env_parts(cfg)  # the env parts of the runs it starts from (init_from)
        self.env, self.host, self.train_tasks, self.pool_size, self.max_steps, self.eval_pool = pieces.tasks(
            self.parts.env, n_eval=self.parts.schedule.eval_tasks, earlier=self.earlier, cache_dir=cache_dir,
            held_out=held_out, instance=instance, chat=chat)
        return self.parts

    def _start(self) -> None:
        """The run's rollout, and the programs compiled on first use."""
        self.rollout = self.policy.make_rollout(self.rollout_cfg)
        self._iteration = None
        self._update = None
        self._eval = {}
        self._rollouts = {}

    def rollout_for(self, episodes: int = 0, *, evaluation: bool = False):
        """The run's rollout with ``episodes`` episodes per task: the run's own (its programs compiled) for
        0 or the group size, else one built once per number (an evaluation's ``eval_episodes``).
        ``evaluation``: an evaluation's, built apart when the run's rollout records what only the update
        reads (a chat rollout's ``capture``: the frozen blocks' output)."""
        K = episodes or self.rollout_cfg.group_size
        lean = evaluation and getattr(self.rollout, "capture", False)
        if K == self.rollout_cfg.group_size and not lean:
            return self.rollout
        if (K, lean) not in self._rollouts:
            self._rollouts[K, lean] = self.policy.make_rollout(dataclasses.replace(self.rollout_cfg, group_size=K),
                                                               evaluation=lean)
        return self._rollouts[K, lean]

    def init_state(self) -> TrainState:
        """The run's first state: the trainer's fresh state, with the parameters of
        ``cfg.init_from`` when it names a warm start (``train.init_from``)."""
        state = self.trainer.init_state()
        return load_initial_params(self.cfg, self.trainer, state) if self.cfg.init_from else state

    # -- one iteration ------------------------------------------------------------------
    def advantages(self, batch, credit: tuple = ()):
        """The estimator's output on a StepBatch (per group: any number of groups); ``credit``: the
        kernel's further inputs (``credit_inputs``)."""
        return self.estimator.kernel(batch, self.est_cfg, *credit)

    def credit_inputs(self, ro: Rollout) -> tuple:
        """What the estimator's kernel reads beyond the StepBatch, made on the host from the iteration's
        rollout: an estimator that reads the states' texts (the registry's ``text_inputs``: ProxMO's soft
        grouping, their TF-IDF, as its authors' code does) gets them from the host rollout's
        ``state_texts``. Every other estimator, and the jitted rollouts (no texts: ProxMO then sees each
        distinct observation as a word of its own), read nothing more."""
        make = self.estimator.text_inputs
        if not self.host or make is None:
            return ()
        return make(self.rollout.state_texts, np.asarray(ro.batch.mask), self.est_cfg)

    def frozen_inputs(self):
        """The arrays the update reads but does not train (``PolicySide.frozen_inputs``)."""
        return self.policy.frozen_inputs()

    def _learn(self, state: TrainState, ro: Rollout, frozen=None, credit: tuple = ()):
        """Credit, the update, and the iteration's metrics (traceable): the estimator on the policy's
        StepBatch of the rollout, then ``learn_from`` with the policy's trainer and inputs. ``frozen``:
        what ``frozen_inputs`` returned; ``credit``: what ``credit_inputs`` returned."""
        frozen = self.frozen_inputs() if frozen is None else frozen
        out = self.advantages(self.policy.credit_batch(ro), credit)
        return self.learn_from(state, ro, out, **self.policy.update_args(ro, frozen))

    def learn_from(self, state: TrainState, ro: Rollout, out, *, trainer: Optional[Trainer] = None, ref_logp=None,
                   rest=None):
        """The update and the iteration's metrics given the estimator's output (traceable).
        ``trainer``: another trainer of the same parameters (default the run's); ``ref_logp``
        [B, K, T, L]: the reference policy's log-probs for the KL term; ``rest``: the parameters
        that do not train (``Trainer.update_fn``)."""
        adv = to_token_advantages(out.advantage, ro.response_mask)
        L = ro.tokens.shape[-1]
        flat = lambda x: None if x is None else x.reshape(-1, L)
        hidden = None if ro.hidden is None else ro.hidden.reshape((-1, L) + ro.hidden.shape[-1:])
        state, m = (trainer or self.trainer).update_fn(state, UpdateBatch(
            flat(ro.tokens), flat(ro.mask), flat(ro.response_mask), flat(ro.old_logp), flat(adv), flat(ref_logp),
            hidden), rest)
        valid = ro.batch.mask
        m = dict(m)
        m["success_rate"] = jnp.mean(ro.success.astype(jnp.float32))
        # groups whose trajectories disagree on the outcome: where outcome credit says anything at all
        wins = jnp.sum(ro.success.astype(jnp.int32), axis=-1)
        m["groups/mixed_share"] = jnp.mean(((wins > 0) & (wins < ro.success.shape[-1])).astype(jnp.float32))
        m["return"] = jnp.mean(jnp.sum(ro.batch.reward, axis=-1))
        m["invalid_rate"] = jnp.sum((ro.actions < 0) & valid) / jnp.maximum(jnp.sum(valid), 1)
        m["episode_length"] = jnp.mean(jnp.sum(valid, axis=-1).astype(jnp.float32))
        m["env_steps"] = jnp.sum(valid)
        m["step_advantage_std"] = jnp.std(jnp.where(valid, out.advantage, 0.0))
        m["step_advantage_abs_max"] = jnp.max(jnp.abs(jnp.where(valid, out.advantage, 0.0)))
        if not self.host:  # the sampled actions: a collapsing policy shows here, not in the token entropy
            words = self.env.action_words
            counts = action_counts(ro.actions, valid, len(words))
            share = counts / jnp.maximum(jnp.sum(counts), 1.0)
            m["actions/entropy"] = -jnp.sum(jnp.where(share > 0, share * jnp.log(jnp.where(share > 0, share, 1.0)), 0.0))
            for a, w in enumerate(words):
                m[f"actions/share_{w}"] = share[a]
        diag = getattr(out, "diagnostics", None)
        if diag is not None:
            m["graph/states"] = jnp.mean(diag.num_states.astype(jnp.float32))
            m["graph/gated_share"] = jnp.mean(diag.gated_share)
            m["graph/out_degree"] = jnp.mean(diag.mean_out_degree)  # distinct successors per state
            m["graph/iterations_mean"] = jnp.mean(diag.iterations.astype(jnp.float32))
            m["graph/iterations_max"] = jnp.max(diag.iterations).astype(jnp.float32)
            m["graph/converged_share"] = jnp.mean(diag.converged.astype(jnp.float32))
            m["graph/overflow_share"] = jnp.mean(diag.overflow.astype(jnp.float32))
        invalid = diag.invalid if diag is not None else getattr(out, "invalid", None)
        if invalid is not None:
            m["invalid_groups"] = jnp.sum(invalid != 0).astype(jnp.float32)
        return state, m

    def _draw(self, key):
        B = self.parts.schedule.groups
        idx = jax.random.choice(key, self.pool_size, (B,), replace=self.pool_size < B)
        return idx

    def iteration_key(self, it: int):
        """The PRNG key of iteration ``it`` (task draw and rollout), from the run's seed."""
        return jax.random.fold_in(jax.random.PRNGKey(self.parts.schedule.seed), it)

    def rollout_fn(self, state: TrainState, tasks, key) -> Rollout:
        """The iteration's rollout (JAX environments): draw B of ``tasks`` with ``key``'s
        first half, roll them out with its second."""
        k_task, k_roll = jax.random.split(key)
        chosen = jax.tree_util.tree_map(lambda x: x[self._draw(k_task)], tasks)
        return self.rollout(state.params, chosen, k_roll)

    def iteration_fn(self, state: TrainState, tasks, key):
        """One fused iteration as a pure function (JAX environments): draw B of ``tasks``,
        roll out, compute advantages, update. Traceable (``multiseed`` vmaps its parts)."""
        return self._learn(state, self.rollout_fn(state, tasks, key))

    def iterate(self, state: TrainState, it: int):
        """One iteration, for every policy: (state, metrics as floats).

            key            <- fold_in(seed, it)
            tasks          <- B of the training pool              (key's first half)
            ro             <- rollout(params, tasks)              (its second half)
            out            <- estimator(policy.credit_batch(ro))
            state, metrics <- update(state, ro, out)              (policy.update_args: trainer, KL, frozen)
            metrics        += policy.rollout_metrics               (the host's numbers: timings, reply lengths)

        With a JAX environment the draw, rollout, credit and update are one jitted program
        (``iteration_fn``); on the host the rollout runs there and one jitted program (``_learn``) does
        the credit and the update."""
        t0 = time.perf_counter()
        key = self.iteration_key(it)
        if not self.host:
            if self._iteration is None:
                self._iteration = jax.jit(self.iteration_fn, donate_argnums=(0,))
                self._tasks = jax.tree_util.tree_map(jnp.asarray, self.train_tasks)
            state, m = self._iteration(state, self._tasks, key)
        else:
            k_task, k_roll = jax.random.split(key)
            idx = np.asarray(self._draw(k_task))
            self.last_rollout = None  # the last iteration's: not kept through this one's rollout
            ro = self.last_rollout = self.rollout(state.params, [self.train_tasks[i] for i in idx], k_roll)
            if self._update is None:
                self._update = jax.jit(self._learn, donate_argnums=(0,))
            state, m = self._update(state, ro, self.frozen_inputs(), self.credit_inputs(ro))
            jax.block_until_ready(state)
            release()  # the update's freed memory back to the system before the next rollout (rollouts.memory)
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        m.update(self.policy.rollout_metrics(self.rollout, time.perf_counter() - t0))
        return state, m

    def held_out_tasks(self, n: int):
        """The run's first ``n`` held-out tasks (TextWorld: game paths; JAX environments: a pytree
        of arrays), drawn with ``seed + EVAL_SEED_OFFSET`` and disjoint in content from the training
        pools (``held_out_pool``); ``eval_pool`` holds the first ``eval_tasks``."""
        if n == self.parts.schedule.eval_tasks:
            return self.eval_pool
        if self.host:
            return self.env.held_out(n)
        return held_out_pool(self.env, self.parts.env, n, self.train_tasks, pools=self.held_out, earlier=self.earlier)

    def eval_tasks(self, *, n_tasks: Optional[int] = None, training: bool = False):
        """The tasks an evaluation runs on, on the host (TextWorld: game paths; JAX environments: a
        pytree of arrays): the first ``n_tasks`` (default ``eval_tasks``; at most the pool) training
        tasks, or held-out tasks."""
        n = n_tasks or self.parts.schedule.eval_tasks
        if not training:
            return self.held_out_tasks(n)
        if self.host:
            return self.train_tasks[:n]
        return jax.tree_util.tree_map(lambda x: x[: min(n, self.pool_size)], self.train_tasks)

    def eval_pool_for(self, *, n_tasks: Optional[int] = None, training: bool = False):
        """``eval_tasks`` of a JAX environment as device arrays."""
        return jax.tree_util.tree_map(jnp.asarray, self.eval_tasks(n_tasks=n_tasks, training=training))

    def task_ids_of(self, tasks) -> list[str]:
        """The content ids (``envs.pools.task_ids``) of ``tasks`` (``eval_tasks``), in order: recorded with
        every evaluation, so "the same games" can be checked later."""
        from ..envs.pools import task_ids

        return task_ids(self.env, tasks if self.host else jax.tree_util.tree_map(np.asarray, tasks))

    def evaluate(self, params, *, n_tasks: Optional[int] = None, seed: int = 0, training: bool = False) -> dict:
        """Success rate of the policy (``eval_episodes`` samples per task, default the group size K, at
        the run's temperature) on ``n_tasks`` (default ``eval_tasks``) held-out tasks, or on the first ``n_tasks``
        training tasks (``training``; at most the pool), with the tasks' ids (``task_ids_of``).
        TextWorld's held-out games are the first ``n_tasks`` of the run's held-out sequence
        (generated when not cached); host environments play ``EVAL_BATCH`` tasks at a time."""
        key = jax.random.PRNGKey(seed)
        tasks = self.eval_tasks(n_tasks=n_tasks, training=training)
        ids = self.task_ids_of(tasks)
        K = self.parts.episodes_per_evaluation
        if self.host:  # EVAL_BATCH tasks at a time (bounded memory); the first batch with ``key`` itself
            success, reward = [], []
            for o in rollouts_in_batches(self.rollout_for(K, evaluation=True), params, tasks, key, EVAL_BATCH):
                success.append(np.asarray(o.success))
                reward.append(np.asarray(o.batch.reward))
                del o  # not held while the next batch rolls out
            return evaluation(np.concatenate(success), np.concatenate(reward), ids)
        if K not in self._eval:
            self._eval[K] = jax.jit(self.rollout_for(K))
        ro = self._eval[K](params, jax.tree_util.tree_map(jnp.asarray, tasks), key)
        return evaluation(ro.success, ro.batch.reward, ids)


EVAL_BATCH = 16  # host environments' evaluation: tasks rolled out together


def rollouts_in_batches(rollout, params, tasks, key, batch: int) -> Iterator:
    """``rollout`` over ``tasks`` ``batch`` at a time (bounded memory: each batch's rollout is made when
    the caller asks for it, so a caller that keeps only its numbers holds one at a time): the batch
    from task i with ``key`` itself for i = 0 and ``fold_in(key, i)`` after, so up to ``batch`` tasks
    roll out as in one call."""
    for i in range(0, len(tasks), batch):
        yield rollout(params, tasks[i:i + batch], key if not i else jax.random.fold_in(key, i))


def action_counts(actions, valid, n_actions: int):
    """How often each of ``n_actions`` actions was sampled on the valid steps (float32
    [n_actions]; invalid parses, -1, count for none). Traceable."""
    hits = (actions[..., None] == jnp.arange(n_actions)) & valid[..., None]
    return jnp.sum(hits, axis=tuple(range(valid.ndim))).astype(jnp.float32)


def evaluation(success, reward, task_ids: Optional[list[str]] = None) -> dict:
    """An evaluation's numbers from its rollout: success [tasks, K], reward [tasks, K, T]; ``ci95``
    is the half-width of the 95% t-interval over tasks, None for one task (no interval, not 0);
    ``task_ids`` (the tasks' content ids, in order) recorded with them when given."""
    s = np.asarray(success, np.float64)
    per_task = s.mean(axis=1)
    ci = mean_ci(per_task)[1]
    return {"success_rate": float(s.mean()), "tasks": int(s.shape[0]), "ci95": None if math.isnan(ci) else ci,
            "return": float(np.asarray(reward).sum(-1).mean()), "per_task": [float(x) for x in per_task],
            **({"task_ids": list(task_ids)} if task_ids else {})}
