"""Efficient plain-Python GiGPO and Gated-BEPO: the baselines a careful Python programmer writes.

``bepo_jax.credit.reference`` transcribes the definitions literally (lists of records, a
sweep over every edge, float64 everywhere) so that the tests can trust it; it is slow
on purpose. These two are what a fair speed comparison needs instead: one pass over
each group's records into hash maps (``dict``), per-state aggregates (mean edge reward,
successor counts) so that a Jacobi sweep touches each distinct edge once, and the
arrays turned into Python lists once (``tolist``). They compute the same numbers as the
kernels' defaults (``experiments/bench_advantages.py`` checks each against the kernel
before timing it; ``tests/experiments/test_bench_baselines.py`` against the reference).

Inputs: one batch as NumPy arrays ``(obs [B, K, T, 2], reward, mask, outcome, penalty)``,
masks a prefix per trajectory. Outputs: advantages as float64 [B, K, T].
"""

from __future__ import annotations

import math

import numpy as np


def _lists(batch_np):
    obs, reward, mask, outcome, penalty = batch_np
    keys = (obs[..., 0].astype(np.int64) << 32 | obs[..., 1].astype(np.int64)).tolist()  # one int per record
    lengths = mask.sum(-1).tolist()
    return keys, reward.tolist(), penalty.tolist(), lengths, outcome.tolist(), mask.shape


def _outcome_step(rew_b, pen_b, L, *, std_norm: bool, eps: float):
    """GRPO's outcome term with step weighting over one group (mean, or mean/std unbiased)."""
    totals = [sum(rew_b[k][:L[k]]) for k in range(len(L))]
    pool = [totals[k] + pen_b[k][t] for k in range(len(L)) for t in range(L[k])]
    n = len(pool)
    if n == 0:
        return totals, 0.0, 1.0
    if n == 1:
        return totals, 0.0, 1.0 - eps if std_norm else 1.0
    mu = sum(pool) / n
    sd = math.sqrt(sum((p - mu) ** 2 for p in pool) / (n - 1)) if std_norm else 1.0 - eps
    return totals, mu, sd


def dict_gigpo(batch_np, *, gamma: float = 0.95, omega: float = 1.0) -> np.ndarray:
    """GiGPO with the kernel's defaults (norm "mean", step weighting)."""
    keys, rew, pen, lengths, _, shape = _lists(batch_np)
    out = np.zeros(shape)
    for b in range(shape[0]):
        L = lengths[b]
        totals, mu, _ = _outcome_step(rew[b], pen[b], L, std_norm=False, eps=0.0)
        y = [None] * len(L)
        sums, counts = {}, {}
        for k in range(len(L)):
            rk, pk, kk = rew[b][k], pen[b][k], keys[b][k]
            yk, run = [0.0] * L[k], 0.0
            for t in range(L[k] - 1, -1, -1):
                run = rk[t] + gamma * run
                v = run + pk[t]
                yk[t] = v
                s = kk[t]
                sums[s] = sums.get(s, 0.0) + v
                counts[s] = counts.get(s, 0) + 1
            y[k] = yk
        ob = out[b]
        for k in range(len(L)):
            kk, pk, base = keys[b][k], pen[b][k], totals[k] - mu
            row = ob[k]
            for t in range(L[k]):
                s = kk[t]
                c = counts[s]
                row[t] = base + pk[t] + (omega * (y[k][t] - sums[s] / c) if c > 1 else 0.0)
    return out


def dict_gated_bepo(batch_np, *, gamma=0.95, lam=0.5, w=1.0, eta_gated=0.5, eps=1e-6, min_successors=2,
                    tol=1e-6, max_iters=1000, scale_noise=16.0) -> np.ndarray:
    """Gated-BEPO with the kernel's defaults (norm "mean_std", step weighting, unbiased std,
    gate on distinct successors, Jacobi from the Monte-Carlo values with the kernel's stopping rule)."""
    keys, rew, pen, lengths, outcome, shape = _lists(batch_np)
    out = np.zeros(shape)
    for b in range(shape[0]):
        L = lengths[b]
        K = len(L)
        r = [[rew[b][k][t] + pen[b][k][t] for t in range(L[k])] for k in range(K)]
        # one pass: per state the edge-reward sum, the visit count, successor counts, MC return sum
        rsum, count, succ, gsum = {}, {}, {}, {}
        for k in range(K):
            kk, rk, run = keys[b][k], r[k], 0.0
            end = ("END", outcome[b][k])
            for t in range(L[k] - 1, -1, -1):
                s = kk[t]
                run = rk[t] + gamma * run
                nxt = kk[t + 1] if t + 1 < L[k] else end
                rsum[s] = rsum.get(s, 0.0) + rk[t]
                count[s] = count.get(s, 0) + 1
                gsum[s] = gsum.get(s, 0.0) + run
                d = succ.setdefault(s, {})
                d[nxt] = d.get(nxt, 0) + 1
        states = list(count)
        rbar = {s: rsum[s] / count[s] for s in states}
        trans = {s: [(nxt, c / count[s]) for nxt, c in succ[s].items() if not isinstance(nxt, tuple)] for s in states}
        v = {s: gsum[s] / count[s] for s in states}

        def sweep(v):
            return {s: rbar[s] + gamma * sum(p * v[nxt] for nxt, p in trans[s]) for s in states}

        def small(new, old):
            scale = 1.0 + max((abs(x) for x in new.values()), default=0.0)
            return max((abs(new[s] - old[s]) for s in states), default=0.0) <= max(tol, 9.5367431640625e-07) * scale

        new = sweep(v)
        done, it = small(new, v), 0
        while not done and it < max_iters:
            v, it = new, it + 1
            new = sweep(v)
            done = small(new, v)
        if done and it > 0:
            v = new  # the iterate that passed the test, as the kernel
        # GAE of the TD residuals, the gate, the scale over gated records, the mixing
        a_fp, gated = [], []
        for k in range(K):
            kk, rk, acc = keys[b][k], r[k], 0.0
            ak = [0.0] * L[k]
            for t in range(L[k] - 1, -1, -1):
                s = kk[t]
                v_next = v[kk[t + 1]] if t + 1 < L[k] else 0.0
                acc = rk[t] + gamma * v_next - v[s] + gamma * lam * acc
                ak[t] = acc
                if len(succ[s]) >= min_successors:
                    gated.append(acc)
            a_fp.append(ak)
        n = len(gated)
        scale = 1.0
        if n > 1:
            mu = sum(gated) / n
            sd = math.sqrt(sum((x - mu) ** 2 for x in gated) / (n - 1))
            noise = scale_noise * max(tol, 9.5367431640625e-07) * (1.0 + max((abs(x) for x in v.values()), default=0.0))
            scale = sd if sd > noise else 1.0
        scale += eps
        totals, mu, sd = _outcome_step(rew[b], pen[b], L, std_norm=True, eps=eps)
        ob = out[b]
        for k in range(K):
            kk, pk, ak, row = keys[b][k], pen[b][k], a_fp[k], ob[k]
            for t in range(L[k]):
                a_out = (totals[k] + pk[t] - mu) / (sd + eps)
                if len(succ[kk[t]]) >= min_successors:
                    row[t] = eta_gated * a_out + w * ak[t] / scale
                else:
                    row[t] = a_out
    return out
