"""The outcome and step-group baselines: helpers, GRPO, GiGPO, HGPO. (Plain loops, float64: see the package docstring.)"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


N_OUT = 3


HGPO_RESIDUE = 16 * float(np.finfo(np.float32).eps)  # as bepo_jax.credit.estimators.hgpo (RESIDUE_ULPS)


def _std(values, ddof):
    n = len(values)
    if n - ddof <= 0:
        return 0.0
    mu = sum(values) / n
    return math.sqrt(sum((v - mu) ** 2 for v in values) / (n - ddof))


def _ddof(std):
    return {"unbiased": 1, "population": 0}[std]


def lengths(mask):
    return [int(m.sum()) for m in mask]


def ref_returns(rewards, gamma):
    out, run = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        run = rewards[t] + gamma * run
        out[t] = run
    return out


def ref_scored_returns(reward, penalty, L, gamma):
    """Per trajectory k of one group, each step's discounted return plus that step's penalty:
    y[k][t] = sum_{j >= t} gamma^(j - t) r_{k,j} + penalty_{k,t}, for t < L[k]."""
    return [[g + float(penalty[k, t]) for t, g in enumerate(ref_returns(list(map(float, reward[k, : L[k]])), gamma))]
            for k in range(len(L))]


def ref_outcome(reward, penalty, mask, *, norm, weighting, std, eps):
    """docs/estimators.md, outcome advantage for one group [K, T]."""
    K, T = mask.shape
    L = lengths(mask)
    R = [float(sum(reward[k, : L[k]])) for k in range(K)]
    if weighting == "step":
        pool = [R[k] + float(penalty[k, t]) for k in range(K) for t in range(L[k])]
    else:
        pool = [R[k] for k in range(K) if L[k] > 0]
    out = np.zeros((K, T))
    if not pool:
        return out
    if len(pool) == 1:
        mu, sd = 0.0, 1.0
    else:
        mu, sd = sum(pool) / len(pool), _std(pool, _ddof(std))
    for k in range(K):
        for t in range(L[k]):
            p = float(penalty[k, t])
            if weighting == "step" or norm == "mean":
                s = R[k] + p
                out[k, t] = s - mu if norm == "mean" else (s - mu) / (sd + eps)
            else:  # trajectory statistics: the returns normalised, the penalty added in reward units
                out[k, t] = (R[k] - mu) / (sd + eps) + p
    return out


def ref_step_groups(values, keys, mask, *, norm, std, eps):
    """GiGPO's A^S: normalise values within equal-key groups; singletons -> 0."""
    K, T = mask.shape
    groups = defaultdict(list)
    for k in range(K):
        for t in range(int(mask[k].sum())):
            groups[tuple(keys[k, t])].append((k, t))
    out = np.zeros((K, T))
    for members in groups.values():
        if len(members) == 1:
            continue
        vals = [values[k][t] for k, t in members]
        mu, sd = sum(vals) / len(vals), _std(vals, _ddof(std))
        for (k, t), v in zip(members, vals):
            out[k, t] = v - mu if norm == "mean" else (v - mu) / (sd + eps)
    return out


def ref_grpo(batch_np, *, norm, weighting, std, eps):
    obs, reward, mask, outcome, penalty = batch_np
    return np.stack([ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
                     for b in range(mask.shape[0])])


def ref_gigpo(batch_np, *, gamma, omega, norm, weighting, std, eps):
    obs, reward, mask, outcome, penalty = batch_np
    out = []
    for b in range(mask.shape[0]):
        L = lengths(mask[b])
        a_ep = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
        y = ref_scored_returns(reward[b], penalty[b], L, gamma)
        a_st = ref_step_groups(y, obs[b], mask[b], norm=norm, std=std, eps=eps)
        out.append(a_ep + omega * a_st)
    return np.stack(out)


def ref_hgpo(batch_np, *, history_length, length_weight_alpha, base_group, norm, gamma, eps):
    """HGPO as the verl-agent recipe loops it: groups keyed by (k, last k observations)."""
    obs, reward, mask, outcome, penalty = batch_np
    out = []
    for b in range(mask.shape[0]):
        K, T = mask[b].shape
        L = lengths(mask[b])
        y = ref_scored_returns(reward[b], penalty[b], L, gamma)
        base = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting="step", std="unbiased", eps=eps)
        clusters = defaultdict(list)
        for k in range(K):
            hist = [tuple(obs[b][k, t]) for t in range(L[k])]
            for t in range(L[k]):
                for lev in range(1, min(history_length + 1, t + 1) + 1):
                    clusters[(lev, tuple(hist[t - lev + 1: t + 1]))].append((k, t))
        items = defaultdict(list)
        for (lev, _), members in clusters.items():
            if len(members) < 2:
                continue
            vals = [y[k][t] for k, t in members]
            mu, sd = sum(vals) / len(vals), _std(vals, 0)
            for (k, t), v in zip(members, vals):
                # exact zeros: as the kernel's documented rule, a deviation within 16 float32 ulps
                # of |v| + |mu| is the residue of a 0 (docs/estimators.md, HGPO)
                dev = 0.0 if abs(v - mu) <= HGPO_RESIDUE * (abs(v) + abs(mu)) else v - mu
                items[(k, t)].append((lev, dev if norm == "mean" else dev / (sd + eps)))
        R = [float(sum(reward[b][k, : L[k]])) for k in range(K)]
        pool = [R[k] + float(penalty[b][k, t]) for k in range(K) for t in range(L[k])]
        mu_pool = sum(pool) / len(pool) if pool else 0.0
        adv = np.zeros((K, T))
        for k in range(K):
            for t in range(L[k]):
                s = R[k] + float(penalty[b][k, t])
                base_residue = len(pool) > 1 and abs(s - mu_pool) <= HGPO_RESIDUE * (abs(s) + abs(mu_pool))
                its = ([(0, 0.0 if base_residue else base[k, t])] if base_group else []) + items[(k, t)]
                its = [(lev, a) for lev, a in its if a != 0]
                if its:
                    w = [(lev + 1) ** length_weight_alpha for lev, _ in its]
                    adv[k, t] = sum(wi * a for wi, (_, a) in zip(w, its)) / (sum(w) + eps)
        out.append(adv)
    return np.stack(out)
