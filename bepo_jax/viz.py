"""Pictures of what an estimator does to a handful of trajectories (notebooks, reports).

* ``group_graph(trajectories)`` — the group's empirical state graph with Gated-BEPO's
  numbers: per state its fixed-point value V(s), its gate rho(s) and visits; per edge
  the rewards and how often it was taken (terminal edges go to the outcome sinks).
* ``draw_group(trajectories, ax=...)`` — that graph drawn: node colour = V(s), a thick
  ring = the gate admits step credit there, edge label = reward (x count).
* ``credit_table(trajectories)`` / ``format_table`` / ``plot_credit`` — every
  estimator's per-step credit side by side, as rows, as a Markdown table, as bars.
* ``plot_run(run_dir)`` — the learning curve of a ``bepo-jax train`` run.

Needs matplotlib and networkx (``pip install bepo-jax[viz]``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .credit.builders import Trajectory, batch_from_trajectories
from .credit.estimators import GatedBEPOConfig, compute_advantages, gated_bepo
from .credit.types import OUTCOME_NAMES

DEFAULT_ESTIMATORS = ("grpo", "gigpo", "graphgpo", "gagpo", "gated_bepo")


@dataclasses.dataclass
class GroupGraph:
    """nodes: label -> {"value", "gate", "visits"}; edges: (src, dst) -> {"rewards", "count"}
    (dst is an observation label or an outcome name for the last step); per-group
    fixed-point ``iterations`` and ``converged``."""

    nodes: dict
    edges: dict
    iterations: int
    converged: bool


def group_graph(trajectories: Sequence[Trajectory], config: GatedBEPOConfig = GatedBEPOConfig()) -> GroupGraph:
    batch = batch_from_trajectories([list(trajectories)])
    out = gated_bepo(batch, config)
    value, gate = np.asarray(out.value)[0], np.asarray(out.gate)[0]
    nodes: dict = {}
    edges: dict = {}
    for k, tr in enumerate(trajectories):
        obs = [str(o) for o in tr.observations]
        for t, o in enumerate(obs):
            n = nodes.setdefault(o, {"value": float(value[k, t]), "gate": bool(gate[k, t]), "visits": 0})
            n["visits"] += 1
            dst = obs[t + 1] if t + 1 < len(obs) else OUTCOME_NAMES[int(tr.outcome)]
            e = edges.setdefault((o, dst), {"rewards": [], "count": 0})
            e["rewards"].append(float(tr.rewards[t]))
            e["count"] += 1
    return GroupGraph(nodes, edges, int(np.asarray(out.iterations)[0]), bool(np.asarray(out.converged)[0]))


def _layout(trajectories: Sequence[Trajectory], graph: GroupGraph) -> dict:
    """Columns by the first step a state is seen at, rows spread within a column;
    outcome sinks in the last column."""
    first: dict = {}
    for tr in trajectories:
        for t, o in enumerate(map(str, tr.observations)):
            first[o] = min(first.get(o, t), t)
    last = max(first.values(), default=0) + 1
    for (_, dst) in graph.edges:
        if dst in OUTCOME_NAMES:
            first[dst] = last
    cols: dict = {}
    for name, c in first.items():
        cols.setdefault(c, []).append(name)
    pos = {}
    for c, names in cols.items():
        for i, name in enumerate(names):
            pos[name] = (float(c), (len(names) - 1) / 2.0 - i)
    return pos


def draw_group(trajectories: Sequence[Trajectory], config: GatedBEPOConfig = GatedBEPOConfig(), *, ax=None,
               title: Optional[str] = None, cmap: str = "viridis"):
    """Draw the group's state graph; returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    import networkx as nx
    from matplotlib import colors

    graph = group_graph(trajectories, config)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    g = nx.DiGraph()
    g.add_nodes_from(graph.nodes)
    sinks = sorted({dst for (_, dst) in graph.edges if dst in OUTCOME_NAMES})
    g.add_nodes_from(sinks)
    g.add_edges_from(graph.edges)
    pos = _layout(trajectories, graph)
    values = np.array([graph.nodes[n]["value"] for n in graph.nodes])
    vmax = max(float(np.abs(values).max()) if len(values) else 1.0, 1e-6)
    norm = colors.Normalize(vmin=min(0.0, float(values.min(initial=0.0))), vmax=vmax)
    cm = plt.get_cmap(cmap)
    states = list(graph.nodes)
    nx.draw_networkx_nodes(g, pos, nodelist=states, ax=ax, node_size=900,
                           node_color=[cm(norm(graph.nodes[n]["value"])) for n in states],
                           edgecolors=["crimson" if graph.nodes[n]["gate"] else "0.6" for n in states],
                           linewidths=[3.5 if graph.nodes[n]["gate"] else 1.0 for n in states])
    sink_color = {"SUCCESS": "#b6e3b6", "FAILURE": "#f3b5b5", "TRUNCATED": "#dddddd"}
    nx.draw_networkx_nodes(g, pos, nodelist=sinks, ax=ax, node_shape="s", node_size=900,
                           node_color=[sink_color[s] for s in sinks], edgecolors="0.4")
    nx.draw_networkx_labels(g, pos, ax=ax, font_size=7,
                            labels={n: (f"{n}\nV={graph.nodes[n]['value']:.2f}" if n in graph.nodes else n)
                                    for n in g.nodes})
    nx.draw_networkx_edges(g, pos, ax=ax, node_size=900, arrows=True, arrowstyle="-|>",
                           connectionstyle="arc3,rad=0.15", edge_color="0.45")
    labels = {}
    for (s, d), e in graph.edges.items():
        r = sorted(set(e["rewards"]))
        txt = "r=" + "/".join(f"{x:g}" for x in r)
        labels[(s, d)] = txt + (f" x{e['count']}" if e["count"] > 1 else "")
    nx.draw_networkx_edge_labels(g, pos, edge_labels=labels, ax=ax, font_size=6, connectionstyle="arc3,rad=0.15")
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cm)
    ax.figure.colorbar(sm, ax=ax, fraction=0.04, pad=0.01, label="V(s) (fixed point)")
    ax.set_title(title or f"state graph: red ring = gate admits step credit; V in {graph.iterations} sweeps "
                 "from the Monte-Carlo start", fontsize=9)
    ax.set_axis_off()
    return ax


def credit_table(trajectories: Sequence[Trajectory], estimators: Sequence[str] = DEFAULT_ESTIMATORS,
                 configs: Optional[dict[str, Any]] = None) -> list[dict]:
    """One row per valid step: trajectory, step, observation, reward, and each estimator's
    advantage (``configs[name]``: a config instance or dict of overrides)."""
    configs = configs or {}
    batch = batch_from_trajectories([list(trajectories)])
    adv = {}
    for name in estimators:
        c = configs.get(name)
        out = compute_advantages(name, batch, **c) if isinstance(c, dict) else compute_advantages(name, batch, c)
        adv[name] = np.asarray(out.advantage)[0]
    rows = []
    for k, tr in enumerate(trajectories):
        for t, o in enumerate(tr.observations):
            row = {"traj": k, "step": t, "obs": str(o), "reward": float(tr.rewards[t]),
                   "outcome": OUTCOME_NAMES[int(tr.outcome)]}
            row.update({name: float(adv[name][k, t]) for name in estimators})
            rows.append(row)
    return rows


def format_table(rows: list[dict], digits: int = 2) -> str:
    """The rows as a Markdown table."""
    if not rows:
        return ""
    keys = list(rows[0])
    fmt = lambda v: f"{v:.{digits}f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def plot_credit(rows: list[dict], estimators: Sequence[str] = DEFAULT_ESTIMATORS, *, ax=None, title: str = ""):
    """Grouped bars: each step (trajectory k, step t) with one bar per estimator."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    x = np.arange(len(rows))
    width = 0.8 / max(len(estimators), 1)
    for i, name in enumerate(estimators):
        ax.bar(x + (i - (len(estimators) - 1) / 2) * width, [r[name] for r in rows], width, label=name, color=f"C{i}")
    ax.axhline(0, color="0.3", lw=0.6)
    ax.set_xticks(x, [f"{r['traj']}.{r['step']}\n{r['obs'][:8]}" for r in rows], fontsize=6)
    ax.set_ylabel("advantage")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=len(estimators))
    return ax


def plot_run(run_dir: str | Path, *, ax=None):
    """The learning curve of a ``bepo-jax train`` run (training success and evaluations)."""
    from .agent.train import draw_curve, read_metrics

    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    draw_curve(read_metrics(run_dir), ax)
    return ax


def draw_model(model, evaluation, *, labels=None, ax=None, title: Optional[str] = None, cmap: str = "coolwarm"):
    """The exact model of a lab task (``bepo_jax.lab``): states as nodes (column = the step
    they are first reached at, label = ``labels[s]`` and V^pi there), one arrow per action
    and branch coloured by the exact advantage A^pi at that step; ended steps point to an
    outcome box. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    import networkx as nx
    from matplotlib import colors

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    labels = labels or [f"s{s}" for s in range(model.num_states)]
    g = nx.MultiDiGraph()
    depth = np.asarray(model.depth)
    H = model.horizon
    cols: dict = {}
    for s in range(model.num_states):
        cols.setdefault(int(depth[s]), []).append(s)
    pos = {s: (float(c), (len(ss) - 1) / 2.0 - i) for c, ss in cols.items() for i, s in enumerate(ss)}
    pos["SUCCESS"], pos["FAILURE"] = (float(H + 1), 0.5), (float(H + 1), -0.5)
    edges, adv = [], []
    for s in range(model.num_states):
        t = int(depth[s])
        if t >= H:
            continue
        for a in range(model.num_actions):
            for m in range(model.num_branches):
                if model.prob[s, a, m] <= 0:
                    continue
                dst = ("SUCCESS" if model.success[s, a, m] else "FAILURE") if model.ended[s, a, m] \
                    else int(model.next_state[s, a, m])
                edges.append((s, dst, a))
                adv.append(float(evaluation.A[t, s, a]))
    g.add_nodes_from(range(model.num_states))
    g.add_nodes_from(["SUCCESS", "FAILURE"])
    lim = max(max((abs(x) for x in adv), default=1.0), 1e-6)
    norm = colors.TwoSlopeNorm(vmin=-lim, vcenter=0.0, vmax=lim)
    cm = plt.get_cmap(cmap)
    nx.draw_networkx_nodes(g, pos, nodelist=list(range(model.num_states)), ax=ax, node_size=1100,
                           node_color="#f4f4f4", edgecolors="0.4")
    nx.draw_networkx_nodes(g, pos, nodelist=["SUCCESS", "FAILURE"], ax=ax, node_shape="s", node_size=900,
                           node_color=["#b6e3b6", "#f3b5b5"], edgecolors="0.4")
    names = {s: f"{labels[s]}\nV={evaluation.V[int(depth[s]), s]:.2f}" for s in range(model.num_states)}
    nx.draw_networkx_labels(g, pos, labels={**names, "SUCCESS": "SUCCESS", "FAILURE": "FAILURE"}, ax=ax,
                            font_size=7)
    for (s, d, a), x in zip(edges, adv):
        rad = 0.35 * (a - (model.num_actions - 1) / 2)
        if d == s:
            continue  # self-loops: shown in the label below
        nx.draw_networkx_edges(g, pos, edgelist=[(s, d)], ax=ax, node_size=1100, arrows=True, arrowstyle="-|>",
                               connectionstyle=f"arc3,rad={rad}", edge_color=[cm(norm(x))], width=2.5)
    loops = {}
    for (s, d, a), x in zip(edges, adv):
        if d == s:
            loops.setdefault(s, []).append(f"{model.action_words[a] if model.action_words else a}: stay "
                                           f"A={x:+.2f}")
    for s, txt in loops.items():
        ax.annotate("\n".join(txt), pos[s], xytext=(0, -30), textcoords="offset points", ha="center", fontsize=6)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cm)
    ax.figure.colorbar(sm, ax=ax, fraction=0.04, pad=0.01, label="exact A^pi of the step")
    ax.set_title(title or "exact model: arrows = actions coloured by A^pi at the state's first step", fontsize=9)
    ax.set_axis_off()
    return ax
