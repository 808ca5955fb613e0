"""A supervised warm start: next-token training on demonstrations, written as an ordinary run
directory that RL starts from (``RunConfig.init_from``; ``bepo-jax sft`` / ``train --init-from``).

RL on LLM agents starts from a competent, peaked policy (a pretrained or supervised model), not
from a uniform one. This stage makes such a policy for our token policies:

1. demonstrations: for the first ``demos`` training tasks of the run, one episode each of
   actions int32 [N, T] -- from the environment's ``demonstrations(tasks, noise=, seed=)``
   when it has a solver (Sokoban: a noisy shortest-path expert, ``envs.sokoban_solver``), or
   given by the user (``sft(..., demonstrations=(tasks, actions))``);
2. the episodes replayed in the environment (``rollout.make_replay``): every step's prompt as
   the rollout writes it and the demonstrated action's word + EOS as the response;
3. maximum likelihood on the response tokens (AdamW, ``epochs`` passes over the records in
   shuffled minibatches of ``batch_size``):

       L(theta) = - (1 / |R|) sum_{(n, j) in R} log pi_theta(x_{n, j} | x_{n, <j})

   over the response tokens R of the batch;
4. the run directory: ``config.json`` (the run config: the policy's architecture and the
   environment), ``checkpoints/0`` (the trained parameters in the RL trainer's state, so
   ``bepo-jax eval`` and ``load_run`` read it) and ``sft.json`` (the settings, the loss per
   epoch, the demonstrations' own success, and the policy's success before and after on the
   run's held-out and training tasks).

``noise`` (the share of demonstrated steps that take a uniformly random action) is how good
the cloned policy is: the warm start should succeed on about half of the held-out tasks, so
that RL has room to learn and failures to credit.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ...credit.configs import check_choice, check_int, check_range, with_dict_methods
from ..envs.registry import is_host_env
from ..models.interface import token_logprobs
from ..rl.checkpoint import Checkpointer
from ..rollouts.jitted import make_replay
from . import rundir
from .config import RunConfig
from .setup import Setup

# The kinds of mistake the demonstrations protocol (``env.demonstrations(..., corruption=)``) names; an environment's
# solver checks its own (Sokoban's: ``envs.sokoban_solver.CORRUPTIONS``, the same two).
CORRUPTIONS = ("step", "state")


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """noise: share of corrupted decisions in the demonstrations (0.5); corruption: "step" (each
    step a uniformly random action with probability noise: a broad clone) or "state" (a fixed
    wrong action at a share noise of the states: a peaked clone with systematic mistakes). demos:
    training tasks demonstrated, one episode each (0 = the run's whole pool). epochs (10),
    batch_size: records per step (256), learning_rate (1e-3): the supervised stage's AdamW.
    The demonstrations' and the minibatches' randomness come from the run config's seed."""

    noise: float = 0.5
    corruption: str = "step"
    demos: int = 0
    epochs: int = 10
    batch_size: int = 256
    learning_rate: float = 1e-3

    def __post_init__(self):
        n = "SFTConfig"
        check_range(n, "noise", self.noise, lo=0.0, hi=1.0)
        check_choice(n, "corruption", self.corruption, CORRUPTIONS)
        check_int(n, "demos", self.demos, lo=0)
        check_int(n, "epochs", self.epochs, lo=1)
        check_int(n, "batch_size", self.batch_size, lo=1)
        check_range(n, "learning_rate", self.learning_rate, lo=0.0, lo_open=True)


def expert_demonstrations(setup: Setup, n: int, config: SFTConfig, seed: int):
    """The first ``n`` training tasks of ``setup`` and the environment's demonstrations of them."""
    env = getattr(setup, "env", None)
    if env is None or not callable(getattr(env, "demonstrations", None)):
        name = type(env).__name__ if env is not None else setup.cfg.env
        raise ValueError(f"environment {name} has no solver (no demonstrations(tasks, noise=, seed=, corruption=) "
                         "method): "
                         "pass demonstrations=(tasks, actions) to sft() with actions int32 [N, max_steps] "
                         "(-1 after an episode ends), or give the environment such a method.")
    tasks = jax.tree_util.tree_map(lambda x: np.asarray(x)[:n], setup.train_tasks)
    return tasks, np.asarray(env.demonstrations(tasks, noise=config.noise, seed=seed, corruption=config.corruption),
                             np.int32)


def _records(setup: Setup, tasks, actions):
    """The replayed steps as flat records (tokens, mask, response mask) and the episodes' success."""
    T = setup.max_steps
    actions = np.asarray(actions, np.int32)
    if actions.ndim != 2 or actions.shape[1] != T:
        raise ValueError(f"demonstrations: actions must be int32 [N, {T}] (the environment's max_steps, -1 after "
                         f"an episode ends); got shape {actions.shape}.")
    n_actions = len(setup.env.action_words)
    if actions.min(initial=0) < -1 or actions.max(initial=0) >= n_actions:
        raise ValueError(f"demonstrations: actions must lie in [-1, {n_actions - 1}] (indices of "
                         f"{setup.env.action_words}, -1 = none); got {actions.min()}..{actions.max()}.")
    rep = jax.jit(make_replay(setup.env, setup.rollout_cfg))(jax.tree_util.tree_map(jnp.asarray, tasks), actions)
    keep = np.asarray(rep.valid & (jnp.asarray(actions) >= 0)).reshape(-1)
    L = rep.tokens.shape[-1]
    flat = lambda x: np.asarray(x).reshape(-1, L)[keep]
    return flat(rep.tokens), flat(rep.mask), flat(rep.response_mask), np.asarray(rep.success)


def nll(model, tokens, mask, response_mask):
    """Mean negative log-likelihood of the response tokens (the module docstring's L)."""
    logp, _ = token_logprobs(model(tokens, mask), tokens)
    w = response_mask.astype(jnp.float32)
    return -jnp.sum(logp * w) / jnp.maximum(jnp.sum(w), 1.0)


def sft(cfg: RunConfig, config: SFTConfig, out: str | Path, *, demonstrations=None, progress: bool = True) -> dict:
    """Train the warm start of ``cfg``'s policy on demonstrations and write its run directory
    ``out`` (module docstring). ``demonstrations``: ``(tasks, actions)`` to use instead of the
    environment's solver (tasks: a pytree of the environment's tasks with leading axis N;
    actions: int32 [N, max_steps]). Returns the ``sft.json`` summary."""
    out = Path(out)
    if is_host_env(cfg.env):
        raise ValueError(f"sft: environment {cfg.env!r} runs on the host (TextWorld); the warm start replays "
                         "demonstrations in a JAX environment.")
    with rundir.RunLock(out):
        if (out / "sft.json").exists():
            done = json.loads((out / "sft.json").read_text())
            if done["config"] == cfg.to_dict() and done["sft"] == config.to_dict():
                return done
            raise ValueError(f"{out} already holds a warm start of other settings (sft.json); choose another --out.")
        # a warm start killed before it finished (config.json, no sft.json) is trained again from the start if its
        # config is the same (prepare refuses another); what it left in checkpoints/ is its own and is replaced
        rundir.prepare(cfg, out, resume=(out / "config.json").exists())
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        return _sft(cfg, config, out, demonstrations, progress)


def _sft(cfg: RunConfig, config: SFTConfig, out: Path, demonstrations, progress: bool) -> dict:
    t0 = time.perf_counter()
    setup = Setup(cfg, held_out=rundir.held_out_pools(out))
    n = min(config.demos or setup.pool_size, setup.pool_size)
    tasks, actions = demonstrations if demonstrations is not None else expert_demonstrations(
        setup, n, config, cfg.seed)
    tokens, mask, resp, demo_success = _records(setup, tasks, actions)
    state = setup.trainer.init_state()
    before = (setup.evaluate(state.params, seed=cfg.seed), setup.evaluate(state.params, seed=cfg.seed, training=True))
    graphdef, rest = setup.trainer.graphdef, setup.trainer.rest
    tx = optax.adamw(config.learning_rate)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: nll(nnx.merge(graphdef, p, rest), *batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state = state.params, tx.init(state.params)
    rng = np.random.default_rng(cfg.seed)
    M, bs = tokens.shape[0], config.batch_size
    losses = []
    for epoch in range(config.epochs):
        order = rng.permutation(M)
        steps = max(1, -(-M // bs))
        order = np.resize(order, steps * bs)  # the last minibatch wraps around: one compiled shape
        total = 0.0
        for s in range(steps):
            idx = order[s * bs:(s + 1) * bs]
            params, opt_state, loss = step(params, opt_state, (tokens[idx], mask[idx], resp[idx]))
            total += float(loss)
        losses.append(total / steps)
        if progress:
            print(f"sft epoch {epoch + 1}/{config.epochs}: loss {losses[-1]:.4f}", flush=True)
    state = state._replace(params=params)
    after = (setup.evaluate(params, seed=cfg.seed), setup.evaluate(params, seed=cfg.seed, training=True))
    ckpt = Checkpointer(out / "checkpoints", max_to_keep=cfg.keep_checkpoints)
    try:
        ckpt.save(0, state, {"iteration": 0, "config": cfg.to_dict(), "sft": config.to_dict()})
    finally:
        ckpt.close()
    brief = lambda ev: {k: ev[k] for k in ("success_rate", "tasks", "ci95", "return")}
    summary = {"config": cfg.to_dict(), "sft": config.to_dict(), "demonstrations": int(len(demo_success)),
               "records": int(M), "demo_success": float(np.mean(demo_success)), "loss": losses,
               "held_out_before": brief(before[0]), "train_before": brief(before[1]),
               "held_out_after": brief(after[0]), "train_after": brief(after[1]),
               "held_out_per_task": after[0]["per_task"], "seconds": time.perf_counter() - t0}
    rundir.atomic_write(out / "sft.json", json.dumps(summary, indent=1))
    return summary
