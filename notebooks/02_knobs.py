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
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/bepo-jax/bepo_jax/blob/main/notebooks/02_knobs.ipynb)
#
# # Knobs: how lam, w, eta_gated, gamma and the history-aware key move the credit
#
# Same groups as the explorer; one knob at a time, everything else at the documented
# defaults. Sliders where `ipywidgets` is available, plain plots otherwise. At the end:
# how fast the mean-backup fixed point converges.

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
import bepo_jax as bj
from bepo_jax import viz
from bepo_jax.credit.builders import Trajectory
from bepo_jax.demo import DEMO_GROUPS
from bepo_jax.credit.types import SUCCESS, FAILURE, TRUNCATED
from IPython.display import Markdown, display

print("JAX", jax.__version__, "devices:", jax.devices())

# %%
import numpy as np

batch = bj.batch_from_trajectories([DEMO_GROUPS[n] for n in DEMO_GROUPS])
names = list(DEMO_GROUPS)
base = bj.GatedBEPOConfig()
print(base)


def credit(**overrides):
    """Gated-BEPO advantages [B, K, T] with config overrides (numeric knobs are traced: no recompiles)."""
    return np.asarray(bj.compute_advantages("gated_bepo", batch, **overrides).advantage)


# %% [markdown]
# ## One knob at a time
#
# Each panel: the credit of the first trajectory's steps in the group "useful step
# inside a failed trajectory" (t = 0, 1, 2) and of the failed trajectory's useful step
# (`key`, trajectory 1, t = 1) as the knob moves.

# %%
knobs = {"lam": np.linspace(0, 1, 11), "w": np.linspace(0, 2, 11), "eta_gated": np.linspace(0, 1, 11),
         "gamma": np.linspace(0.5, 1, 11)}
fig, axes = plt.subplots(1, 4, figsize=(16, 3.2))
for ax, (knob, values) in zip(axes, knobs.items()):
    curves = np.stack([credit(**{knob: float(v)})[0] for v in values])  # [n, K, T]
    for t in range(3):
        ax.plot(values, curves[:, 0, t], marker="o", ms=3, label=f"success run, t={t}")
    ax.plot(values, curves[:, 1, 1], "k--", label="failed run's 'key' step")
    ax.axvline(getattr(base, knob), color="0.7", lw=0.8)
    ax.set_title(knob)
    ax.set_xlabel(knob)
axes[0].set_ylabel("advantage")
axes[0].legend(fontsize=7)
plt.tight_layout()
plt.show()

# %% [markdown]
# `lam`, `w` and `eta_gated` act only where the gate is open. With `w = 0` and
# `eta_gated = 1` Gated-BEPO is exactly its outcome credit `a_out` (check it):

# %%
out0 = bj.compute_advantages("gated_bepo", batch, w=0.0, eta_gated=1.0)
np.testing.assert_allclose(np.asarray(out0.advantage), np.asarray(out0.a_out), atol=1e-6)
print("w = 0, eta_gated = 1  ==  outcome credit: ok")

# %% [markdown]
# ## Interactive (where the runtime supports widgets)

# %%
try:
    import ipywidgets as widgets

    def show(lam=base.lam, w=base.w, eta_gated=base.eta_gated, gamma=base.gamma, group=0):
        rows = viz.credit_table(DEMO_GROUPS[names[group]], estimators=("grpo", "gated_bepo"),
                                configs={"gated_bepo": dict(lam=lam, w=w, eta_gated=eta_gated, gamma=gamma)})
        viz.plot_credit(rows, estimators=("grpo", "gated_bepo"), title=names[group])
        plt.show()

    widgets.interact(show, lam=(0.0, 1.0, 0.05), w=(0.0, 2.0, 0.1), eta_gated=(0.0, 1.0, 0.05),
                     gamma=(0.5, 1.0, 0.01), group=(0, len(names) - 1))
except ImportError:
    print("ipywidgets is not installed: the plots above show the same sweeps.")

# %% [markdown]
# ## The history-aware key
#
# With `history=h` a state is the last h+1 observations, not just the current one.
# In the aliased group, `corridor` reached from `start` and from `side` become two states:

# %%
aliased = DEMO_GROUPS["aliased observation (one view, two hidden rooms)"]
for h in (0, 1):
    g = viz.group_graph(aliased, bj.GatedBEPOConfig(history=h))
    print(f"history={h}: {len(g.nodes)} observation labels drawn; gate open at",
          [n for n, v in g.nodes.items() if v["gate"]])
rows = viz.credit_table(aliased, estimators=("gated_bepo",))
rows_h = viz.credit_table(aliased, estimators=("gated_bepo",), configs={"gated_bepo": {"history": 1}})
for r, rh in zip(rows, rows_h):
    r["gated_bepo (history=1)"] = rh["gated_bepo"]
display(Markdown(viz.format_table(rows)))

# %% [markdown]
# ## Fixed-point convergence
#
# The mean-backup Bellman operator is iterated (Jacobi sweeps) until the largest change
# is below `tol`. Here: the distance of the n-sweep value to the converged one, per group.

# %%
ref = np.asarray(bj.gated_bepo(batch).value)
sweeps = np.arange(0, 30)
dist = np.stack([np.abs(np.asarray(bj.compute_advantages("gated_bepo", batch, max_iters=int(n)).value) - ref)
                 .reshape(len(names), -1).max(axis=1) for n in sweeps])
for b, name in enumerate(names):
    plt.semilogy(sweeps, np.maximum(dist[:, b], 1e-8), marker=".", label=name)
plt.xlabel("sweeps (max_iters)")
plt.ylabel("max |V_n - V*|")
plt.legend(fontsize=7)
plt.show()
out = bj.gated_bepo(batch)
print("sweeps to tol per group:", np.asarray(out.iterations), "converged:", np.asarray(out.converged))
assert dist[-1].max() < 1e-4
