"""The credit lab's diagnostic protocol: how every estimator's credit tracks the exact advantage as the
share of decisions changes, with the gate open and closed.

Worlds (``bepo_jax.agent.envs.diagnostic.decisions``): a fixed horizon of 8 steps, of which a share (the
*decision density*: 1/8, 1/4, 1/2, 1) are decisions -- one action keeps the agent on track, the other
loses the episode -- and the rest routine (the action changes nothing: A^pi = 0 there); crossed with
*branching*: a lost decision shows at once (``visible``: a decision state has two observed successors,
so Gated-BEPO's gate can open) or only in the outcome (``hidden``: the views alias, the gate stays
closed). The policy takes the on-track action with probability 0.75 everywhere (success 0.75^n for n
decisions). Every registered lab estimator at its defaults, K = 8, 16 groups per batch, 8 batches.

Scores against the exact advantage (``bepo_jax.lab.quality``): affine error, Pearson and rank
correlation with the shuffled-control band (the 97.5% quantile after shuffling x within groups), sign
agreement, the partial correlation given the trajectory's return (what the step credit adds beyond
the outcome), and coverage (the share of records where the estimator's step mechanism acts: its gate,
or a state shared within the group) with the errors on covered and fallback records apart. Every number:
mean +- 95% t over the 8 batches. Writes experiments/results/credit_protocol.{json,md,png}.

    python -m experiments.credit_protocol            # ~15 min on 2 CPU cores
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from bepo_jax.agent.envs.diagnostic import decision_steps, decisions
from bepo_jax.lab.model import enumerate_states
from bepo_jax.lab.quality import DEFAULT_SUITE, LabConfig, credit_quality
from experiments.common import ROOT, command, machine, parser, write_json, write_text

HORIZON = 8
DENSITIES = (0.125, 0.25, 0.5, 1.0)
BRANCHING = ("visible", "hidden")
ON_TRACK = 0.75  # the policy's probability of the on-track action
CONFIG = LabConfig(group_size=8, num_groups=16, num_batches=8)
SCORES = ("affine_err", "pearson", "spearman", "spearman_null", "sign_acc", "partial_return", "coverage",
          "pearson_covered", "pearson_fallback", "affine_err_covered", "affine_err_fallback")


def world_model(density: float, branching: str):
    env = decisions(HORIZON, density, branching == "visible")
    return env, enumerate_states(env, 0)


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    p.add_argument("--batches", type=int, default=CONFIG.num_batches)
    args = p.parse_args(argv)
    cfg = LabConfig(group_size=CONFIG.group_size, num_groups=CONFIG.num_groups, num_batches=args.batches)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    worlds = {}
    for branching in BRANCHING:
        for d in DENSITIES:
            env, model = world_model(d, branching)
            probs = on_track_policy(model)
            rep = credit_quality(model, probs, DEFAULT_SUITE, cfg)
            worlds[f"d={d:g} {branching}"] = {"density": d, "branching": branching,
                                              "decisions": decision_steps(HORIZON, d), "report": rep}
            print(f"{env.name}: success {rep['true_success']:.3f}, gate open on {rep['gated_share']['mean']:.2f} "
                  f"of records ({time.perf_counter() - t0:.0f} s)", flush=True)
    info = {"command": command("credit_protocol", argv), "machine": machine(), "horizon": HORIZON,
            "on_track": ON_TRACK, "config": {"group_size": cfg.group_size, "num_groups": cfg.num_groups,
                                             "num_batches": cfg.num_batches},
            "wall_s": time.perf_counter() - t0, "worlds": worlds}
    write_json(out / "credit_protocol.json", info, indent=1)
    write_text(out / "credit_protocol.md", markdown(info))
    plot(info, out / "credit_protocol.png")
    return 0


def on_track_policy(model) -> np.ndarray:
    """ON_TRACK on the on-track action t mod 2 at every state, t its step (``depth``: the chain reaches a
    state at exactly one step)."""
    t = np.asarray(model.depth) % 2
    probs = np.full((model.num_states, 2), 1 - ON_TRACK)
    probs[np.arange(model.num_states), t] = ON_TRACK
    return probs


def _cell(r: dict, score: str) -> str:
    v = r.get(score)
    if v is None or v["n"] == 0 or (isinstance(v["mean"], float) and np.isnan(v["mean"])):
        return "-"
    return f"{v['mean']:.2f}" + ("" if np.isnan(v["ci95"]) else f" +- {v['ci95']:.2f}")


def markdown(info: dict) -> str:
    lines = ["# The credit lab's diagnostic protocol", "", f"`{info['command']}`; {info['wall_s'] / 60:.1f} min.", "",
             f"Worlds `decisions`: horizon {info['horizon']}, decision density swept, a lost decision visible at once "
             "or hidden until the outcome; the policy takes the on-track action with probability "
             f"{info['on_track']}. K = {info['config']['group_size']}, {info['config']['num_groups']} groups per batch, "
             f"mean +- 95% t over {info['config']['num_batches']} batches. `spearman_null`: the 97.5% quantile of the "
             "rank correlation after shuffling the credit within groups; `partial_return`: the partial correlation "
             "with the exact advantage given the trajectory's return; `coverage`: share of records where the step "
             "mechanism acts (the gate; else a state shared within the group); `_covered` / `_fallback`: the scores "
             "on those records and the rest.", ""]
    for name, w in info["worlds"].items():
        rep = w["report"]
        lines += [f"## {name} (decisions at steps {w['decisions']}; success {rep['true_success']:.3f}, "
                  f"gate open on {rep['gated_share']['mean']:.2f} of records)", "",
                  "| estimator | " + " | ".join(SCORES) + " |", "|---|" + "---|" * len(SCORES)]
        for label, r in rep["estimators"].items():
            lines.append(f"| {label} | " + " | ".join(_cell(r, s) for s in SCORES) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(info: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    labels = [k for k in next(iter(info["worlds"].values()))["report"]["estimators"] if k != "oracle"]
    for col, branching in enumerate(BRANCHING):
        ws = [w for w in info["worlds"].values() if w["branching"] == branching]
        xs = [w["density"] for w in ws]
        for row, score in enumerate(("partial_return", "affine_err")):
            ax = axes[row, col]
            for label in labels:
                m = [w["report"]["estimators"][label][score]["mean"] for w in ws]
                h = [w["report"]["estimators"][label][score]["ci95"] for w in ws]
                ax.errorbar(xs, m, yerr=np.nan_to_num(h), marker="o", capsize=2, label=label)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{branching}: {score}")
            ax.set_xlabel("decision density")
    axes[0, 0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
