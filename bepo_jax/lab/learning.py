"""Exact learning curves: a tabular softmax policy trained with each estimator's policy gradient.

The credit lab measures credit for a fixed policy; whether better credit means faster
learning is a different question. On an enumerated ``TabularModel`` the policy is a table
of logits theta [S, A], pi = softmax(theta). One iteration, for every seed at once (vmapped):

1. sample B groups of K trajectories from the task's start under pi (``sample._sample``,
   the lab's sampler: the rollouts' record format and outcome rule);
2. the estimator's advantages A_i on that StepBatch (its jittable kernel and config);
3. the policy-gradient step on the logits (REINFORCE with the estimator's credit):
       theta[s] += lr / (B K) * sum_{records i at s} A_i (onehot(a_i) - pi(. | s));
   with ``credit_scale="unit_rms"`` each seed's credit is first divided by its root mean square
   over the iteration's records, A_i / sqrt(mean_j A_j^2) (all-zero credit stays zero), so every
   estimator takes steps of one size and only the credit's direction differs;
4. the exact success probability of the new policy within the time limit, by backward
   induction on the model (P_H = 0; P_t(s) = sum_a pi(a|s) sum_m p(m|s,a) (success +
   (1 - ended) P_{t+1}(s'))), the same backup as ``exact.evaluate``'s success.

``learning_curves(model, spec, init_logits, cfg)`` returns the exact success before the
first update and after each one, per seed [seeds, iterations + 1]. Seeds share nothing
but the start; estimator arms given the same ``cfg.seed`` use the same keys (common
random numbers), so differences between arms can be paired per seed. ``boltzmann_start(model, success)`` gives the logits of a peaked start (Boltzmann
over Q* at the temperature that succeeds with probability ``success``): the regime of a
warm-started policy, where most states show one successor in a group.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..credit.configs import check_int, check_range
from .exact import boltzmann_policy, evaluate
from .model import TabularModel
from .quality import EstimatorSpec
from .sample import PaddedTables, _sample, padded_tables


CREDIT_SCALES = ("none", "unit_rms")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearningConfig:
    """iterations (40), num_groups B per iteration (4, all from the task's start),
    group_size K (8), learning_rate (0.3, on the logits), seeds (200), seed (0: the
    base key: iteration i samples with fold_in(key, i) split over the seeds),
    credit_scale ("none": each estimator's credit as it comes, its scale part of the step;
    "unit_rms": divided by its root mean square over the seed's records each iteration)."""

    iterations: int = 40
    num_groups: int = 4
    group_size: int = 8
    learning_rate: float = 0.3
    seeds: int = 200
    seed: int = 0
    credit_scale: str = "none"

    def __post_init__(self):
        n = "LearningConfig"
        check_int(n, "iterations", self.iterations, lo=1)
        check_int(n, "num_groups", self.num_groups, lo=1)
        check_int(n, "group_size", self.group_size, lo=2)
        check_range(n, "learning_rate", self.learning_rate, lo=0.0)
        check_int(n, "seeds", self.seeds, lo=1)
        check_int(n, "seed", self.seed, lo=0)
        if self.credit_scale not in CREDIT_SCALES:
            raise ValueError(f"LearningConfig.credit_scale={self.credit_scale!r}; choose one of {', '.join(CREDIT_SCALES)}.")


def _tables(model: TabularModel) -> PaddedTables:
    return PaddedTables(*(jnp.asarray(x) for x in padded_tables(model)))


def success_probability(tables: PaddedTables, pi: Float[Array, "S A"], horizon: int) -> Array:
    """P_0(start): the exact probability of success within ``horizon`` steps (module docstring, 4)."""
    cont = (~tables.ended).astype(jnp.float32)
    win = tables.success.astype(jnp.float32)

    def back(_, p_next):
        q = (tables.prob * (win + cont * p_next[tables.next_state])).sum(-1)
        return (pi * q).sum(-1)

    p = jax.lax.fori_loop(0, horizon, back, jnp.zeros(pi.shape[0], jnp.float32))
    return p[tables.start]


def _policy_gradient(theta, state, action, adv, valid, n_traj):
    pi = jax.nn.softmax(theta, axis=-1)
    S, A = theta.shape
    s = jnp.where(valid, state, 0).reshape(-1)
    a = jnp.where(valid, action, 0).reshape(-1)
    w = jnp.where(valid, adv, 0.0).reshape(-1)
    onehot = jax.nn.one_hot(a, A)
    g = jnp.zeros_like(theta).at[s].add(w[:, None] * (onehot - pi[s]))
    return g / n_traj


def per_seed_mean(x: Float[Array, "seeds B K T"], valid) -> Float[Array, "seeds 1 1 1"]:
    """Each seed's mean of x over its valid records (0 where it has none)."""
    axes = tuple(range(1, x.ndim))
    return jnp.where(valid, x, 0.0).sum(axes, keepdims=True) / jnp.maximum(valid.sum(axes, keepdims=True), 1)


def unit_rms(adv: Float[Array, "seeds B K T"], valid) -> Float[Array, "seeds B K T"]:
    """Each seed's credit divided by its root mean square over its valid records (zero stays zero)."""
    rms = jnp.sqrt(per_seed_mean(adv * adv, valid))
    return jnp.where(rms > 0, adv / jnp.where(rms > 0, rms, 1.0), 0.0)


def _run(tables: PaddedTables, theta0, key, kernel, est_cfg, *, seeds, num_groups, group_size, horizon, iterations, lr,
         scale="none"):
    """Every seed at once: sampling, gradients and evaluation vmapped over the seeds; the estimator
    once per iteration on all seeds' groups together (groups are independent, and a vmapped kernel
    would turn its state-bucket switch into a select over every bucket)."""
    sample = jax.vmap(lambda k, log_pi: _sample(k, log_pi, tables.next_state, tables.log_prob, tables.reward,
                                                tables.success, tables.ended, tables.obs_key, tables.start,
                                                num_groups=num_groups, group_size=group_size, horizon=horizon))
    succ = jax.vmap(lambda th: success_probability(tables, jax.nn.softmax(th, axis=-1), horizon))
    grad = jax.vmap(lambda th, s, a, adv, m: _policy_gradient(th, s, a, adv, m, num_groups * group_size))

    def step(thetas, k):
        smp = sample(jax.random.split(k, seeds), jax.nn.log_softmax(thetas, axis=-1))
        flat = jax.tree_util.tree_map(lambda x: x.reshape((seeds * num_groups,) + x.shape[2:]), smp.batch)
        adv = kernel(flat, est_cfg).advantage.reshape(smp.batch.mask.shape)
        if scale == "unit_rms":
            adv = unit_rms(adv, smp.batch.mask)
        thetas = thetas + lr * grad(thetas, smp.state, smp.action, adv, smp.batch.mask)
        mass = per_seed_mean((adv != 0).astype(jnp.float32), smp.batch.mask).reshape(seeds)  # records with credit
        return thetas, (succ(thetas), mass)

    thetas = jnp.broadcast_to(theta0, (seeds,) + theta0.shape)
    first = succ(thetas)
    # iteration i of every seed uses key fold_in(base, i) split over the seeds: arms with one base key share them
    its = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(iterations))
    _, (curve, mass) = jax.lax.scan(step, thetas, its)
    return jnp.concatenate([first[None], curve]).T, mass.T


_run_jit = jax.jit(_run, static_argnames=("kernel", "seeds", "num_groups", "group_size", "horizon", "iterations",
                                          "scale"))


def learning_curves(model: TabularModel, estimator: EstimatorSpec, init_logits, cfg: LearningConfig = LearningConfig(),
                    *, with_mass: bool = False):
    """Exact success before and after every update, per seed (module docstring): float [seeds, iterations + 1];
    with ``with_mass``, also the credit mass of every update, float [seeds, iterations]: the share of the
    sampled records whose credit is not 0 (with the number of updates, equal for every arm, the effective
    sample size a learning comparison must report)."""
    theta0 = np.asarray(init_logits, np.float64)
    if theta0.shape != (model.num_states, model.num_actions):
        raise ValueError(f"init_logits has shape {theta0.shape}; want [num_states, num_actions] = "
                         f"{(model.num_states, model.num_actions)}.")
    if not np.all(np.isfinite(theta0)):
        raise ValueError("init_logits must be finite (use a large negative number, not -inf, for a ruled-out action).")
    tables = _tables(model)
    pad = np.zeros((tables.next_state.shape[0], model.num_actions), np.float32)
    pad[: model.num_states] = theta0
    from ..credit.estimators.registry import get_estimator

    out = _run_jit(tables, jnp.asarray(pad), jax.random.PRNGKey(cfg.seed), get_estimator(estimator.name).kernel,
                   estimator.config(), seeds=cfg.seeds, num_groups=cfg.num_groups, group_size=cfg.group_size, horizon=int(model.horizon),
                   iterations=cfg.iterations, lr=float(cfg.learning_rate), scale=cfg.credit_scale)
    curves, mass = (np.asarray(x, np.float64) for x in out)
    return (curves, mass) if with_mass else curves


def boltzmann_start(model: TabularModel, success: float = 0.5, *, tol: float = 0.01) -> tuple[np.ndarray, float]:
    """Logits of the Boltzmann policy over Q* whose exact success is ``success`` (+- ``tol``),
    and its temperature, by bisection on log-temperature. Raises when even the uniform
    policy succeeds more often, or the greedy one less often, than asked."""
    check_range("boltzmann_start", "success", success, lo=0.0, hi=1.0)
    rate = lambda temp: evaluate(model, boltzmann_policy(model, temp)).success
    lo, hi = np.log(1e-3), np.log(1e3)  # low temperature: near greedy (high success); high: near uniform
    if rate(np.exp(hi)) > success + tol or rate(np.exp(lo)) < success - tol:
        raise ValueError(f"boltzmann_start: success {success} is outside what Boltzmann policies on {model.name} "
                         f"reach ({rate(np.exp(hi)):.3f} near uniform to {rate(np.exp(lo)):.3f} near greedy).")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        r = rate(np.exp(mid))
        if abs(r - success) <= tol:
            break
        lo, hi = (mid, hi) if r > success else (lo, mid)
    probs = boltzmann_policy(model, float(np.exp(mid)))
    return np.log(np.maximum(probs, 1e-30)), float(np.exp(mid))


def iterations_to(curves: np.ndarray, level: float) -> np.ndarray:
    """Per seed, the first iteration whose success is >= ``level`` (-1 where it never is)."""
    hit = curves >= level
    return np.where(hit.any(1), hit.argmax(1), -1)
