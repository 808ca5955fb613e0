"""Benchmark: rollout throughput — KV-cached against full-forward decoding, the fully
jitted Sokoban rollout loop against a host-driven loop of the same policy
(environment steps per second, one run).

* jitted — ``bepo_jax.agent.rollouts.jitted.make_rollout``: reset, prompts, sampling, parsing, env
  steps and hashing for all B x K episodes in one compiled ``lax.scan`` program.
* host — ``bepo_jax.agent.rollouts.host.make_host_rollout`` over ``JaxEnvOnHost``: the
  verl-agent pattern — one batched (jitted) policy call per time step, each episode's
  environment stepped from Python (one jitted call per episode and step), prompts
  built and observations hashed on the host.

Two policies: the main job's DecoderLM (1 layer, width 64: policy compute dominates),
decoded "full" (a full forward per sampled position and one more for the log-probs) and
"cached" (prefill + one KV-cached step per token, log-probs at sampling time); and a
uniform policy (no network: what the loop itself costs). Two settings: Sokoban with
constrained decoding (8 response tokens), and long unconstrained responses (25 tokens,
the TextWorld commands' budget). Env steps = valid (in-episode) steps; compile time
excluded (one warm-up call per variant). Also one forward pass at 48 and 146 tokens.
Every row carries env, policy, decode, loop, groups, steps_per_s. Writes
experiments/results/bench_env_loop.{md,json}.

    python -m experiments.bench_env_loop            # ~10 min on 2 CPU cores
    python -m experiments.bench_env_loop --backend gpu --out experiments/results/gpu
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bepo_jax.agent.envs import sokoban as sk
from bepo_jax.agent.envs.text import VOCAB
from bepo_jax.agent.rollouts.host import JaxEnvOnHost, make_host_rollout
from bepo_jax.agent.models import DecoderLM, TransformerConfig
from bepo_jax.agent.rollouts.jitted import RolloutConfig, make_rollout, prompt_length
from experiments.common import ROOT, command, machine, parser, write_json, write_lines


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


SETTINGS = {  # env label -> rollout settings
    "sokoban": dict(constrained=True, max_response=8),
    "sokoban, long unconstrained responses (25 tokens, TextWorld commands' length)": dict(constrained=False,
                                                                                          max_response=25),
}


def _row(env, policy, decode, loop, groups, seconds, steps):
    row = dict(env=env, policy=policy, decode=decode, loop=loop, groups=groups, episodes=groups * 8,
               seconds=seconds, steps=steps, steps_per_s=steps / seconds)
    print(json.dumps(row), flush=True)
    return row


def run(groups, repeats, host_max_groups):
    """Every (setting, policy, decode, loop, B) row; compile excluded (a warm-up call each)."""
    sk_env = sk.SokobanEnv(sk.SokobanConfig())
    rows = []
    for env_label, setting in SETTINGS.items():
        P = prompt_length(sk_env.obs_len, 2, 5)
        policies = {"decoder_lm (1 layer, width 64)": DecoderLM(TransformerConfig(
            vocab=VOCAB, layers=1, width=64, heads=4, context=P + setting["max_response"]), rngs=nnx.Rngs(0))}
        if env_label == "sokoban":
            policies["uniform (no network)"] = UniformLM()
        for pname, model in policies.items():
            params = nnx.state(model, nnx.Param)
            decodes = ("full", "cached") if pname.startswith("decoder") else ("full",)
            for decode in decodes:
                cfg = RolloutConfig(group_size=8, decode=decode, **setting)
                for B in groups:
                    levels = sk_env.sample_tasks(B, 0)
                    jitted = jax.jit(make_rollout(model, sk_env, cfg))
                    sec, steps = _time(lambda r: jitted(params, levels, jax.random.PRNGKey(r)), repeats)
                    rows.append(_row(env_label, pname, decode, "jitted", B, sec, steps))
                    if B > host_max_groups:
                        continue
                    host = make_host_rollout(model, lambda: JaxEnvOnHost(sk_env), cfg, max_steps=sk_env.max_steps,
                                             obs_len=sk_env.obs_len, word_width=5, max_commands=4)
                    tasks = [sk.level_at(levels, i) for i in range(B)]
                    sec, steps = _time(lambda r: host(params, tasks, jax.random.PRNGKey(r)), max(1, repeats // 2))
                    rows.append(_row(env_label, pname, decode, "host", B, sec, steps))
    return rows


def forward_rows(lengths=(48, 146), n=64, repeats=20):
    """One forward pass of the default policy over n prompts of L tokens (the attention
    cost the issue measured: 4.2 ms at 48 and 46 ms at 146 tokens before this change)."""
    out = []
    for L in lengths:
        model = DecoderLM(TransformerConfig(vocab=VOCAB, layers=1, width=64, heads=4, context=L), rngs=nnx.Rngs(0))
        tok = jnp.asarray(np.random.default_rng(0).integers(4, VOCAB, (n, L)), jnp.int32)
        mask = jnp.ones((n, L), bool)
        fwd = jax.jit(lambda t, m: model(t, m))
        jax.block_until_ready(fwd(tok, mask))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fwd(tok, mask))
            times.append(time.perf_counter() - t0)
        out.append(dict(sequences=n, length=L, forward_ms=float(np.median(times)) * 1e3))
        print(json.dumps(out[-1]), flush=True)
    return out


def speedups(rows):
    """cached over full steps/s for every (env, loop, groups) measured both ways."""
    key = lambda r: (r["env"], r["policy"], r["loop"], r["groups"])
    full = {key(r): r for r in rows if r["decode"] == "full"}
    return [dict(env=r["env"], loop=r["loop"], groups=r["groups"], cached_over_full=r["steps_per_s"] / full[key(r)]["steps_per_s"])
            for r in rows if r["decode"] == "cached" and key(r) in full]


def main():
    p = parser(__doc__)
    p.add_argument("--groups", default="8,32", help="comma-separated B (K = 8 each)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--host-max-groups", type=int, default=32, help="run the host loop up to this many groups")
    p.add_argument("--backend", choices=("cpu", "gpu", "tpu"), default=None)
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args()
    if args.backend:
        jax.config.update("jax_platforms", args.backend)
    fwd = forward_rows()
    rows = run([int(x) for x in args.groups.split(",")], args.repeats, args.host_max_groups)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = dict(machine=machine(), command=command("bench_env_loop"),
                rows=rows, forward=fwd, speedups=speedups(rows))
    write_json(out / "bench_env_loop.json", info, indent=2)
    m = info["machine"]
    lines = ["# Rollout throughput: cached vs full decoding, jitted vs host loop (environment steps / s)", "",
             f"Command: `{info['command']}`  ",
             f"Machine: {m['platform']}, {m['cpu_count']} CPUs, backend {m['backend']} ({m['device']}); "
             f"jax {m['jax']}. K = 8, Sokoban (10 steps, h = 2); best of the repeats, compile excluded. "
             "decode: full = a full forward per sampled position + one for the log-probs; cached = prefill + "
             "one KV-cached step per token, log-probs at sampling time.", "",
             "| env | policy | decode | loop | groups x K | steps/s |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['env']} | {r['policy']} | {r['decode']} | {r['loop']} | {r['groups']} x 8 | "
                     f"{r['steps_per_s']:,.0f} |")
    lines += ["", "Cached over full (same env, loop and size):", "", "| env | loop | groups | cached / full |",
              "|---|---|---|---|"]
    lines += [f"| {s['env']} | {s['loop']} | {s['groups']} | {s['cached_over_full']:.1f}x |" for s in info["speedups"]]
    lines += ["", "One forward pass of the default policy (1 layer, width 64), 64 sequences, all tokens real:", "",
              "| tokens | forward |", "|---|---|"]
    lines += [f"| {f['length']} | {f['forward_ms']:.1f} ms |" for f in fwd]
    write_lines(out / "bench_env_loop.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
