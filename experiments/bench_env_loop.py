"""Benchmark: the fully jitted Sokoban rollout loop against a host-driven loop of the
same policy (environment steps per second, one run).

* jitted — ``bepo_jax.rollout.make_rollout``: reset, prompts, sampling, parsing, env
  steps and hashing for all B x K episodes in one compiled ``lax.scan`` program.
* host — ``bepo_jax.host_rollout.make_host_rollout`` over ``JaxEnvOnHost``: the
  verl-agent pattern — one batched (jitted) policy call per time step, each episode's
  environment stepped from Python (one jitted call per episode and step), prompts
  built and observations hashed on the host.

Two policies: the main job's DecoderLM (1 layer, width 64: policy compute dominates) and a
uniform policy (no network: what the loop itself costs). Env steps = valid (in-episode)
steps; compile time excluded (one warm-up call per variant). Writes
experiments/results/bench_env_loop.{md,json}.

    python experiments/bench_env_loop.py            # ~3 min on 2 CPU cores
    python experiments/bench_env_loop.py --backend gpu --out experiments/results/gpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bepo_jax.envs import sokoban as sk  # noqa: E402
from bepo_jax.envs.text import VOCAB  # noqa: E402
from bepo_jax.host_rollout import JaxEnvOnHost, make_host_rollout  # noqa: E402
from bepo_jax.models import DecoderLM, TransformerConfig  # noqa: E402
from bepo_jax.rollout import RolloutConfig, make_rollout, prompt_length  # noqa: E402
from experiments.bench_advantages import machine  # noqa: E402


class UniformLM(nnx.Module):
    """Equal logits for every token: the loop's own cost, no network."""

    def __init__(self):
        self.bias = nnx.Param(jnp.zeros((VOCAB,), jnp.float32))

    def __call__(self, tokens, mask):
        return jnp.broadcast_to(self.bias[...], tokens.shape + (VOCAB,))


def _time(fn, repeats):
    out = fn(0)
    jax.block_until_ready(out.batch.mask)
    best, steps = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        out = fn(r + 1)
        jax.block_until_ready(out.batch.mask)
        best.append(time.perf_counter() - t0)
        steps.append(int(np.asarray(out.batch.mask).sum()))
    i = int(np.argmin(best))
    return best[i], steps[i]


def run(groups, repeats):
    env = sk.SokobanEnv(sk.SokobanConfig())
    cfg = RolloutConfig(group_size=8, constrained=True, max_response=8)
    P = prompt_length(env.obs_len, cfg.prompt_history, 5)
    policies = {
        "decoder_lm (1 layer, width 64)": DecoderLM(TransformerConfig(vocab=VOCAB, layers=1, width=64, heads=4,
                                                                      context=P + cfg.max_response), rngs=nnx.Rngs(0)),
        "uniform (no network)": UniformLM(),
    }
    rows = []
    for pname, model in policies.items():
        params = nnx.state(model, nnx.Param)
        for B in groups:
            levels = env.sample_tasks(B, 0)
            jitted = jax.jit(make_rollout(model, env, cfg))
            jt, js = _time(lambda r: jitted(params, levels, jax.random.PRNGKey(r)), repeats)
            host = make_host_rollout(model, lambda: JaxEnvOnHost(env), cfg, max_steps=env.max_steps,
                                     obs_len=env.obs_len, word_width=5, max_commands=4)
            tasks = [sk.level_at(levels, i) for i in range(B)]
            ht, hs = _time(lambda r: host(params, tasks, jax.random.PRNGKey(r)), max(1, repeats // 2))
            row = dict(policy=pname, groups=B, episodes=B * cfg.group_size, jitted_s=jt, jitted_steps=js,
                       jitted_steps_per_s=js / jt, host_s=ht, host_steps=hs, host_steps_per_s=hs / ht,
                       speedup=(js / jt) / (hs / ht))
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", default="8,32", help="comma-separated B (K = 8 each)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", choices=("cpu", "gpu", "tpu"), default=None)
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args()
    if args.backend:
        jax.config.update("jax_platforms", args.backend)
    rows = run([int(x) for x in args.groups.split(",")], args.repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = dict(machine=machine(), command="python experiments/bench_env_loop.py " + " ".join(sys.argv[1:]),
                rows=rows)
    (out / "bench_env_loop.json").write_text(json.dumps(info, indent=2))
    m = info["machine"]
    lines = ["# Jitted vs host-driven Sokoban rollouts (environment steps / s)", "",
             f"Command: `{info['command']}`  ",
             f"Machine: {m['platform']}, {m['cpu_count']} CPUs, backend {m['backend']} ({m['device']}); "
             f"jax {m['jax']}. K = 8, 10 steps, h = 2, constrained decoding; best of the repeats, compile excluded.", "",
             "| policy | groups x K | jitted steps/s | host steps/s | jitted / host |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['groups']} x 8 | {r['jitted_steps_per_s']:,.0f} | "
                     f"{r['host_steps_per_s']:,.0f} | {r['speedup']:.1f}x |")
    (out / "bench_env_loop.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
