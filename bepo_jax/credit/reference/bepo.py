"""The state-graph estimators: the graph, the fixed point, Gated-BEPO, GraphGPO, GAGPO, PGPO, the confidence returns. (Plain loops, float64: see the package docstring.)"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .outcome import _ddof, _std, lengths, ref_outcome, ref_returns, ref_step_groups


FP_SCALE_NOISE = 16.0                       # as bepo_jax.credit.estimators.bepo


TOL_FLOOR = 8 * float(np.finfo(np.float32).eps)  # as bepo_jax.credit.fixed_point


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
