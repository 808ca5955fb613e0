"""Leaving a collapse: every estimator's updates from the same collapsed policy.

On E1-hard's seed 0 (``claims.py --experiment e1_hard``) the first update of every arm but
HGPO put 95-99% of the sampled steps on one action; GRPO, GiGPO, GraphGPO and GAGPO left that
mode within a few iterations, the four fixed-point arms never did. This probe asks
whether that is the credit or chance: it rebuilds seed 0's policy after Gated-BEPO's
first update (the run's own config and keys; the report sets the mode's share on a probe
rollout beside the share the E1-hard run sampled at its iteration 2), then
draws ``--batches`` independent batches from it (8 training levels x 8 trajectories, the
run's rollout) and gives each batch to every estimator of the E1 arms: common random
numbers, so differences between estimators are paired per batch. Per estimator and batch:

* the mode a* (the action the collapsed policy samples most) and the credit on the steps
  that take it and on those that leave it, split by the trajectory's outcome;
* the collapse pressure, the tabular-softmax policy gradient on the mode's logit pooled
  over the batch's steps (>0 pushes further into the mode, <0 out of it)::

      P = (1/N) sum_t A_t (1[a_t = a*] - s*),   s* = the share of a* among the batch's N steps;

* the mode's share after ``--steps`` real updates (the run's PPO step; the first on the
  shared batch from the collapsed state, the later ones on the estimator's own rollouts,
  as in a run), sampled on a probe rollout of the first 32 training levels x 8 with one
  key shared by every estimator and batch; "change" is against the same probe of the
  policy before the updates.

Every number is a mean over the batches +- the 95% Student-t half-width over the batches;
"minus gated_bepo" is paired per batch. Results: ``experiments/results/collapse_escape.{json,md}``.

    python -m experiments.collapse_escape                         # 8 batches x 3 updates
    # (44 min on 2 CPU cores, beside another experiment)
    python -m experiments.collapse_escape --batches 2 --steps 1   # smoke
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bepo_jax.agent.train import RunConfig, mean_ci
from bepo_jax.agent.train.setup import Setup, action_counts
from bepo_jax.credit.estimators.registry import get_estimator, make_config
from experiments.claims import ESTIMATOR_ARMS, EXPERIMENTS
from experiments.common import ROOT, command, machine, parser, write_json

REFERENCE = "gated_bepo"


class Credit(NamedTuple):
    """What ``Setup.learn_from`` reads of an estimator's output (a pytree, so one jit serves all)."""

    advantage: jax.Array


def credit_numbers(adv, actions, valid, success, mode: int) -> dict:
    """The credit on mode and off-mode steps (by outcome) and the collapse pressure P."""
    A, a = np.asarray(adv, np.float64), np.asarray(actions)
    v = np.asarray(valid, bool) & (a >= 0)
    won = np.broadcast_to(np.asarray(success, bool)[..., None], A.shape)
    on = (a == mode) & v
    share = on.sum() / max(v.sum(), 1)
    mean = lambda m: float(A[m].mean()) if m.any() else float("nan")
    return {"pressure": float(np.sum(A[v] * (on[v] - share)) / max(v.sum(), 1)),
            "mode_share_batch": float(share), "off_mode_steps": int((v & ~on).sum()),
            "credit_mode_won": mean(on & won), "credit_mode_lost": mean(on & ~won),
            "credit_off_won": mean(v & ~on & won), "credit_off_lost": mean(v & ~on & ~won),
            "credit_std": float(A[v].std()) if v.any() else 0.0}


def main(argv: Optional[list[str]] = None) -> dict:
    p = parser(__doc__)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="the E1-hard seed whose first update is the start")
    p.add_argument("--steps", type=int, default=3,
                   help="updates per estimator and batch: the first on the shared batch, the rest on the "
                        "estimator's own rollouts (the mode's share is probed after the last)")
    p.add_argument("--start", default=REFERENCE, help="the estimator whose first update makes the start policy")
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    if args.steps < 1:
        raise SystemExit(f"--steps={args.steps} must be >= 1.")
    if args.batches < 2:
        raise SystemExit(f"--batches={args.batches} must be >= 2 (intervals over batches).")
    t0 = time.perf_counter()
    exp = EXPERIMENTS["e1_hard"]
    cfg = RunConfig(**exp.base, iterations=exp.iterations, eval_every=exp.eval_every, checkpoint_every=10,
                    estimator=args.start, seed=args.seed)
    setup = Setup(cfg)
    words = setup.env.action_words
    tasks = jax.tree_util.tree_map(jnp.asarray, setup.train_tasks)
    probe_tasks = setup.eval_pool_for(training=True)
    state = setup.trainer.init_state()
    state, m1 = setup.iterate(state, 1)  # the run's first iteration (its key and task draw)

    rollout = jax.jit(setup.rollout_fn)
    probe = jax.jit(setup.rollout)
    learn = jax.jit(lambda st, ro, adv: setup.learn_from(st, ro, Credit(adv))[0])
    kernels = {a.label: jax.jit(lambda b, e=get_estimator(a.estimator), c=make_config(a.estimator, **a.config):
                                e.kernel(b, c).advantage) for a in ESTIMATOR_ARMS}
    probe_key = jax.random.PRNGKey(10_000 + args.seed)

    def counts(ro) -> np.ndarray:
        return np.asarray(action_counts(ro.actions, ro.batch.mask, len(words)), np.float64)

    def probe_counts(params) -> np.ndarray:
        return counts(probe(params, probe_tasks, probe_key))

    before = probe_counts(state.params)
    mode = int(np.argmax(before))
    share_before = before[mode] / before.sum()
    # the run's second rollout: the policy E1-hard's seed 0 sampled at iteration 2
    ro2 = rollout(state, tasks, setup.iteration_key(2))
    run_share = counts(ro2)
    rows: dict[str, list[dict]] = {a.label: [] for a in ESTIMATOR_ARMS}
    batch_success = []
    for b in range(args.batches):
        batch_key = jax.random.fold_in(jax.random.PRNGKey(20_000 + args.seed), b)
        ro = rollout(state, tasks, batch_key)
        batch_success.append(float(np.mean(np.asarray(ro.success))))
        for label, kernel in kernels.items():
            adv = kernel(ro.batch)
            row = credit_numbers(adv, ro.actions, ro.batch.mask, ro.success, mode)
            st = learn(state, ro, adv)
            for step in range(1, args.steps):  # further iterations: the estimator's own rollouts
                ro_s = rollout(st, tasks, jax.random.fold_in(batch_key, 1000 * step))
                st = learn(st, ro_s, kernel(ro_s.batch))
            after = probe_counts(st.params)
            row["mode_share_after"] = float(after[mode] / after.sum())
            row["mode_share_change"] = row["mode_share_after"] - share_before
            rows[label].append(row)
        print(f"batch {b + 1}/{args.batches}: success {batch_success[-1]:.3f}, "
              + ", ".join(f"{k} P {v[-1]['pressure']:+.4f} share {v[-1]['mode_share_after']:.3f}"
                          for k, v in rows.items()) + f" ({time.perf_counter() - t0:.0f} s)", flush=True)

    keys = ("pressure", "mode_share_after", "mode_share_change", "credit_mode_lost", "credit_off_won",
            "credit_off_lost", "credit_mode_won", "credit_std")
    summary = {}
    for label, rs in rows.items():
        s = {k: mean_ci([r[k] for r in rs if not np.isnan(r[k])]) for k in keys}
        if label != REFERENCE:
            for k in ("pressure", "mode_share_after"):
                s[f"{k}_minus_{REFERENCE}"] = mean_ci([r[k] - q[k] for r, q in zip(rs, rows[REFERENCE])])
        s["batches_pushed_out"] = int(sum(r["mode_share_change"] < 0 for r in rs))
        summary[label] = s
    
    info = dict(command=command("collapse_escape"), machine=machine(),
                config=cfg.to_dict(), reference=REFERENCE, start=args.start, batches=args.batches,
                mode=words[mode], steps=args.steps, mode_share_probe_before=float(share_before),
                mode_share_run_iteration2=float(run_share[mode] / run_share.sum()),
                first_iteration=m1, batch_success=batch_success, summary=summary, per_batch=rows,
                wall_s=time.perf_counter() - t0)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    write_json(results / "collapse_escape.json", info, indent=2)
    md = render(info)
    (results / "collapse_escape.md").write_text(md)
    print(md)
    return info


def render(info: dict) -> str:
    """The report: what was probed, then the table README shows (``formatting.collapse_escape``)."""
    from experiments.formatting import collapse_escape

    n = info["batches"]
    return "\n".join([
        "# Leaving a collapse: every estimator's update from the same collapsed policy", "",
        f"Command: `{info['command']}`  ",
        f"E1-hard seed {info['config']['seed']} after {info['start']}'s first update: the mode `{info['mode']}` takes "
        f"{info['mode_share_probe_before']:.3f} of the probe rollout's steps (the E1-hard run sampled "
        f"{info['mode_share_run_iteration2']:.3f} at its iteration 2). {n} batches of 8 training levels x 8 "
        f"trajectories from it (success {np.mean(info['batch_success']):.3f} on average), each given to every "
        f"estimator, then {info['steps']} update(s) per estimator and batch (after the first, on the "
        f"estimator's own rollouts); mean +- 95% t over the {n} batches, differences paired per batch. "
        f"Pressure P > 0 pushes into the mode, < 0 out of it. Wall time {info['wall_s'] / 60:.0f} min.", "",
        collapse_escape(info), ""])


if __name__ == "__main__":
    main()
