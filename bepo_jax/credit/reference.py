"""Plain NumPy / Python-loop reference implementations of the estimators (docs/estimators.md).

Deliberately written as the definitions read — dicts keyed by observation, loops
over records, float64 — and independent of the package's kernels: the tests check
every kernel against these, and ``experiments/bench_advantages.py`` times them. Slow
by design; not for training. Each function takes one batch as NumPy arrays
``(obs [B, K, T, 2], reward, mask, outcome, penalty)``.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

N_OUT = 3
FP_SCALE_NOISE = 16.0                       # as bepo_jax.credit.estimators.bepo
TOL_FLOOR = 8 * float(np.finfo(np.float32).eps)  # as bepo_jax.credit.fixed_point
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
        K, T = mask[b].shape
        L = lengths(mask[b])
        a_ep = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
        y = [[g + float(penalty[b][k, t]) for t, g in enumerate(ref_returns(list(map(float, reward[b][k, : L[k]])), gamma))]
             for k in range(K)]
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
        y = [[g + float(penalty[b][k, t]) for t, g in enumerate(ref_returns(list(map(float, reward[b][k, : L[k]])), gamma))]
             for k in range(K)]
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


# ----------------------------------------------------------------------------- BEPO


def ref_graph(obs, mask, outcome, r):
    """Edges of one group: {state: [(r, successor)]}; END nodes are ("END", o)."""
    K, T = mask.shape
    L = lengths(mask)
    edges = defaultdict(list)
    for k in range(K):
        for t in range(L[k]):
            s = tuple(obs[k, t])
            nxt = tuple(obs[k, t + 1]) if t + 1 < L[k] else ("END", int(outcome[k]))
            edges[s].append((float(r[k, t]), nxt))
    return edges


def ref_values(edges, mc_init, gamma, *, tol, max_iters, exact):
    """Jacobi from the MC init with the stopping rule of docs/solvers.md, or an exact float64 solve."""
    states = list(edges)
    if exact:
        idx = {s: i for i, s in enumerate(states)}
        A = np.eye(len(states))
        rhs = np.zeros(len(states))
        for s, es in edges.items():
            for r, nxt in es:
                rhs[idx[s]] += r / len(es)
                if nxt in idx:
                    A[idx[s], idx[nxt]] -= gamma / len(es)
        sol = np.linalg.solve(A, rhs) if states else np.zeros(0)
        return {s: sol[idx[s]] for s in states}, None, True

    def sweep(v):
        return {s: sum(r + gamma * v.get(nxt, 0.0) for r, nxt in es) / len(es) for s, es in edges.items()}

    def small(new, old):
        if not new:
            return True
        scale = 1.0 + max(abs(x) for x in new.values())
        return max(abs(new[s] - old[s]) for s in new) <= tol * scale

    v = dict(mc_init)
    done = small(sweep(v), v)
    k = 0
    while not done and k < max_iters:
        new = sweep(v)
        done = small(new, v)
        v = new
        k += 1
    return v, k, done


def ref_gated_bepo(batch_np, *, gamma, lam, w, eta_gated, norm, weighting, std, eps, min_successors,
                   gate_on, tol, max_iters, exact=False, gate_all=False):
    """docs/estimators.md, Gated-BEPO for every group; returns a dict of [B, K, T] arrays and per-group lists."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    res = {n: np.zeros((B, K, T)) for n in ("advantage", "value", "a_fp", "a_out", "td", "gate")}
    res["iterations"], res["converged"], res["num_states"] = [], [], []
    for b in range(B):
        L = lengths(mask[b])
        r = np.where(mask[b], (reward[b] + penalty[b]).astype(np.float32), 0.0).astype(np.float64)
        edges = ref_graph(obs[b], mask[b], outcome[b], r)
        G = {k: ref_returns(list(r[k, : L[k]]), gamma) for k in range(K)}
        mc = defaultdict(list)
        for k in range(K):
            for t in range(L[k]):
                mc[tuple(obs[b][k, t])].append(G[k][t])
        mc_init = {s: sum(v) / len(v) for s, v in mc.items()}
        V, iters, conv = ref_values(edges, mc_init, gamma, tol=tol, max_iters=max_iters, exact=exact)
        res["iterations"].append(iters)
        res["converged"].append(conv)
        res["num_states"].append(len(edges))
        if gate_on == "successor":
            n_succ = {s: len({nxt for _, nxt in es}) for s, es in edges.items()}
        else:
            n_succ = {s: len(set(es)) for s, es in edges.items()}
        a_out = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
        gated_fp = []
        for k in range(K):
            deltas = []
            for t in range(L[k]):
                s = tuple(obs[b][k, t])
                nxt = tuple(obs[b][k, t + 1]) if t + 1 < L[k] else None
                v_next = V[nxt] if nxt is not None else 0.0
                deltas.append(r[k, t] + gamma * v_next - V[s])
                res["value"][b, k, t] = V[s]
                res["td"][b, k, t] = deltas[-1]
                res["gate"][b, k, t] = gate_all or n_succ[s] >= min_successors
            acc = 0.0
            for t in reversed(range(L[k])):
                acc = deltas[t] + gamma * lam * acc
                res["a_fp"][b, k, t] = acc
                if res["gate"][b, k, t]:
                    gated_fp.append(acc)
        if norm == "mean_std":
            # residue rule: a gated spread within the fixed point's tolerance is not rescaled
            sd = _std(gated_fp, _ddof(std)) if len(gated_fp) > 1 else 0.0
            noise = FP_SCALE_NOISE * max(tol, TOL_FLOOR) * (1.0 + max((abs(v) for v in V.values()), default=0.0))
            scale = (sd if len(gated_fp) > 1 and sd > noise else 1.0) + eps
        else:
            scale = 1.0
        for k in range(K):
            for t in range(L[k]):
                g = res["gate"][b, k, t]
                eta = eta_gated if g else 1.0
                res["advantage"][b, k, t] = eta * a_out[k, t] + (w * res["a_fp"][b, k, t] / scale if g else 0.0)
        res["a_out"][b] = a_out
    return res


# ----------------------------------------------------------------------- GraphGPO


def ref_graphgpo(batch_np, *, omega_g, scale, beta_g, beta_e, norm, weighting, std, eps, normalize_distance=False):
    """Breadth-first shortest paths to SUCCESS on a dict graph, then GiGPO-style step groups;
    the step return decays with d(s') (or with d(s') - d(s) + 1 under normalize_distance)."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    adv = np.zeros((B, K, T))
    dist = np.zeros((B, K, T))
    for b in range(B):
        r = np.where(mask[b], reward[b] + penalty[b], 0.0)
        edges = ref_graph(obs[b], mask[b], outcome[b], r)
        succ = ("END", 0)
        nodes = set(edges) | {nxt for es in edges.values() for _, nxt in es} | {("END", 0), ("END", 1), ("END", 2)}
        rev = defaultdict(set)
        for s, es in edges.items():
            for _, nxt in es:
                rev[nxt].add(s)
        has_success = any(nxt == succ for es in edges.values() for _, nxt in es)
        d = {succ: 0}
        frontier = [succ]
        while frontier:
            nxt_frontier = []
            for v in frontier:
                for u in rev[v]:
                    if u not in d:
                        d[u] = d[v] + 1
                        nxt_frontier.append(u)
            frontier = nxt_frontier
        far = max(d.values()) + 1
        for v in nodes:
            d.setdefault(v, far)
        if not has_success:
            d = {v: 1 for v in nodes}
        y = [[0.0] * T for _ in range(K)]
        for k in range(K):
            L = int(mask[b, k].sum())
            for t in range(L):
                nxt = tuple(obs[b, k, t + 1]) if t + 1 < L else ("END", int(outcome[b, k]))
                dist[b, k, t] = d[nxt]
                exponent = d[nxt] - d[tuple(obs[b, k, t])] + 1 if normalize_distance else d[nxt]
                assert exponent >= 0
                y[k][t] = scale * omega_g ** exponent
        a_g = ref_step_groups(y, obs[b], mask[b], norm=norm, std=std, eps=eps)
        a_e = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
        adv[b] = beta_g * a_g + beta_e * a_e
    return adv, dist


def ref_gagpo(batch_np, *, gamma, lam, w, norm, weighting, std, eps):
    """GAGPO from its definition: V(s) = mean of the Monte-Carlo returns of the records
    at s, delta = r + gamma V(s') - V(s) (V(END) = 0), A_FP = GAE(delta), no gate,
    A = A_out + w A_FP with A_FP in reward units."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    adv = np.zeros((B, K, T))
    for b in range(B):
        L = lengths(mask[b])
        r = [[float(np.float32(reward[b, k, t] + penalty[b, k, t])) for t in range(L[k])] for k in range(K)]
        G = [ref_returns(r[k], gamma) for k in range(K)]
        visits = defaultdict(list)
        for k in range(K):
            for t in range(L[k]):
                visits[tuple(obs[b, k, t])].append(G[k][t])
        V = {s: sum(g) / len(g) for s, g in visits.items()}
        a_out = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
        for k in range(K):
            acc = 0.0
            for t in reversed(range(L[k])):
                v_next = V[tuple(obs[b, k, t + 1])] if t + 1 < L[k] else 0.0
                delta = r[k][t] + gamma * v_next - V[tuple(obs[b, k, t])]
                acc = delta + gamma * lam * acc
                adv[b, k, t] = a_out[k, t] + w * acc
    return adv


def _verl_rows(reward, penalty, L):
    """One group as verl-agent's rows (the valid steps in trajectory order): the rows (k, t), each
    trajectory's episode reward R_k, each row's penalty p, the rows' scores R_k + p and their mean and
    unbiased std (one row: 0 and 1, as the codes' ``episode_norm_reward``)."""
    rows = [(k, t) for k in range(len(L)) for t in range(L[k])]
    R = {k: float(sum(float(x) for x in reward[k, : L[k]])) for k in range(len(L))}
    p = {(k, t): float(penalty[k, t]) for k, t in rows}
    scores = [R[k] + p[(k, t)] for k, t in rows]
    mu, sd = (0.0, 1.0) if len(scores) <= 1 else (sum(scores) / len(scores), _std(scores, 1))
    return rows, R, p, scores, mu, sd


def ref_g2po(batch_np, *, gamma=0.95, w=1.0, norm="mean", eps=1e-6, success_value=None):
    """G2PO as its authors' code computes it (Nala-YN/G2PO, g2po/core_g2po.py), rewritten row by row
    in float64 from that code's three functions, one group at a time: rows are the valid steps in
    trajectory order; ``episode_norm_reward`` over the rows' scores R + p (one row: mean 0, std 1);
    ``compute_group_aggregation_values``: rows grouped by their observation, a group's score the
    mean of gamma^(L - t) R over its rows, the next group of a trajectory's last row the success
    sentinel (value R of a SUCCESS trajectory, or ``success_value``) or the failure sentinel (0);
    ``compute_step_level_advantage``: component 1 within each state's rows (next score + p, only
    states with more than one row), component 2 over all rows (next score - own score).
    Degenerate cases as the estimator documents them: c2 = 0 for a group of one row."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    out = np.zeros((B, K, T))

    def centre(values):
        mu = sum(values) / len(values)
        sd = _std(values, 1)
        if max(values) == min(values):  # equal values centre to exactly 0
            return [0.0] * len(values)
        return [v - mu if norm == "mean" else (v - mu) / (sd + eps) for v in values]

    for b in range(B):
        L = lengths(mask[b])
        rows, R, p, scores, mu, sd = _verl_rows(reward[b], penalty[b], L)
        if not rows:
            continue
        episode = {row: (sc - mu if norm == "mean" else (sc - mu) / (sd + eps)) for row, sc in zip(rows, scores)}
        # group aggregation values
        group_of, members, total = {}, defaultdict(list), defaultdict(float)
        for k, t in rows:
            g = group_of.setdefault(tuple(obs[b, k, t]), len(group_of))
            members[g].append((k, t))
            total[g] += gamma ** (L[k] - t) * R[k]
        score = {g: total[g] / len(members[g]) for g in members}
        SUCCESS_G, FAILURE_G = "success", "failure"
        nxt = {}
        for k, t in rows:
            if t + 1 < L[k]:
                nxt[(k, t)] = group_of[tuple(obs[b, k, t + 1])]
            else:
                nxt[(k, t)] = SUCCESS_G if int(outcome[b, k]) == 0 else FAILURE_G
        def value(g, k):
            if g == SUCCESS_G:
                return R[k] if success_value is None else float(success_value)
            return 0.0 if g == FAILURE_G else score[g]
        # component 1: within each state's rows
        c1 = defaultdict(float)
        for g, rs in members.items():
            if len(rs) > 1:
                for row, v in zip(rs, centre([value(nxt[r], r[0]) + p[r] for r in rs])):
                    c1[row] = v
        # component 2: over all rows
        gains = [value(nxt[r], r[0]) - score[group_of[tuple(obs[b, r[0], r[1]])]] for r in rows]
        c2 = dict(zip(rows, centre(gains))) if len(rows) > 1 else defaultdict(float)
        for r in rows:
            out[b, r[0], r[1]] = episode[r] + w * (c1[r] + c2[r])
    return out


def ref_tfidf(docs):
    """TF-IDF as scikit-learn's ``TfidfVectorizer()`` defaults compute it, by hand (for vocabularies under
    its ``max_features`` cut): lower-case words of two or more word characters, raw counts, smooth
    idf = ln((1 + n) / (1 + df)) + 1, each row L2-normalised. Rows as {word: weight}; None when no
    document holds a word (scikit-learn's "empty vocabulary")."""
    import re

    words = [re.findall(r"(?u)\b\w\w+\b", d.lower()) for d in docs]
    df = defaultdict(int)
    for ws in words:
        for w in set(ws):
            df[w] += 1
    if not df:
        return None
    n = len(docs)
    rows = []
    for ws in words:
        tf = defaultdict(int)
        for w in ws:
            tf[w] += 1
        v = {w: c * (math.log((1 + n) / (1 + df[w])) + 1.0) for w, c in tf.items()}
        norm = math.sqrt(sum(x * x for x in v.values()))
        rows.append({w: x / norm for w, x in v.items()} if norm > 0 else {})
    return rows


def ref_proxmo(batch_np, texts=None, *, mode="soft", gamma=0.95, w=1.0, psc=True, psc_alpha=4.0,
               psc_target_range=0.05, temperature=0.1, eps=1e-6):
    """ProxMO as its authors' code computes it (GithubX-F/ProxMO-RL, proxmo/core_proxmo.py and its
    trainer), rewritten row by row in float64 from that code: rows are the valid steps in trajectory order;
    ``episode_norm_reward`` over the rows' scores R + p (one row: mean 0, std 1) with PSC's weight from
    p = clip(mean, 0, 1) and beta = target_range / (sigmoid(1) - 0.5); step returns G = discounted
    return + p (``compute_step_discounted_returns``, then the invalid penalty per row);
    ``step_soft_reward``: cosine of the rows' TF-IDF vectors (fitted on every row of the batch:
    ``ref_tfidf``; without ``texts`` identical observations have cosine 1, others 0), a softmax over
    the group's rows at ``temperature``, G minus its weighted mean (an empty vocabulary: 0);
    ``step_norm_reward`` within identical observations (one row: 0) for ``mode`` "mean" / "mean_std"."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    out = np.zeros((B, K, T))
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))
    beta = psc_target_range / (sig(1.0) - 0.5)
    rows_all = [(b, k, t) for b in range(B) for k in range(K) for t in range(lengths(mask[b])[k])]
    vecs = None
    if texts is not None and mode == "soft":
        vecs = ref_tfidf([str(texts[b][k][t]) for b, k, t in rows_all])
        vecs = None if vecs is None else dict(zip(rows_all, vecs))
        empty = vecs is None
    else:
        empty = False

    def sim(b, r1, r2):
        if texts is None:
            return 1.0 if tuple(obs[b, r1[0], r1[1]]) == tuple(obs[b, r2[0], r2[1]]) else 0.0
        v1, v2 = vecs[(b, *r1)], vecs[(b, *r2)]
        n1 = math.sqrt(sum(x * x for x in v1.values())) + 1e-8
        n2 = math.sqrt(sum(x * x for x in v2.values())) + 1e-8
        return sum(x * v2.get(word, 0.0) for word, x in v1.items()) / (n1 * n2)

    for b in range(B):
        L = lengths(mask[b])
        rows, R, p, scores, mu, sd = _verl_rows(reward[b], penalty[b], L)
        if not rows:
            continue
        q = min(1.0, max(0.0, mu))
        episode = {}
        for row, sc in zip(rows, scores):
            e = sc - mu if mode in ("soft", "mean") else (sc - mu) / (sd + eps)
            if psc:
                e *= 1.0 + beta * ((sig((1.0 - q) ** psc_alpha) if sc > 0.5 else sig(-(q ** psc_alpha))) - 0.5)
            episode[row] = e
        G = {}
        for k in range(K):
            for t, g in enumerate(ref_returns([float(x) for x in reward[b, k, : L[k]]], gamma)):
                G[(k, t)] = g + p[(k, t)]
        step = {}
        if mode == "soft":
            for r in rows:
                if empty:
                    step[r] = 0.0
                    continue
                e = [math.exp(sim(b, r, j) / temperature) for j in rows]
                step[r] = G[r] - sum(x * G[j] for x, j in zip(e, rows)) / sum(e)
        else:
            groups = defaultdict(list)
            for r in rows:
                groups[tuple(obs[b, r[0], r[1]])].append(r)
            for rs in groups.values():
                vals = [G[r] for r in rs]
                m = sum(vals) / len(vals)
                s_ = 1.0 if len(vals) == 1 else _std(vals, 1)
                for r in rs:
                    step[r] = G[r] - m if mode == "mean" else (G[r] - m) / (s_ + eps)
        for r in rows:
            out[b, r[0], r[1]] = episode[r] + w * step[r]
    return out


def _anchor_records(obs, reward, mask, outcome, penalty, actions, gamma):
    """One group's step returns y[(k, t)] = G_t + penalty and {anchor: [((k, t), action)]}: anchors
    keyed by the observation, actions by ``actions[k, t]`` or, when None, by the successor (the next
    observation, or the END of the outcome)."""
    K = mask.shape[0]
    L = lengths(mask)
    y, at = {}, defaultdict(list)
    for k in range(K):
        G = ref_returns(list(map(float, reward[k, : L[k]])), gamma)
        for t in range(L[k]):
            y[(k, t)] = G[t] + float(penalty[k, t])
            if actions is not None:
                act = tuple(actions[k, t])
            else:
                act = tuple(obs[k, t + 1]) if t + 1 < L[k] else ("END", int(outcome[k]))
            at[tuple(obs[k, t])].append(((k, t), act))
    return y, at


def ref_ecpo(batch_np, actions=None, *, gamma=0.95, kappa=2.0, tau=4.0, omega=1.0, gate="variance",
             standardize="anchor", anchor="rows", norm="mean", weighting="step", std="unbiased", eps=1e-6):
    """ECPO from the equations its summaries give (docs/estimators.md, ECPO), record by record:
    mu~(s,u) = (n(s,u) Gbar(s,u) + kappa mu(s)) / (n(s,u) + kappa), standardised; rho(s) =
    tanh(n(s)/tau) B/(B + W + eps); A = A_GRPO + omega rho A_act."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    out = np.zeros((B, K, T))
    ddof = _ddof(std)
    for b in range(B):
        a_ep = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
        y, at = _anchor_records(obs[b], reward[b], mask[b], outcome[b], penalty[b],
                                None if actions is None else actions[b], gamma)
        value, weight = {}, {}  # per record at an anchor with two or more actions: mu~ - mu(s), rho(s)
        for recs in at.values():
            by_action = defaultdict(list)
            for r, act in recs:
                by_action[act].append(y[r])
            if len(by_action) < 2:
                continue
            n = len(recs)
            means = {a: sum(v) / len(v) for a, v in by_action.items()}
            mu = sum(y[r] for r, _ in recs) / n if anchor == "rows" else sum(means.values()) / len(means)
            tilde = {a: (len(by_action[a]) * means[a] + kappa * mu) / (len(by_action[a]) + kappa) for a in means}
            between = sum((means[a] - mu) ** 2 for _, a in recs) / n
            within = sum((y[r] - means[a]) ** 2 for r, a in recs) / n
            rho = math.tanh(n / tau) * between / (between + within + eps) if gate == "variance" else 1.0
            vals = [tilde[a] for _, a in recs]
            m, sd = sum(vals) / n, _std(vals, ddof)
            for r, a in recs:
                weight[r] = rho
                value[r] = (tilde[a] - m) / (sd + eps) if standardize == "anchor" else tilde[a] - mu
        if standardize == "group" and value:
            vals = list(value.values())
            m, sd = sum(vals) / len(vals), _std(vals, ddof)
            value = {r: (v - m) / (sd + eps) for r, v in value.items()}
        for r, v in value.items():
            out[b][r] += omega * weight[r] * v
        out[b] += a_ep
    return out


def ref_pgpo(batch_np, *, gamma=0.95, omega=1.0, step_scale="none", norm="mean_std", weighting="step",
             std="unbiased", eps=1e-6):
    """PGPO as its summary states it (docs/estimators.md, PGPO): Phi(s) = the mean discounted return
    of the records at s, Phi(END) = 0, A = A_GRPO + omega (r + gamma Phi(s') - Phi(s))."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    out = np.zeros((B, K, T))
    for b in range(B):
        L = lengths(mask[b])
        r = {(k, t): float(reward[b, k, t]) + float(penalty[b, k, t]) for k in range(K) for t in range(L[k])}
        returns = defaultdict(list)
        for k in range(K):
            G = ref_returns([r[(k, t)] for t in range(L[k])], gamma)
            for t in range(L[k]):
                returns[tuple(obs[b, k, t])].append(G[t])
        phi = {s: sum(g) / len(g) for s, g in returns.items()}
        delta = {(k, t): r[(k, t)] + gamma * (phi[tuple(obs[b, k, t + 1])] if t + 1 < L[k] else 0.0)
                 - phi[tuple(obs[b, k, t])] for (k, t) in r}
        if step_scale == "std" and delta:  # the Gated-BEPO kernel's residue rule, at its default tol 1e-6
            sd = _std(list(delta.values()), _ddof(std)) if len(delta) > 1 else 0.0
            noise = FP_SCALE_NOISE * max(1e-6, TOL_FLOOR) * (1.0 + max(abs(v) for v in phi.values()))
            scale = (sd if len(delta) > 1 and sd > noise else 1.0) + eps
            delta = {i: d / scale for i, d in delta.items()}
        a_ep = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
        for i, d in delta.items():
            out[b][i] = a_ep[i] + omega * d
    return out


def ref_ecpo_abstract(batch_np, actions=None, *, gamma=0.95, omega=1.0, kappa=1.0, gate="ratio", tau=0.5,
                      anchor="rows", norm="mean", weighting="step", std="unbiased", eps=1e-6):
    """ECPO as docs/estimators.md (ECPO) wrote this project's reconstruction from the abstract, record by record: anchors
    keyed by the observation, actions by ``actions[b, k, t]`` (a key per record) or, when None, by the
    successor (the next observation, or the END of the outcome)."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    out = np.zeros((B, K, T))
    for b in range(B):
        a_ep = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
        y, at = _anchor_records(obs[b], reward[b], mask[b], outcome[b], penalty[b],
                                None if actions is None else actions[b], gamma)
        for recs in at.values():
            by_action = defaultdict(list)
            for r, act in recs:
                by_action[act].append(y[r])
            if len(by_action) < 2:
                continue
            vals = [y[r] for r, _ in recs]
            means = {a: sum(v) / len(v) for a, v in by_action.items()}
            base = sum(vals) / len(vals) if anchor == "rows" else sum(means.values()) / len(means)
            sd = _std(vals, _ddof(std))
            between = sum((means[a] - base) ** 2 for _, a in recs) / len(recs)
            within = sum((y[r] - means[a]) ** 2 for r, a in recs) / len(recs)
            rho = between / (between + within) if between + within > 0 else 0.0
            g = {"ratio": rho, "threshold": float(rho >= tau), "none": 1.0}[gate]
            for r, a in recs:
                n_a = len(by_action[a])
                step = n_a / (n_a + kappa) * (means[a] - base)
                if norm == "mean_std":
                    step /= sd + eps
                out[b][r] += omega * g * step
        out[b] += a_ep
    return out


def ref_g2po_abstract(batch_np, *, gamma, beta_g, beta_e, unit, norm, weighting, std, eps):
    """G2PO from its definition (docs/estimators.md, G2PO): V(s) = mean of the discounted returns
    of the records at s (V(END) = 0); an edge (s, s') has TD error mean(r) + gamma V(s') - V(s)
    (``unit="edge"``; the record's own r under ``"record"``); the TD errors are standardised over
    the group's distinct edges (every record under ``"record"``); all equal -> 0;
    A = beta_g A^G + beta_e A^E. Returns (advantage, td, value)."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    adv, td_out, v_out = np.zeros((B, K, T)), np.zeros((B, K, T)), np.zeros((B, K, T))
    for b in range(B):
        L = lengths(mask[b])
        r = [[float(np.float32(reward[b, k, t] + penalty[b, k, t])) for t in range(L[k])] for k in range(K)]
        G = [ref_returns(r[k], gamma) for k in range(K)]
        visits, edge_r = defaultdict(list), defaultdict(list)
        for k in range(K):
            for t in range(L[k]):
                s = tuple(obs[b, k, t])
                nxt = tuple(obs[b, k, t + 1]) if t + 1 < L[k] else ("END", int(outcome[b, k]))
                visits[s].append(G[k][t])
                edge_r[(s, nxt)].append(r[k][t])
        V = {s: sum(g) / len(g) for s, g in visits.items()}
        value = lambda s: V.get(s, 0.0)  # END nodes: 0
        delta = {e: sum(rs) / len(rs) + gamma * value(e[1]) - value(e[0]) for e, rs in edge_r.items()}
        per_record = {}
        for k in range(K):
            for t in range(L[k]):
                s = tuple(obs[b, k, t])
                nxt = tuple(obs[b, k, t + 1]) if t + 1 < L[k] else ("END", int(outcome[b, k]))
                per_record[k, t] = delta[s, nxt] if unit == "edge" else r[k][t] + gamma * value(nxt) - value(s)
                v_out[b, k, t] = V[s]
        pool = list(delta.values()) if unit == "edge" else list(per_record.values())
        constant = max(pool) == min(pool)
        mu, sd = sum(pool) / len(pool), _std(pool, _ddof(std))
        a_e = ref_outcome(reward[b], penalty[b], mask[b], norm=norm, weighting=weighting, std=std, eps=eps)
        for (k, t), d in per_record.items():
            dev = 0.0 if constant else d - mu
            a_g = dev if norm == "mean" else dev / ((0.0 if constant else sd) + eps)
            adv[b, k, t] = beta_g * a_g + beta_e * a_e[k, t]
            td_out[b, k, t] = d
    return adv, td_out, v_out


def ref_confidence_returns(batch_np, values, conf, gamma):
    """R_t = r_t + c_t gamma R_{t+1};  A_t = R_t - V(s_t)."""
    obs, reward, mask, outcome, penalty = batch_np
    B, K, T = mask.shape
    adv = np.zeros((B, K, T))
    for b in range(B):
        for k in range(K):
            acc = 0.0
            for t in reversed(range(int(mask[b, k].sum()))):
                acc = float(reward[b, k, t] + penalty[b, k, t]) + conf[b, k, t] * gamma * acc
                adv[b, k, t] = acc - values[b, k, t]
    return adv


# ------------------------------------------------------------------ similarity merging


def ref_leader_clusters(n, similar, valid=None):
    """The reference recipes' clustering as a loop (verl-agent ``build_step_group`` with
    ``enable_similarity``): record i joins the first earlier cluster whose leader j has
    ``similar(i, j)``, else it leads a new one; invalid records lead themselves and attract
    nobody. Returns each record's leader index."""
    leaders, out = [], []
    for i in range(n):
        if valid is not None and not valid[i]:
            out.append(i)
            continue
        for j in leaders:
            if similar(i, j):
                out.append(j)
                break
        else:
            leaders.append(i)
            out.append(i)
    return out
