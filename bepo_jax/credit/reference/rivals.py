"""The rivals from their papers and their authors' code: G2PO, ProxMO (with its TF-IDF), ECPO, and the abstract-based G2PO and ECPO. (Plain loops, float64: see the package docstring.)"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from .outcome import _ddof, _std, lengths, ref_outcome, ref_returns, ref_scored_returns


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
    scored = ref_scored_returns(reward, penalty, L, gamma)
    y, at = {}, defaultdict(list)
    for k in range(K):
        for t in range(L[k]):
            y[(k, t)] = scored[k][t]
            if actions is not None:
                act = tuple(actions[k, t])
            else:
                act = tuple(obs[k, t + 1]) if t + 1 < L[k] else ("END", int(outcome[k]))
            at[tuple(obs[k, t])].append(((k, t), act))
    return y, at


def _contested(at, y):
    """Each anchor's records and their step returns by action ({action: [y]}), for the anchors where two or
    more distinct actions were taken (the others get no action credit)."""
    for recs in at.values():
        by_action = defaultdict(list)
        for r, act in recs:
            by_action[act].append(y[r])
        if len(by_action) >= 2:
            yield recs, by_action


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
        for recs, by_action in _contested(at, y):
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
        for recs, by_action in _contested(at, y):
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
