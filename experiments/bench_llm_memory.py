"""The LLM recipe's memory: how much each phase of an iteration and an evaluation holds, before and after.

    python -m experiments.bench_llm_memory                         # the recipe: 2 iterations, 48 held-out games
    python -m experiments.bench_llm_memory --groups 1 --eval-games 8   # a smaller batch (fits beside another run)
    python -m experiments.bench_llm_memory --eval-games 16             # one evaluation batch (docs/llm.md's table)

The ``llm_textworld_wide`` recipe (``make train-llm``: SmolLM2-135M-Instruct in TextWorld, 4 games x 8
episodes an iteration, the top 4 blocks trained) from its initial state: ``--iterations``
iterations, then one held-out evaluation as the run makes it (``--eval-games`` games x 4 episodes,
16 games at a time). Each variant runs in a fresh process of its own, which reports per phase
(the setup, each iteration, the evaluation) its seconds, its peak resident memory (the kernel's
VmHWM, reset at the phase's start through ``/proc/self/clear_refs``), the resident memory at its
end, and the bytes of the JAX arrays alive then. Variants:

- ``before``: the code at ``--before`` (the commit before the change; a git worktree);
- ``no trim``: the code now with ``BEPO_JAX_MALLOC_TRIM=0`` (the reply loop writing into its donated
  cache, the evaluation's rollout without the frozen blocks' output, one evaluation batch held at a
  time), which isolates what returning the allocator's free pages adds;
- ``now``: the code now, as ``make train-llm`` runs it.

Then XLA's own account of the update program (``compiled.memory_analysis()``: its temporary
buffers) at sequence lengths L = 536, 792 and 1048 (an iteration's longest prompt bucket plus the
24 reply slots; 1048 is the recipe's most) and ``grad_accum`` 4 (the recipe), 8 and 16 (smaller
micro-batches of the same minibatches), compiled for the shapes of the first iteration's batch,
never run.

Every variant must compute the same numbers (the change frees memory, it computes nothing
differently): each iteration's metrics but the timings, and every game's evaluation success, are
compared with the first variant's, and the report says whether they are equal.

Results: ``experiments/results/bench_llm_memory.json`` and ``.md`` (another scale:
``bench_llm_memory_g{groups}_e{eval games}_i{iterations}``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .common import RESULTS, ROOT, checkout, command, git_commit, machine, parser, write_json, write_lines

NAME = "bench_llm_memory"
GAMES = ROOT / "runs" / ".textworld_games"
BEFORE = "771a34f"  # the code before the memory change
RECIPE = "llm_textworld_wide"
# metrics that measure time or count compiled programs: they differ between processes by nature
TIMING = ("rollout/decode_s", "rollout/env_s", "rollout/reply_tokens_per_s", "update_s", "step_time", "env_steps_per_s",
          "rollout/compiles")

# One variant's process: the code on PYTHONPATH (this checkout or the baseline's worktree); only APIs both have.
SIDE = r"""
import json, sys, time
from pathlib import Path
import jax
import bepo_jax
from bepo_jax.agent.train.llm_setup import LLMSetup
from bepo_jax.agent.train.recipes import recipe

a = json.loads(sys.argv[1])

def status():
    d = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(d[k].split()[0]) / 2**20 for k in ("VmRSS", "VmHWM")}

phases = []
def phase(name, fn):
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS: this phase's own peak
    t = time.perf_counter()
    out = fn()
    jax.block_until_ready(jax.tree_util.tree_leaves(out))
    s = status()
    phases.append({"phase": name, "seconds": time.perf_counter() - t, "peak_gib": s["VmHWM"], "end_gib": s["VmRSS"],
                   "live_gib": sum(x.nbytes for x in jax.live_arrays()) / 2**30})
    print(json.dumps(phases[-1]), file=sys.stderr, flush=True)
    return out

setup = phase("setup", lambda: LLMSetup(recipe(a["recipe"]).replace(groups=a["groups"]), cache_dir=Path(a["games"])))
state = setup.init_state()
metrics = []
for it in range(1, a["iterations"] + 1):
    state, m = phase(f"iteration {it}", lambda: setup.iterate(state, it))
    metrics.append(m)
ev = phase("evaluation", lambda: setup.evaluate(state.params, n_tasks=a["eval_games"], seed=a["seed"]))
print(json.dumps({"phases": phases, "metrics": metrics, "evaluation": {"success_rate": ev["success_rate"],
                  "per_task": ev["per_task"]}, "sequence_length": int(setup.last_rollout.tokens.shape[-1]),
                  "bepo_jax": bepo_jax.__file__}))
"""


# The update program's temporaries, by sequence length and micro-batch size (compiled, not run).
UPDATE_SIDE = r"""
import dataclasses, json, sys
from pathlib import Path
import jax, numpy as np
import bepo_jax
from bepo_jax.agent.train.llm_setup import LLMSetup
from bepo_jax.agent.train.recipes import recipe

a = json.loads(sys.argv[1])
setup = LLMSetup(recipe(a["recipe"]).replace(groups=a["groups"]), cache_dir=Path(a["games"]))
state = setup.init_state()
k_task, k_roll = jax.random.split(setup.iteration_key(1))
ro = setup.rollout(state.params, [setup.train_tasks[i] for i in np.asarray(setup._draw(k_task))], k_roll)
L0 = ro.tokens.shape[-1]
frozen, credit = setup.frozen_inputs(), setup.credit_inputs(ro)
base, rows = setup.policy.train_cfg, []
for accum in a["grad_accum"]:
    setup.policy.train_cfg = dataclasses.replace(base, grad_accum=accum)
    for L in a["lengths"]:  # the batch's shapes with L tokens per sequence
        shaped = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(tuple(L if d == L0 else d for d in x.shape), x.dtype), ro)
        setup.policy.trainers.clear()
        m = jax.jit(setup._learn, donate_argnums=(0,)).lower(state, shaped, frozen, credit).compile().memory_analysis()
        rows.append({"grad_accum": accum, "length": L, "temp_gib": m.temp_size_in_bytes / 2**30,
                     "argument_gib": m.argument_size_in_bytes / 2**30})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
print(json.dumps({"rows": rows, "bepo_jax": bepo_jax.__file__}))
"""
LENGTHS = (536, 792, 1048)
GRAD_ACCUM = (4, 8, 16)


def run_side(args, tree: Path, env: dict) -> dict:
    """One variant's process; its report, or the failure (a process killed for memory says so)."""
    side = {"recipe": RECIPE, "groups": args.groups, "iterations": args.iterations, "eval_games": args.eval_games,
            "seed": 0, "games": str(GAMES)}
    return _process(SIDE, side, tree, env)


def _process(script: str, side: dict, tree: Path, env: dict):
    """``script`` in a fresh process with ``tree``'s code; its last line's JSON object (which names the
    ``bepo_jax`` it imported: ``tree``'s, checked), or the failure."""
    r = subprocess.run([sys.executable, "-c", script, json.dumps(side)], cwd=tree, capture_output=True, text=True,
                       env={**os.environ, **env, "PYTHONPATH": str(tree)})
    if r.returncode:
        return {"failed": r.returncode, "stderr": r.stderr[-2000:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if not Path(out.pop("bepo_jax")).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the variant in {tree} imported another checkout's bepo_jax.")
    return out


def differences(a: dict, b: dict) -> list[str]:
    """What ``b`` computed differently from ``a``: metric names per iteration, and the evaluation."""
    out = []
    for i, (x, y) in enumerate(zip(a["metrics"], b["metrics"]), start=1):
        out += [f"iteration {i}: {k}" for k in sorted(set(x) | set(y)) if k not in TIMING and x.get(k) != y.get(k)]
    if a["evaluation"] != b["evaluation"]:
        out.append("evaluation: per-game success")
    return out


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--iterations", type=int, default=2, help="iterations per variant (from the initial state)")
    p.add_argument("--groups", type=int, default=4, help="games per iteration (the recipe: 4)")
    p.add_argument("--eval-games", type=int, default=48, help="held-out games evaluated (the recipe: 48)")
    p.add_argument("--before", default=BEFORE, help="the commit whose code is the baseline")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    res = {"command": command(NAME, argv), "machine": machine(), "commit": git_commit(), "recipe": RECIPE,
           "groups": args.groups, "iterations": args.iterations, "eval_games": args.eval_games, "before": args.before,
           "variants": []}
    with checkout(args.before) as tree:
        runs = [(f"before ({args.before})", tree, {}), ("no trim", ROOT, {"BEPO_JAX_MALLOC_TRIM": "0"}),
                ("now", ROOT, {})]
        for name, where, env in runs:
            out = run_side(args, where, env)
            res["variants"].append({"variant": name, "env": env, **out})
            print(name, json.dumps(out.get("phases", out))[:2000], flush=True)
    update = _process(UPDATE_SIDE, {"recipe": RECIPE, "groups": args.groups, "games": str(GAMES),
                                    "lengths": LENGTHS, "grad_accum": GRAD_ACCUM}, ROOT, {})
    res["update"] = update.get("rows", update)  # its rows, or the failure
    done = [v for v in res["variants"] if "failed" not in v]
    for v in done[1:]:
        v["differs_from_first"] = differences(done[0], v)
    res["wall_s"] = time.perf_counter() - t0
    recipe_scale = (args.groups, args.eval_games, args.iterations) == (4, 48, 2)
    name = NAME if recipe_scale else f"{NAME}_g{args.groups}_e{args.eval_games}_i{args.iterations}"
    write_json(RESULTS / f"{name}.json", res)
    write_lines(RESULTS / f"{name}.md", render(res))


def render(res: dict) -> list[str]:
    g = lambda x: f"{x:.2f}"
    lines = ["# The LLM recipe's memory, phase by phase", "",
             f"`{res['command']}` at {res['commit']}; machine: {res['machine']['platform']}, "
             f"{res['machine']['cpu_count']} CPUs, jax {res['machine']['jax']}. The `{res['recipe']}` recipe with "
             f"{res['groups']} games x 8 episodes an iteration, {res['iterations']} iterations from the initial state, "
             f"then {res['eval_games']} held-out games x 4 episodes; each variant in a fresh process. Peak: the "
             "phase's highest resident memory (GiB; VmHWM reset at its start); end: resident at its end; live: the "
             "JAX arrays alive then.", "",
             "| variant | phase | seconds | peak | end | live |", "|---|---|---:|---:|---:|---:|"]
    for v in res["variants"]:
        if "failed" in v:
            lines.append(f"| {v['variant']} | failed (exit {v['failed']}) | | | | |")
            continue
        for ph in v["phases"]:
            lines.append(f"| {v['variant']} | {ph['phase']} | {ph['seconds']:.0f} | {g(ph['peak_gib'])} | "
                         f"{g(ph['end_gib'])} | {g(ph['live_gib'])} |")
    lines.append("")
    for v in res["variants"]:
        if "failed" in v:
            continue
        peak = max(ph["peak_gib"] for ph in v["phases"])
        same = v.get("differs_from_first")
        word = ("the reference for the others" if same is None else "the same numbers as the first" if not same
                else "DIFFERENT numbers: " + ", ".join(same[:8]))
        lines.append(f"- {v['variant']}: highest peak {g(peak)} GiB; longest sequence {v['sequence_length']} tokens; "
                     f"{word}.")
    up = res.get("update")
    if isinstance(up, list):
        lengths = sorted({r["length"] for r in up})
        lines += ["", "The update program's temporary buffers (GiB; XLA's `memory_analysis`, compiled for the first "
                  f"iteration's batch of {res['groups']} games x 8 episodes x 4 turns, not run) by sequence length L "
                  "and `grad_accum` (the recipe: 4):", "",
                  "| grad_accum | " + " | ".join(f"L = {n}" for n in lengths) + " |",
                  "|---:|" + "---:|" * len(lengths)]
        for accum in sorted({r["grad_accum"] for r in up}):
            cells = {r["length"]: r["temp_gib"] for r in up if r["grad_accum"] == accum}
            lines.append(f"| {accum} | " + " | ".join(g(cells[n]) for n in lengths) + " |")
    elif up is not None:
        lines += ["", f"The update program's account failed (exit {up['failed']})."]
    return lines


if __name__ == "__main__":
    main()
