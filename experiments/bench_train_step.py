"""Benchmark: the policy-gradient update and the main job's fused iteration.

Two tables, one run:

* ``update`` — ``Trainer.step`` (PPO loss, backward pass, clip, AdamW; one epoch, one
  minibatch) on random token batches shaped like the main job's (Sokoban prompts with
  h = 2, L = prompt + 8 response tokens) and like E2's (TextWorld, h = 2: a 628-token
  prompt and 25 response tokens), for three policy sizes and several batch sizes
  (micro-batches through ``grad_accum`` above a per-model size), each scored two ways:
  ``full`` (the logits at every position) and ``from prompt`` (``TrainConfig.score_from``
  = prompt - 1: the last layer from the prompt's last position only, what ``Setup``
  uses), with the largest gradient difference between the two relative to the largest
  gradient entry (the initial state, the first 64 sequences): updates/s, sequences/s,
  tokens/s, model FLOP/s (``model_flops``, of the full forward), compile time.
* ``iteration`` — ``train.Setup.iterate`` of the main job (``RunConfig()``: rollout of
  B x 8 Sokoban episodes (KV-cached decoding), Gated-BEPO, the update, all in
  one jitted program) at several B: iterations/s and environment steps/s.

Compile time is excluded from the rates (one warm-up call per variant); rates are the
median of the timed repeats. Writes ``<out>/bench_train_step.{json,md}``.

    python -m experiments.bench_train_step                       # ~3 min on 2 CPU cores
    python -m experiments.bench_train_step --backend gpu --scale gpu --out experiments/results/gpu
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bepo_jax.agent.envs.text import VOCAB
from bepo_jax.agent.models import DecoderLM, TransformerConfig
from bepo_jax.agent.rl.train_step import TrainConfig, Trainer, UpdateBatch
from bepo_jax.agent.rollouts.jitted import prompt_length
from bepo_jax.agent.train import RunConfig, Setup
from experiments.common import ROOT, command, machine, median_seconds, parser, write_json

MODELS = {  # label -> (layers, width, heads, largest micro-batch: grad_accum splits bigger batches)
    "1 layer, width 64 (main job)": (1, 64, 4, 4096),
    "4 layers, width 256": (4, 256, 8, 1024),
    "8 layers, width 512": (8, 512, 8, 256),
}
MAIN, WIDE = "1 layer, width 64 (main job)", "4 layers, width 256"
SCALES = {  # update_n: sequences per update, per (batch shape, model label) (pairs not listed are skipped)
    "cpu": dict(update_n={("sokoban", MAIN): (512, 2048), ("sokoban", WIDE): (128,), ("textworld", MAIN): (512,)},
                iteration_groups=(8, 32), repeats=3),
    "gpu": dict(update_n={("sokoban", MAIN): (512, 4096, 16384), ("sokoban", WIDE): (512, 4096, 16384),
                          ("sokoban", "8 layers, width 512"): (512, 4096), ("textworld", MAIN): (512, 4096),
                          ("textworld", WIDE): (512,)}, iteration_groups=(8, 256), repeats=3),
    "gpu-rest": dict(update_n={("sokoban", MAIN): (16384,), ("sokoban", "8 layers, width 512"): (4096,)},
                     iteration_groups=(256,), repeats=3),
}
SCORING = ("full", "from prompt")


def batch_shapes() -> dict[str, tuple[int, int]]:
    """(sequence length, prompt length) of the main job's update and of E2's (TextWorld with
    the host loop's layout: 160-token observations, 24-token commands, a 96-token objective,
    h = 2, 25 response tokens)."""
    setup = Setup(RunConfig(iterations=1))
    length = setup.model.cfg.context
    tw_prompt = prompt_length(160, 2, 24, 96)
    return {"sokoban": (length, length - setup.rollout_cfg.max_response), "textworld": (tw_prompt + 25, tw_prompt)}


def _random_batch(n, length, prompt, rng):
    tokens = rng.integers(1, VOCAB, size=(n, length)).astype(np.int32)
    resp = np.zeros((n, length), bool)
    resp[:, prompt:] = True
    return UpdateBatch(jnp.asarray(tokens), jnp.ones((n, length), bool), jnp.asarray(resp),
                       jnp.asarray(rng.normal(-2.0, 0.5, (n, length)).astype(np.float32)),
                       jnp.asarray(rng.normal(0.0, 1.0, (n, length)).astype(np.float32)))


def model_flops(label: str, sequences: int, length: int) -> float:
    """Model FLOPs of one update (the MFU convention): 6 P tokens for the matmul
    parameters P = layers 12 W^2 + W V (qkv, out, MLP up/down; the output head), plus
    12 layers L W tokens for the attention scores and values (forward and backward, no
    causal halving). XLA's own count omits the cuBLAS GEMMs on GPU, hence this."""
    layers, width, _, _ = MODELS[label]
    tokens = sequences * length
    return 6.0 * (layers * 12 * width**2 + width * VOCAB) * tokens + 12.0 * layers * length * width * tokens


def bench_updates(scale: dict, on_row) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    shapes = batch_shapes()
    for (shape, label), sizes in scale["update_n"].items():
        length, prompt = shapes[shape]
        layers, width, heads, micro = MODELS[label]
        model = DecoderLM(TransformerConfig(vocab=VOCAB, layers=layers, width=width, heads=heads, context=length),
                          rngs=nnx.Rngs(0))
        params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
        for n in sizes:
            accum = max(1, n // micro)
            batch = _random_batch(n, length, prompt, rng)
            grads = {}
            for scoring in SCORING:
                trainer = Trainer(model, TrainConfig(grad_accum=accum, score_from=prompt - 1 if scoring != "full" else 0))
                state = trainer.init_state()
                t0 = time.perf_counter()
                compiled = jax.jit(trainer.update_fn, donate_argnums=(0,)).lower(state, batch).compile()
                compile_s = time.perf_counter() - t0
                box = [state]

                def one():
                    box[0], m = compiled(box[0], batch)
                    return m["loss"]

                # the two scorings' gradients at the initial state, on the first 64 sequences
                mb = jax.tree_util.tree_map(lambda x: None if x is None else x[: min(n // accum, 64)], batch)
                grad = jax.jit(jax.grad(lambda p, b: trainer._loss(p, b)[0]))(state.params, mb)
                grads[scoring] = [np.asarray(x) for x in jax.tree_util.tree_leaves(grad)]
                jax.block_until_ready(one())
                dt = median_seconds(one, scale["repeats"])
                row = dict(table="update", shape=shape, model=label, params=params, sequences=n, grad_accum=accum,
                           length=length, prompt=prompt, scoring=scoring, update_s=dt, updates_per_s=1.0 / dt,
                           sequences_per_s=n / dt, tokens_per_s=n * length / dt,
                           model_tflops_per_s=model_flops(label, n, length) / dt / 1e12, compile_s=compile_s)
                if scoring != "full":  # largest gradient difference, relative to the largest gradient entry
                    row["grad_rel_diff_vs_full"] = (max(float(np.max(np.abs(a - b))) for a, b in
                                                        zip(grads["full"], grads[scoring]))
                                                    / max(float(np.max(np.abs(a))) for a in grads["full"]))
                print(json.dumps(row), flush=True)
                rows.append(row)
                on_row(rows)
    return rows


def bench_iterations(scale: dict, on_row, rows: list[dict]) -> list[dict]:
    for groups in scale["iteration_groups"]:
        setup = Setup(RunConfig(groups=groups, iterations=1))
        state = setup.trainer.init_state()
        t0 = time.perf_counter()
        state, m = setup.iterate(state, 0)  # compiles the fused iteration
        compile_s = time.perf_counter() - t0
        times, steps = [], []
        for it in range(1, scale["repeats"] + 1):
            t0 = time.perf_counter()
            state, m = setup.iterate(state, it)  # returns host floats: synchronised
            times.append(time.perf_counter() - t0)
            steps.append(m["env_steps"])
        dt = statistics.median(times)
        row = dict(table="iteration", groups=groups, episodes=groups * setup.cfg.group_size, iteration_s=dt,
                   iterations_per_s=1.0 / dt, env_steps_per_s=statistics.median(steps) / dt,
                   compile_plus_first_s=compile_s)
        print(json.dumps(row), flush=True)
        rows.append(row)
        on_row(rows)
    return rows


def _machine_line(m: dict) -> str:
    return (f"{m['platform']}, {m['cpu_count']} CPUs, backend {m['backend']} ({m['device']}); jax {m['jax']}, "
            f"bepo_jax {m['bepo_jax']}")


def markdown(res: dict) -> str:
    up = [r for r in res["rows"] if r["table"] == "update"]
    it = [r for r in res["rows"] if r["table"] == "iteration"]
    lines = ["# The update step and the main job's fused iteration", "",
             f"Command: `{res['command']}`  ", f"Machine: {_machine_line(res['machine'])}. Median of the timed repeats, compile "
             "excluded. TFLOP/s = model FLOPs (6 x matmul parameters x tokens + attention, `model_flops`) "
             "per second; float32 parameters and activations, matmuls at XLA's default precision (on a GPU "
             "that is TF32 tensor cores: rates above the chip's plain-fp32 peak show it).", "",
             "## Trainer.step (PPO, one epoch, one minibatch)", "",
             "Scoring `full`: logits at every position; `from prompt`: `TrainConfig.score_from` = prompt - 1 (the "
             "last layer from the prompt's last position only; what the training runs use), with its speed-up over "
             "`full` on the same batch and the largest difference between the two gradients (initial state, first "
             "64 sequences) relative to the largest gradient entry.",
             "", "| batch shape (L, prompt) | policy | params | sequences (micro-batches) | scoring | update | "
             "speed-up | gradient difference | sequences/s | tokens/s | TFLOP/s | compile | run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    full = {(r.get("shape", "sokoban"), r["model"], r["sequences"]): r["update_s"] for r in up
            if r.get("scoring", "full") == "full"}
    for r in up:
        key = (r.get("shape", "sokoban"), r["model"], r["sequences"])
        speedup = f"{full[key] / r['update_s']:.1f}x" if r.get("scoring", "full") != "full" and key in full else ""
        diff = f"{r['grad_rel_diff_vs_full']:.1e}" if "grad_rel_diff_vs_full" in r else ""
        lines.append(f"| {key[0]} ({r['length']}, {r.get('prompt', '?')}) | {r['model']} | {r['params']:,} | "
                     f"{r['sequences']:,} ({r['grad_accum']}) | {r.get('scoring', 'full')} | {r['update_s'] * 1e3:.1f} ms | "
                     f"{speedup} | {diff} | "
                     f"{r['sequences_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
                     f"{model_flops(r['model'], r['sequences'], r['length']) / r['update_s'] / 1e12:.3g} | "
                     f"{r['compile_s']:.1f} s | {r.get('run', 1)} |")
    lines += ["", "## Main job iteration (`RunConfig()` with B groups: rollout + Gated-BEPO + update, one program)", "",
              "| groups x K | iteration | iterations/s | env steps/s | compile + first | run |", "|---|---|---|---|---|---|"]
    for r in it:
        lines.append(f"| {r['groups']} x 8 | {r['iteration_s'] * 1e3:.0f} ms | {r['iterations_per_s']:.2f} | "
                     f"{r['env_steps_per_s']:,.0f} | {r['compile_plus_first_s']:.1f} s | {r.get('run', 1)} |")
    return "\n".join(lines) + "\n"


def main():
    p = parser(__doc__)
    p.add_argument("--backend", choices=("cpu", "gpu", "tpu"), default=None)
    p.add_argument("--scale", choices=tuple(SCALES), default="cpu")
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    p.add_argument("--render", default=None, help="only re-render the markdown of this results json (next to it)")
    a = p.parse_args()
    if a.render:
        res = json.loads(Path(a.render).read_text())
        Path(a.render).with_suffix(".md").write_text(markdown(res))
        return
    if a.backend:
        jax.config.update("jax_platforms", a.backend)
    scale = SCALES[a.scale]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = dict(command=command("bench_train_step"), machine=machine(),
               scale=a.scale, rows=[])

    def write(rows):  # after every row: a run stopped part-way keeps what it measured
        res["rows"] = rows
        write_json(out / "bench_train_step.json", res, indent=1)
        (out / "bench_train_step.md").write_text(markdown(res))

    bench_iterations(scale, write, bench_updates(scale, write))
    print(markdown(res))


if __name__ == "__main__":
    main()
