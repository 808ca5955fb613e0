# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/bepo-jax/bepo_jax/blob/main/notebooks/04_credit_lab.ipynb)
#
# # Credit lab: every estimator against the exact advantage
#
# In a small environment the truth is computable: enumerate the reachable states,
# evaluate the sampling policy exactly (backward induction over the time limit), and
# compare each estimator's credit for a sampled step with the exact advantage
# A^pi_t(s_t, a_t) of that step. This notebook draws the exact model of the `key_door`
# world (a key that helps even in runs that fail later), one sampled group next to it,
# each estimator's credit against the truth, and how the agreement grows with the group
# size K. The contract is `docs/credit-lab.md` in the repository.

# %%
# Set-up (CPU, GPU or TPU runtime). A checkout with `make test` already has bepo_jax; elsewhere (Colab) set
# BEPO_JAX_SOURCE first (`%env BEPO_JAX_SOURCE=git+https://github.com/<you>/bepo_jax`, or an uploaded folder).
import importlib.util, os, subprocess, sys

if importlib.util.find_spec("bepo_jax") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", os.environ["BEPO_JAX_SOURCE"]])
    importlib.invalidate_caches()
    import bepo_jax_install  # installs the dependencies beside the runtime's own JAX (docs/notebooks.md)

    bepo_jax_install.install()
import jax
import matplotlib.pyplot as plt
import numpy as np
import bepo_jax as bj
from bepo_jax import lab, viz
from bepo_jax.lab.quality import LabConfig, credit_quality, spec
from bepo_jax.lab.sample import group_trajectories, sample_groups
from IPython.display import Markdown, display

print("JAX", jax.__version__, "devices:", jax.devices())
# CI runs this notebook at small sizes.
GROUPS = int(os.environ.get("BEPO_NB_GROUPS", 32))
BATCHES = 4 if GROUPS < 32 else 8

# %% [markdown]
# ## The exact model
#
# `enumerate_states(env, task, horizon)` walks every reachable state; `evaluate(model,
# probs, gamma)` gives V [H + 1, S], Q and A [H, S, A] for a time-independent policy
# (here uniform). Arrows are actions, coloured by the exact advantage at the step the
# state is first reached: taking the key (`left` in the hall) is worth +0.25 whatever
# happens on the bridge later.

# %%
env = lab.make_diagnostic("key_door")
model = lab.enumerate_states(env, 0)
pi = lab.uniform_policy(model)
ev = lab.evaluate(model, pi, gamma=1.0)
print(f"{model.num_states} states, {model.num_actions} actions, horizon {model.horizon}; "
      f"success probability {ev.success:.3f}")
fig, ax = plt.subplots(figsize=(10, 3.8))
viz.draw_model(model, ev, labels=env.views, ax=ax)
plt.show()

# %% [markdown]
# ## One sampled group next to the truth
#
# The same sampler the lab measures with: K trajectories from the start under pi, written
# as the rollouts write a `StepBatch` (observation keys, rewards, outcomes). On the left
# the group's empirical graph as Gated-BEPO sees it; on the right every record's credit
# from each estimator against its exact advantage.

# %%
smp = jax.device_get(sample_groups(model, pi, jax.random.key(3), num_groups=1, group_size=8))
trajs = group_trajectories(smp, 0, env.views)
estimators = ["grpo", "gigpo", "graphgpo", "gated_bepo"]
mask = np.asarray(smp.batch.mask[0])
t_idx = np.broadcast_to(np.arange(mask.shape[1]), mask.shape)
truth = ev.A[t_idx[mask], np.asarray(smp.state[0])[mask], np.asarray(smp.action[0])[mask]]
fig, axes = plt.subplots(1, 2, figsize=(15, 4))
viz.draw_group(trajs, ax=axes[0])
for name in estimators:
    x = np.asarray(bj.compute_advantages(name, smp.batch).advantage[0])[mask]
    axes[1].scatter(truth + np.random.default_rng(0).normal(0, 0.005, truth.shape), x, label=name, alpha=0.7)
axes[1].axhline(0, color="0.7"); axes[1].axvline(0, color="0.7")
axes[1].set_xlabel("exact A^pi of the step"); axes[1].set_ylabel("estimator's credit"); axes[1].legend()
plt.show()

rows = ["| traj | step | state | action | exact A | " + " | ".join(estimators) + " |",
        "|---|---|---|---|---|" + "---|" * len(estimators)]
adv = {n: np.asarray(bj.compute_advantages(n, smp.batch).advantage[0]) for n in estimators}
for k in range(mask.shape[0]):
    for t in range(int(mask[k].sum())):
        s, a = int(smp.state[0, k, t]), int(smp.action[0, k, t])
        rows.append(f"| {k} | {t} | {env.views[s]} | {env.action_words[a]} | {ev.A[t, s, a]:+.2f} | "
                    + " | ".join(f"{adv[n][k, t]:+.2f}" for n in estimators) + " |")
display(Markdown("\n".join(rows)))

# %% [markdown]
# ## The K sweep
#
# `credit_quality` repeats that comparison over independent batches (B groups each) and
# reports each metric as a mean over batches with a 95% Student-t half-width. The
# `oracle` row uses the exact advantage itself: the ceiling with these samples.

# %%
specs = [spec("grpo"), spec("gigpo"), spec("graphgpo"), spec("gated_bepo"), spec("bepo_mc")]
sweep = []
for K in (2, 4, 8, 16) if GROUPS >= 32 else (2, 8):  # CI: two group sizes
    r = credit_quality(model, pi, specs, LabConfig(group_size=K, num_groups=GROUPS, num_batches=BATCHES))
    sweep.append((K, r))
fig, axes = plt.subplots(1, 2, figsize=(13, 3.5))
for lab_name in [s.label for s in specs]:
    for ax, metric in zip(axes, ("pearson", "grad_cos")):
        m = [r["estimators"][lab_name][metric]["mean"] for _, r in sweep]
        e = [r["estimators"][lab_name][metric]["ci95"] for _, r in sweep]
        ax.errorbar([K for K, _ in sweep], m, yerr=e, marker="o", capsize=3, label=lab_name)
for ax, title in zip(axes, ("correlation with A^pi", "policy-gradient cosine")):
    ax.set_xscale("log", base=2); ax.set_xlabel("group size K"); ax.set_title(title); ax.grid(alpha=0.3)
axes[0].legend()
plt.show()
display(Markdown("| K | MC value RMSE | fixed-point RMSE |\n|---|---|---|\n" + "\n".join(
    f"| {K} | {r['values']['rmse_mc']['mean']:.3f} ± {r['values']['rmse_mc']['ci95']:.3f} | "
    f"{r['values']['rmse_fp']['mean']:.3f} ± {r['values']['rmse_fp']['ci95']:.3f} |" for K, r in sweep)))

# %% [markdown]
# ## Aliasing: one view, two rooms
#
# In `aliased` two hidden rooms show the same view; merging on the view pools their
# values and the fork's choice loses its credit. One step of history (`history=1`)
# separates them.

# %%
al_env = lab.make_diagnostic("aliased")
al = lab.enumerate_states(al_env, 0)
al_pi = lab.uniform_policy(al)
r = credit_quality(al, al_pi, [spec("gated_bepo"), spec("history_1", "gated_bepo", history=1), spec("grpo")],
                   LabConfig(group_size=8, num_groups=GROUPS, num_batches=BATCHES))
display(Markdown("| estimator | Pearson with A^pi | sign accuracy |\n|---|---|---|\n" + "\n".join(
    f"| {n} | {e['pearson']['mean']:.3f} ± {e['pearson']['ci95']:.3f} | {e['sign_acc']['mean']:.3f} |"
    for n, e in r["estimators"].items())))
fig, ax = plt.subplots(figsize=(9, 3.2))
viz.draw_model(al, lab.evaluate(al, al_pi), labels=al_env.views, ax=ax)
plt.show()

# %% [markdown]
# ## Does better credit mean faster learning? Exact tabular learning curves
#
# The lab measures credit for one fixed policy. `lab.learning` trains a tabular softmax
# policy with each estimator's policy gradient (K trajectories per group, every seed at
# once) and evaluates the new policy exactly after every update. Two starts: uniform, and
# a peaked one (Boltzmann over Q* at the temperature that succeeds half the time: the
# regime of a warm-started policy, where the gate can close). Bands: two standard errors
# over seeds (about 95%).
# The full study is `python -m experiments.tabular_learning` (docs/credit-lab.md).

# %%
from bepo_jax.lab.learning import LearningConfig, boltzmann_start, learning_curves

SEEDS = 40 if GROUPS < 32 else 200
learn_cfg = LearningConfig(iterations=20, seeds=SEEDS)
peaked, temp = boltzmann_start(model, 0.5)
starts = {"uniform": np.zeros((model.num_states, model.num_actions)), f"peaked (T = {temp:.2f})": peaked}
fig, axes = plt.subplots(1, 2, figsize=(13, 3.5), sharey=True)
for ax, (start, logits) in zip(axes, starts.items()):
    for name in ("grpo", "gigpo", "g2po", "gated_bepo"):
        curves = learning_curves(model, spec(name), logits, learn_cfg)
        m = curves.mean(0)
        h = 2.0 * curves.std(0, ddof=1) / np.sqrt(curves.shape[0])
        ax.plot(m, label=name)
        ax.fill_between(np.arange(len(m)), m - h, m + h, alpha=0.15)
    ax.set_title(f"{start} start"); ax.set_xlabel("update"); ax.grid(alpha=0.3)
axes[0].set_ylabel("exact success"); axes[0].legend()
plt.show()

# %% [markdown]
# ## The diagnostic protocol: decision density, with the gate open and closed
#
# `decisions` worlds have a fixed horizon of which a share are decisions (one action keeps the
# agent on track, the other loses the episode) and the rest routine (A^pi = 0 there). A lost
# decision shows at once (*visible*: the gate sees two successors) or only in the outcome
# (*hidden*: the views alias and the gate stays closed). Beside the correlation with A^pi, two
# scores of the protocol: the **partial correlation given the trajectory's return** (what the step
# credit knows beyond the outcome; GRPO's is 0 by construction) and **coverage** (the share of
# records where the step mechanism acts). The full sweep is `python -m experiments.credit_protocol`
# (docs/credit-lab.md).

# %%
from bepo_jax.agent.envs.diagnostic import decisions

rows = []
for visible in (True, False):
    for density in (0.25, 1.0):
        m = lab.enumerate_states(decisions(8, density, visible), 0)
        pi = np.full((m.num_states, 2), 0.25)
        pi[np.arange(m.num_states), np.asarray(m.depth) % 2] = 0.75  # the on-track action with probability 0.75
        rep = credit_quality(m, pi, [spec("grpo"), spec("gigpo"), spec("proxmo"), spec("ecpo"), spec("gated_bepo")],
                             LabConfig(group_size=8, num_groups=GROUPS, num_batches=BATCHES))
        for name, e in rep["estimators"].items():
            if name != "oracle":
                rows.append((("visible" if visible else "hidden"), density, name, e["partial_return"]["mean"],
                             e["coverage"]["mean"]))
display(Markdown("| branching | density | estimator | partial corr. given return | coverage |\n|---|---|---|---|---|\n"
                 + "\n".join(f"| {b} | {d:g} | {n} | {p:.3f} | {c:.2f} |" for b, d, n, p, c in rows)))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), sharey=True)
for ax, branching in zip(axes, ("visible", "hidden")):
    for name in ("grpo", "gigpo", "proxmo", "ecpo", "gated_bepo"):
        pts = [(d, p) for b, d, n, p, _ in rows if b == branching and n == name]
        ax.plot([d for d, _ in pts], [p for _, p in pts], marker="o", label=name)
    ax.set_title(f"{branching}: partial correlation given the return"); ax.set_xlabel("decision density")
    ax.grid(alpha=0.3)
axes[0].legend()
plt.show()
