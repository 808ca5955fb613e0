"""Benchmark: the Tunix adapter's credit path on realistic multi-turn streams, before and after.

What ``StepCreditGRPOLearner._process_results`` adds to a Tunix training step, without
Tunix's own work (sampling, log-probabilities, the update): the groups' turns -> the
estimator -> per-token advantages. A training step here is 64 groups x 8 trajectories,
1-30 turns each (uniform), each turn 20-200 assistant and 10-100 environment tokens,
streams cut at 4,096 tokens; states are ~200-character observation strings drawn from a
pool of 12 per group (so the graph merges), sparse rewards, mixed endings. Variants,
measured in one run on the same streams:

* ``before``: the adapter as it was -- one estimator call per group at the group's exact
  shape, plus Tunix's trajectory-level call running the estimator again on one-step
  trajectories (its registry entry, one call per group);
* ``per group``: one call per ``_process_results`` call holding one group (Tunix's default,
  compute_logps_micro_batch_size = 1), padded as the learner pads: power-of-two buckets,
  at least the environment's step limit (30) in turns;
* ``8 groups / call`` and ``64 groups / call``: Tunix's micro-batched path
  (compute_logps_micro_batch_size = 8 or the whole step), one bucketed call each;
* ``8 groups / call, similarity``: with similar states merged (``SimilarityConfig()``), and the
  same with the merge run eagerly (``..., eager merge``: how the adapter ran it before
  2026-12-04, when its ``while_loop`` compiled on every call);
* ``8 groups / call, states grow``: the measured steps' states are 4x longer than the warm-up's
  (a longer observation format, say): the bucketed widths overflow once.

Every bucketed variant records its ``BucketWatch`` (``integrations.turns``): the overflows per
dimension after warm-up, the way the learner counts them (``bepo/bucket_overflows``).

Reported per variant: estimator calls per step, XLA compilations during the warm-up steps
and after them (the goal: 0), host time per training step (median and max over the
measured steps, warm-up excluded) and its share of a training step of an assumed length
(no Tunix step is timed here: divide by your own). The mean is the cost per step (it
includes the steps that compiled); the median hides them. Writes
experiments/results/bench_tunix_adapter.{json,md}.

    python -m experiments.bench_tunix_adapter            # ~3 min on 2 CPU cores
    python -m experiments.bench_tunix_adapter --quick    # 2 warm-up + 2 measured steps
"""

from __future__ import annotations

import contextlib
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

from bepo_jax.credit.types import FAILURE, SUCCESS, TRUNCATED
from bepo_jax.credit.similarity import SimilarityConfig
from bepo_jax.integrations.turns import BucketWatch, Turn, credit_for_groups, token_advantages
from experiments.common import ROOT, command, parser, write_json, write_lines

GROUPS, K, MAX_TURNS, L = 64, 8, 30, 4096
ASSUMED_STEP_S = (10.0, 60.0)  # assumed LLM training-step lengths the share is given against
ESTIMATOR = "gated_bepo"

_compiles = [0]
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: _compiles.__setitem__(0, _compiles[0] + (event == "/jax/core/compile/backend_compile_duration")))


def make_step(rng: np.random.Generator, repeat: int = 1):
    """One training step's groups: (turns, outcomes, mask) per group; ``repeat``: each state string
    written that many times over (longer states, the same graph)."""
    words = ["the", "door", "is", "locked", "you", "see", "a", "key", "on", "table", "north", "south", "lamp", "box"]
    step = []
    for _ in range(GROUPS):
        pool = [" ".join(rng.choice(words, 40)) * repeat for _ in range(12)]
        turns, outcomes = [], []
        mask = np.zeros((K, L), np.int32)
        for k in range(K):
            n = int(rng.integers(1, MAX_TURNS + 1))
            tr, p = [], 0
            for t in range(n):
                a, e = int(rng.integers(20, 201)), int(rng.integers(10, 101))
                tr.append(Turn(pool[int(rng.integers(0, len(pool)))], float(rng.random() < 0.05), a, e))
                mask[k, p: min(p + a, L)] = 1
                p += a + e
            turns.append(tr)
            outcomes.append(int(rng.choice([SUCCESS, FAILURE, TRUNCATED])))
        step.append((turns, outcomes, mask))
    return step


def run_before(step):
    calls = 0
    for turns, outcomes, mask in step:
        adv, _ = credit_for_groups([turns], [outcomes], ESTIMATOR, buckets=False)
        token_advantages(turns, adv[0], mask)
        totals = [sum(t.reward for t in tr) for tr in turns]  # Tunix's trajectory-level call, one step each
        credit_for_groups([[[Turn("", x, 1, 0)] for x in totals]], [[SUCCESS if x > 0 else FAILURE for x in totals]],
                          ESTIMATOR, buckets=False)
        calls += 2
    return calls


def run_batched(step, per_call: int, watch=None, similarity=None):
    calls = 0
    for at in range(0, len(step), per_call):
        chunk = step[at: at + per_call]
        adv, _ = credit_for_groups([g[0] for g in chunk], [g[1] for g in chunk], ESTIMATOR, watch=watch,
                                   similarity=similarity, min_shape=(1, K, MAX_TURNS))  # the learner's padding
        for (turns, _, mask), a in zip(chunk, adv):
            token_advantages(turns, a, mask)
        calls += 1
    return calls


@contextlib.contextmanager
def eager_merge():
    """The similarity merge as the adapter ran it before 2026-12-04: not jitted."""
    from bepo_jax.credit.similarity import merge_similar
    from bepo_jax.integrations import rows

    jitted, rows._merge_similar = rows._merge_similar, merge_similar
    try:
        yield
    finally:
        rows._merge_similar = jitted


# name -> (function of (step, watch), its stream: "same" or "grow"; context)
VARIANTS = {"before": (lambda s, w: run_before(s), "same", contextlib.nullcontext),
            "per group": (lambda s, w: run_batched(s, 1, w), "same", contextlib.nullcontext),
            "8 groups / call": (lambda s, w: run_batched(s, 8, w), "same", contextlib.nullcontext),
            "64 groups / call": (lambda s, w: run_batched(s, GROUPS, w), "same", contextlib.nullcontext),
            "8 groups / call, similarity": (lambda s, w: run_batched(s, 8, w, SimilarityConfig()), "same",
                                            contextlib.nullcontext),
            "8 groups / call, similarity, eager merge": (lambda s, w: run_batched(s, 8, w, SimilarityConfig()),
                                                         "same", eager_merge),
            "8 groups / call, states grow": (lambda s, w: run_batched(s, 8, w), "grow", contextlib.nullcontext)}


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--quick", action="store_true", help="2 warm-up + 2 measured steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="measured steps after the warm-up")
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    warm, steps = (2, 2) if args.quick else (args.warmup, args.steps)
    rng = np.random.default_rng(0)
    stream = [make_step(rng) for _ in range(warm + steps)]
    streams = {"same": stream, "grow": stream[:warm] + [make_step(np.random.default_rng(1 + i), repeat=4)
                                                        for i in range(steps)]}
    records = sum(len(tr) for s in stream for g in s for tr in g[0]) / len(stream)
    rows = []
    for name, (fn, which, context) in VARIANTS.items():
        jax.clear_caches()  # each variant pays its own compilations
        watch, run = BucketWatch(), streams[which]
        with context():
            c0 = _compiles[0]
            t_warm = time.perf_counter()
            for s in run[:warm]:
                calls = fn(s, watch)
            t_warm = time.perf_counter() - t_warm
            c1 = _compiles[0]
            warm_calls, warm_over = watch.calls, dict(watch.overflows)
            times = []
            for s in run[warm:]:
                t = time.perf_counter()
                fn(s, watch)
                times.append(time.perf_counter() - t)
        rows.append(dict(variant=name, calls_per_step=calls, warmup_compiles=c1 - c0, compiles_after_warmup=_compiles[0] - c1,
                         warmup_s=t_warm, step_ms_mean=1e3 * statistics.mean(times),
                         step_ms_median=1e3 * statistics.median(times), step_ms_max=1e3 * max(times),
                         overflows={k: v - warm_over.get(k, 0) for k, v in watch.overflows.items()
                                    if v > warm_over.get(k, 0)} if warm_calls else None))
        print(f"{name:>17}: {calls} calls/step, compiles {c1 - c0} warm-up / {_compiles[0] - c1} after, "
              f"{rows[-1]['step_ms_mean']:.0f} ms/step mean (median {rows[-1]['step_ms_median']:.0f}, max "
              f"{rows[-1]['step_ms_max']:.0f})", flush=True)
    meta = dict(command=command("bench_tunix_adapter", ["--quick"] if args.quick else []),
                machine=f"{platform.platform()}, {jax.device_count()} {jax.default_backend()} device(s)",
                jax=jax.__version__, numpy=np.__version__, groups=GROUPS, K=K, max_turns=MAX_TURNS, L=L,
                estimator=ESTIMATOR, warmup_steps=warm, measured_steps=steps, records_per_step=records,
                assumed_step_s=ASSUMED_STEP_S)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "bench_tunix_adapter.json", dict(meta=meta, rows=rows), indent=1)
    base = rows[0]["step_ms_mean"]
    lines = ["# The Tunix adapter's credit path per training step", "",
             f"Command: `{meta['command']}`  ",
             f"Machine: {meta['machine']}; JAX {meta['jax']}, NumPy {meta['numpy']}.  ",
             f"Stream: {GROUPS} groups x {K} trajectories per step, 1-{MAX_TURNS} turns each (~{records:,.0f} turn "
             f"records per step), streams of up to {L} tokens, {ESTIMATOR}; {warm} warm-up steps, then {steps} "
             "measured steps of fresh groups. Times are host wall time of the credit path only (turns -> estimator "
             "-> per-token advantages), not Tunix's sampling or update.", "",
             "| variant | estimator calls / step | compilations in warm-up | after warm-up | bucket overflows "
             "after warm-up | ms / step (mean) | median | max | mean vs before | share of a " +
             " / ".join(f"{s:.0f} s" for s in ASSUMED_STEP_S) + " step (mean) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = " / ".join(f"{r['step_ms_mean'] / 1e3 / s:.1%}" for s in ASSUMED_STEP_S)
        over = "" if r["overflows"] is None else (", ".join(f"{k} {v}" for k, v in r["overflows"].items()) or "none")
        lines.append(f"| {r['variant']} | {r['calls_per_step']} | {r['warmup_compiles']} | {r['compiles_after_warmup']} | "
                     f"{over} | {r['step_ms_mean']:.0f} | {r['step_ms_median']:.0f} | {r['step_ms_max']:.0f} | "
                     f"{base / r['step_ms_mean']:.1f}x | {share} |")
    lines += ["", "The step lengths in the last column are assumptions (an LLM step over 512 trajectories of a few "
              "thousand tokens takes seconds to minutes on an accelerator), not measurements: divide the ms / step "
              "by your own step time. `before` is the adapter before this change (one exact-shape call per group and "
              "a second, trajectory-level call per group)."]
    write_lines(out / "bench_tunix_adapter.md", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
