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
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/bepo-jax/bepo_jax/blob/main/notebooks/01_estimator_explorer.ipynb)
#
# # Estimator explorer: what each estimator does to a handful of trajectories
#
# A group is K trajectories sampled from one task. Every estimator turns it into one
# advantage per step. Here we build groups by hand — the paper's four patterns and your
# own — and look at the group's **state graph** (identical observations merged; node
# colour = Gated-BEPO's fixed-point value V(s), a red ring = the confidence gate admits
# step credit there, edge label = reward) next to the **credit** of GRPO, GiGPO,
# GraphGPO, GAGPO and Gated-BEPO for every step.

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

# %% [markdown]
# ## Building a group
#
# `Trajectory(observations, rewards, outcome)`: the observation *before* each step, each
# step's reward, and how the episode ended. Observations can be any hashable content
# (strings here; grids, token arrays in real runs) — equal observations become one state.

# %%
R = 10.0
my_group = [
    Trajectory(["start", "key", "door"], [0, 0, R], SUCCESS),
    Trajectory(["start", "key", "pit"], [0, 0, 0], FAILURE),
    Trajectory(["start", "hall", "pit"], [0, 0, 0], FAILURE),
]
viz.draw_group(my_group, title="my group")
plt.show()
display(Markdown(viz.format_table(viz.credit_table(my_group))))

# %% [markdown]
# ## The paper's four patterns
#
# 1. **A useful step inside a failed trajectory** — picking up the key is good even in
#    the run that then fell into the pit. GRPO gives every step of a failed run the
#    same negative credit; the graph estimators see that `key` leads to success elsewhere.
# 2. **A useless step inside a successful trajectory** — bumping into the wall and
#    coming back earns nothing; outcome credit rewards it anyway.
# 3. **Aliased observations** — one view (`corridor`) hides two rooms; the gate only
#    opens where different successors were actually seen.
# 4. **A loop that returns to a state** — the mean-backup fixed point handles cycles.

# %%
for name, group in DEMO_GROUPS.items():
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 3.6), gridspec_kw={"width_ratios": [1, 1.3]})
    viz.draw_group(group, ax=ax1, title=name)
    rows = viz.credit_table(group)
    viz.plot_credit(rows, ax=ax2, title="credit per step (trajectory.step, observation)")
    plt.tight_layout()
    plt.show()
    display(Markdown(viz.format_table(rows)))

# %% [markdown]
# ## What the graph looks like inside
#
# `viz.group_graph` returns the numbers behind the drawing: per state the fixed-point
# value, the gate and the visits; per edge the rewards and counts.

# %%
g = viz.group_graph(DEMO_GROUPS["loop that returns to a state"])
for name, node in g.nodes.items():
    print(f"{name:>8}: V={node['value']:.3f} gate={node['gate']} visits={node['visits']}")
print("fixed-point sweeps:", g.iterations, "converged:", g.converged)
assert g.converged

# %% [markdown]
# Try your own: edit `my_group` above (add a trajectory that loops, or one that is
# truncated) and re-run the cells.
