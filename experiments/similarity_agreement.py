"""Similarity merging: agreement with the reference's SequenceMatcher rule on TextWorld
observations, and its cost against exact merging.

1. **Agreement.** Random-policy groups (K trajectories of up to T steps) on generated
   TextWorld games (several rooms, a 2-step quest: observations repeat and differ in
   small ways); observations as the rollouts see them (normalised, 160 characters).
   The reference partition is verl-agent's ``build_step_group(enable_similarity=True)``
   rule written out here: leader clustering in record order with
   ``SequenceMatcher(None, a, b).ratio() >= 0.95``. Against it: exact hashing, and
   ``bepo_jax.credit.similarity`` at several Jaccard thresholds. Per setting: the Rand index
   over the record pairs of each group (share of pairs on which "same cluster" agrees),
   precision and recall of the same-cluster pairs, clusters per group, time.
2. **Cost.** ``merge_similar`` + GiGPO against GiGPO alone on groups of 8 x 50 records
   (the observations above, repeated with random single-character edits) and at ~1M
   records.

Writes ``experiments/results/similarity.{json,md}``.

    python -m experiments.similarity_agreement            # ~6 min on 2 CPU cores
    python -m experiments.similarity_agreement --quick
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from difflib import SequenceMatcher
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import bepo_jax as bj
from bepo_jax.agent.envs.text import ALPHABET, encode
from bepo_jax.credit.reference import ref_leader_clusters
from bepo_jax.credit.similarity import (
    SimilarityConfig,
    merge_similar,
    similarity_clusters,
)
from experiments.common import ROOT, command, machine, parser, write_json

OBS_CHARS = 160
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def collect_groups(games: int, k: int, steps: int, seed: int) -> list[list[list[str]]]:
    """groups[g][k] = the observations of trajectory k on game g (random admissible commands)."""
    from bepo_jax.agent.envs.textworld_env import TextWorldEnv, generate_games

    rng = np.random.default_rng(seed)
    paths = generate_games(games, Path(tempfile.gettempdir()) / "bepo_jax_similarity_games", seed=seed, rooms=4,
                           objects=4, quest_length=2)
    env = TextWorldEnv(obs_chars=OBS_CHARS)
    groups = []
    for path in paths:
        trajs = []
        for _ in range(k):
            obs, cmds = env.reset(path)
            traj = [obs]
            for _ in range(steps - 1):
                if not cmds:
                    break
                obs, _, done, _, cmds = env.step(cmds[rng.integers(len(cmds))])
                if done:
                    break
                traj.append(obs)
            trajs.append(traj)
        groups.append(trajs)
    env.close()
    return groups


def reference_clusters(obs: list[str], thresh: float = 0.95) -> list[int]:
    """verl-agent's rule: the first earlier cluster whose representative is similar enough."""
    return ref_leader_clusters(len(obs), lambda i, j: SequenceMatcher(None, obs[i], obs[j]).ratio() >= thresh)


def exact_clusters(obs: list[str]) -> list[int]:
    first = {}
    return [first.setdefault(o, i) for i, o in enumerate(obs)]


def pair_scores(ref: list[int], got: list[int]) -> dict:
    r, g = np.asarray(ref), np.asarray(got)
    iu = np.triu_indices(len(r), 1)
    same_r = (r[:, None] == r[None])[iu]
    same_g = (g[:, None] == g[None])[iu]
    tp = int(np.sum(same_r & same_g))
    return dict(pairs=len(same_r), agree=int(np.sum(same_r == same_g)), tp=tp, ref_same=int(same_r.sum()),
                got_same=int(same_g.sum()))


def tokens_of(groups, K, T):
    B = len(groups)
    tok = np.zeros((B, K, T, OBS_CHARS), np.int32)
    mask = np.zeros((B, K, T), bool)
    for b, trajs in enumerate(groups):
        for k, traj in enumerate(trajs):
            for t, o in enumerate(traj[:T]):
                e = encode(o)[:OBS_CHARS]
                tok[b, k, t, :len(e)] = e
                mask[b, k, t] = True
    return tok, mask


def agreement(groups, K, T) -> list[dict]:
    tok, mask = tokens_of(groups, K, T)
    flat = [[o for traj in trajs for o in traj[:T]] for trajs in groups]
    order = [[k * T + t for k, traj in enumerate(trajs) for t in range(len(traj[:T]))] for trajs in groups]
    t0 = time.perf_counter()
    ref = [reference_clusters(obs) for obs in flat]
    ref_s = time.perf_counter() - t0
    rows = []

    def score(label, parts, seconds):
        tot = [pair_scores(r, p) for r, p in zip(ref, parts)]
        s = {k: sum(d[k] for d in tot) for k in tot[0]}
        rows.append(dict(method=label, rand_index=s["agree"] / s["pairs"],
                         precision=s["tp"] / max(s["got_same"], 1), recall=s["tp"] / max(s["ref_same"], 1),
                         clusters_per_group=statistics.mean(len(set(p)) for p in parts), seconds=seconds,
                         groups=len(parts), records=sum(len(p) for p in parts)))
        print(json.dumps(rows[-1]), flush=True)

    score("SequenceMatcher >= 0.95 (reference, Python)", ref, ref_s)
    t0 = time.perf_counter()
    score("exact hashing", [exact_clusters(obs) for obs in flat], time.perf_counter() - t0)
    for thr in THRESHOLDS:
        cfg = SimilarityConfig(threshold=thr)
        fn = jax.jit(lambda x, m: similarity_clusters(x, m, cfg))
        lead = np.asarray(fn(tok, mask))
        t0 = time.perf_counter()
        lead = np.asarray(jax.block_until_ready(fn(tok, mask)))
        sec = time.perf_counter() - t0
        parts = []
        for b, idx in enumerate(order):
            pos = {flat_i: n for n, flat_i in enumerate(idx)}  # record slot -> position in the flat list
            parts.append([pos[int(lead.reshape(len(groups), -1)[b, i])] for i in idx])
        score(f"MinHash Jaccard >= {thr} (jit)", parts, sec)
    return rows


def edited_batch(groups, B, K, T, seed):
    """B groups of K x T records: observations drawn from the collected ones, each with
    probability 1/2 given one random character edit (so exact hashing splits them)."""
    rng = np.random.default_rng(seed)
    pool = sorted({o for trajs in groups for traj in trajs for o in traj})
    tok = np.zeros((B, K, T, OBS_CHARS), np.int32)
    pick = rng.integers(len(pool), size=(B, K, T))
    enc = [encode(o)[:OBS_CHARS] for o in pool]
    for idx in np.ndindex(B, K, T):
        e = enc[pick[idx]]
        tok[idx][:len(e)] = e
    edit = rng.random((B, K, T)) < 0.5
    pos = rng.integers(0, 40, size=(B, K, T))
    tok[edit, pos[edit]] = rng.integers(4, 4 + len(ALPHABET), size=int(edit.sum()))
    mask = np.ones((B, K, T), bool)
    keys = bj.hash_tokens(jnp.asarray(tok), jnp.asarray(tok != 0))
    reward = np.zeros((B, K, T), np.float32)
    reward[:, :, -1] = rng.integers(0, 2, size=(B, K)) * 10.0
    batch = bj.StepBatch(obs_key=keys, reward=jnp.asarray(reward), mask=jnp.asarray(mask),
                         outcome=jnp.asarray(np.where(reward[:, :, -1] > 0, bj.SUCCESS, bj.FAILURE).astype(np.int32)))
    return batch, jnp.asarray(tok)


def cost(groups, sizes, K, T) -> list[dict]:
    rows = []
    cfg = SimilarityConfig()
    exact = jax.jit(lambda b: bj.ESTIMATORS["gigpo"].kernel(b, bj.GiGPOConfig()).advantage)
    merged = jax.jit(lambda b, tok: bj.ESTIMATORS["gigpo"].kernel(merge_similar(b, tok, cfg), bj.GiGPOConfig()).advantage)
    for B in sizes:
        batch, tok = edited_batch(groups, B, K, T, seed=B)
        for label, fn, args in (("exact hashing + gigpo", exact, (batch,)), ("similarity merge + gigpo", merged, (batch, tok))):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            compile_s = time.perf_counter() - t0
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times.append(time.perf_counter() - t0)
            sec = statistics.median(times)
            rows.append(dict(method=label, groups=B, records=B * K * T, seconds=sec, us_per_record=sec / (B * K * T) * 1e6,
                             first_call_s=compile_s))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(res) -> str:
    m = res["machine"]
    lines = ["# Similarity merging: agreement with SequenceMatcher, and cost", "",
             f"Command: `{res['command']}`  ",
             f"Machine: {m['platform']}, {m['cpu_count']} CPUs, backend {m['backend']}; jax {m['jax']}.", "",
             f"## Agreement on TextWorld ({res['agreement_setup']})", "",
             "Reference: verl-agent's similarity rule (leader clustering in record order, SequenceMatcher ratio "
             ">= 0.95), in Python. Rand index = share of record pairs (within a group) on which 'same cluster' "
             "agrees with the reference; precision / recall of the reference's same-cluster pairs. Time: the whole "
             "set of groups (jit: compiled, one call).", "",
             "| method | Rand index | precision | recall | clusters per group | seconds |", "|---|---|---|---|---|---|"]
    for r in res["agreement"]:
        lines.append(f"| {r['method']} | {r['rand_index']:.4f} | {r['precision']:.3f} | {r['recall']:.3f} | "
                     f"{r['clusters_per_group']:.1f} | {r['seconds']:.3f} |")
    lines += ["", "## Cost against exact merging (GiGPO on top; observations of 160 tokens, half with one edit)", "",
              "| method | groups x 8 x 50 | records | time | us / record | first call (compile) |", "|---|---|---|---|---|---|"]
    for r in res["cost"]:
        lines.append(f"| {r['method']} | {r['groups']} | {r['records']:,} | {r['seconds'] * 1e3:.1f} ms | "
                     f"{r['us_per_record']:.2f} | {r['first_call_s']:.1f} s |")
    return "\n".join(lines) + "\n"


def main():
    p = parser(__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    a = p.parse_args()
    games, K, T = (4, 8, 10) if a.quick else (16, 8, 20)
    groups = collect_groups(games, K, T, seed=11)
    res = dict(command=command("similarity_agreement"), machine=machine(),
               agreement_setup=f"{games} games (4 rooms, 4 objects, quest length 2), K = {K}, up to {T} steps, "
                               "random admissible commands",
               agreement=agreement(groups, K, T),
               cost=cost(groups, (16,) if a.quick else (16, 2500), 8, 50))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "similarity.json", res, indent=1)
    (out / "similarity.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
