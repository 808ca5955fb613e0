"""Every estimator's credit measured against the exact advantage A^pi_t(s_t, a_t).

One *batch* = B groups of K trajectories sampled under pi (``sample_groups``; groups
cycle over the tasks given). Every estimator runs on the batch through the registry,
exactly as in training, and each record i (group g, step t, hidden state s, action a)
is compared with y_i = A^pi[t, s, a] (``evaluate`` with the objective's ``gamma``):

- ``pearson``, ``spearman``: correlation of x (the estimator's advantage) and y over
  the batch's valid records (0 when x is constant: no information);
- ``sign_acc``: sum_i |y_i| [sign x_i = sign y_i] / sum_i |y_i| (x_i = 0 scores 1/2);
- ``affine_err``: 1 - R^2 after the best affine map y ~ alpha_g + beta_g x per group:
  sum_g ||y_g - alpha_g - beta_g x_g||^2 / sum_g ||y_g - mean(y_g)||^2 (0 = perfect up to
  a per-group scale and shift; 1 = no better than a per-group constant);
- ``grad_cos``: cosine between sum_i x_i grad log pi(a_i | s_i) (tabular softmax:
  onehot(a_i) - pi(. | s_i) at row s_i) and the exact policy gradient;
- the same correlation and sign accuracy restricted to gated / ungated records (the
  Gated-BEPO gate with its default config), successful / failed trajectories, and the
  early / middle / late third of the time limit;
- the diagnostic protocol's scores (docs/credit-lab.md): ``spearman_null`` -- the 97.5%
  quantile of the rank correlation after shuffling x within each group (``NULL_SHUFFLES``
  times: the band a credit without information reaches); ``partial_return`` -- the partial
  correlation of x and y given the record's trajectory return R (the Pearson correlation of
  their residuals after regressing each on [1, R]: does the step credit carry anything
  beyond the outcome?); ``coverage`` -- the share of records where the estimator's step
  mechanism acts (``acting``: its own gate where it has one, else a state shared by two or
  more records of the group, nowhere for GRPO), with ``pearson`` / ``sign_acc`` /
  ``affine_err`` on the covered and the fallback records apart.

Value quality (the certainty-equivalence argument): at every record, the Monte-Carlo
state mean (``bepo_mc``) and the fixed-point value (``gated_bepo``) against the exact
V^pi[t, s] under the estimators' own gamma; RMSE of each, and their paired difference.

Every metric is reported as the mean over ``num_batches`` independent batches with a
95% Student-t half-width over those batches. The row ``oracle`` uses x = y itself: the
best any per-step credit can do with these samples (its ``grad_cos`` < 1 is sampling
noise alone).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from ..credit.configs import check_int, check_range
from ..credit.estimators.registry import ESTIMATORS, compute_advantages, make_config, parse_estimator_spec
from ..credit.types import SUCCESS, StepBatch
from .exact import Evaluation, check_probs, evaluate
from .model import TabularModel
from .sample import sample_groups

ORACLE = "oracle"
HEADLINE = ("pearson", "spearman", "sign_acc", "affine_err", "grad_cos", "partial_return")
NULL_SHUFFLES = 50  # within-group shuffles of x for the rank correlation's no-information band
SPLITS = ("gated", "ungated", "success", "failed", "early", "middle", "late")


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
    """A named estimator config: ``label`` in reports, registry ``name``, ``overrides``."""

    label: str
    name: str
    overrides: tuple = ()

    def config(self):
        return make_config(self.name, None, **dict(self.overrides))

    def describe(self) -> str:
        return self.name + ("" if not self.overrides else "(" + ", ".join(f"{k}={v}" for k, v in self.overrides) + ")")


def spec(label: str, name: Optional[str] = None, **overrides) -> EstimatorSpec:
    """``spec("bepo_lam0", "gated_bepo", lam=0.0)``; the config is validated here."""
    s = EstimatorSpec(label, name or label, tuple(sorted(overrides.items())))
    s.config()
    return s


def parse_spec(text: str) -> EstimatorSpec:
    """``"gated_bepo"`` or ``"LABEL=NAME:field=value:field=value"`` (the grammar of
    ``estimators.registry.parse_estimator_spec``), e.g. ``bepo_lam0=gated_bepo:lam=0:eta_gated=1``."""
    label, name, over = parse_estimator_spec(text)
    return spec(label, name, **over)


# every registered estimator the registry marks for the lab (``register_estimator(..., lab=True)``)
DEFAULT_SUITE = tuple(spec(n) for n, e in ESTIMATORS.items() if e.lab)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabConfig:
    """group_size K (8), num_groups B per batch (32), num_batches (8, the intervals'
    sample), seed (0), gamma: the objective's discount for A^pi (1.0)."""

    group_size: int = 8
    num_groups: int = 32
    num_batches: int = 8
    seed: int = 0
    gamma: float = 1.0

    def __post_init__(self):
        n = "LabConfig"
        check_int(n, "group_size", self.group_size, lo=2)
        check_int(n, "num_groups", self.num_groups, lo=1)
        check_int(n, "num_batches", self.num_batches, lo=2)
        check_int(n, "seed", self.seed, lo=0)
        check_range(n, "gamma", self.gamma, lo=0.0, hi=1.0)


# ------------------------------------------------------------------------------ metrics


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2:
        return float("nan")
    sx, sy = x.std(), y.std()
    if sy == 0:
        return float("nan")
    if sx == 0:
        return 0.0
    return float(((x - x.mean()) * (y - y.mean())).mean() / (sx * sy))


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x)


def sign_accuracy(x: np.ndarray, y: np.ndarray) -> float:
    w = np.abs(y)
    if w.sum() == 0:
        return float("nan")
    hit = np.where(x == 0, 0.5, (np.sign(x) == np.sign(y)).astype(np.float64))
    return float((w * hit).sum() / w.sum())


def affine_error(x: np.ndarray, y: np.ndarray, group: np.ndarray) -> float:
    """1 - R^2 of the best per-group affine fit (module docstring)."""
    resid = total = 0.0
    for g in np.unique(group):
        xs, ys = x[group == g], y[group == g]
        yc = ys - ys.mean()
        tot = float((yc ** 2).sum())
        if tot == 0:
            continue
        xc = xs - xs.mean()
        sxx = float((xc ** 2).sum())
        beta = float((xc * yc).sum()) / sxx if sxx > 0 else 0.0
        resid += float(((yc - beta * xc) ** 2).sum())
        total += tot
    return resid / total if total > 0 else float("nan")


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a.ravel() @ b.ravel() / (na * nb)) if na > 0 and nb > 0 else 0.0


def partial_correlation(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> float:
    """Pearson correlation of x and y after regressing each on [1, z] (least squares)."""
    if len(x) < 3:
        return float("nan")
    design = np.stack([np.ones_like(z), z], axis=1)
    resid = lambda v: v - design @ np.linalg.lstsq(design, v, rcond=None)[0]
    return _pearson(resid(x), resid(y))


def shuffled_spearman(x: np.ndarray, y: np.ndarray, group: np.ndarray, *, shuffles: int = NULL_SHUFFLES,
                      seed: int = 0) -> np.ndarray:
    """The rank correlation of y with x shuffled within each group, ``shuffles`` times."""
    rng = np.random.default_rng(seed)
    order = np.argsort(group, kind="stable")  # records by group
    ry = _ranks(y)
    out = np.empty(shuffles)
    for i in range(shuffles):
        perm = np.lexsort((rng.random(len(x)), group))  # by group, then at random within it
        xs = np.empty_like(x)
        xs[order] = x[perm]
        out[i] = _pearson(_ranks(xs), ry)
    return out


def record_metrics(x, y, group, split_masks: Mapping[str, np.ndarray], *, ret=None, covered=None) -> dict:
    """The per-record metrics of one batch (module docstring), ``grad_cos`` aside; ``ret``: each record's
    trajectory return (the partial correlation given it); ``covered``: where the estimator's step mechanism
    acts (coverage and the covered / fallback split)."""
    out = {"pearson": _pearson(x, y), "spearman": _pearson(_ranks(x), _ranks(y)), "sign_acc": sign_accuracy(x, y),
           "affine_err": affine_error(x, y, group)}

    def on(name: str, m: np.ndarray, *, affine: bool = False) -> None:  # the scores on the records m only
        out[f"pearson_{name}"] = _pearson(x[m], y[m]) if m.sum() > 1 else float("nan")
        out[f"sign_acc_{name}"] = sign_accuracy(x[m], y[m]) if m.any() else float("nan")
        if affine:
            out[f"affine_err_{name}"] = affine_error(x[m], y[m], group[m]) if m.sum() > 1 else float("nan")

    for name, m in split_masks.items():
        on(name, m)
    if ret is not None:
        out["partial_return"] = partial_correlation(x, y, ret)
        out["spearman_null"] = float(np.quantile(shuffled_spearman(x, y, group), 0.975))
    if covered is not None:
        out["coverage"] = float(covered.mean())
        on("covered", covered, affine=True)
        on("fallback", ~covered, affine=True)
    return out


def acting(name: str, output, shared: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Where an estimator's step mechanism acts, per valid record: its own gate (``output.gate``: open, or a
    weight above 0 as ECPO's), nothing for GRPO (outcome credit only), else a state shared by two or more
    records of the group (where step groups, graph values and soft kernels have something to compare)."""
    if name == "grpo":
        return np.zeros(int(mask.sum()), bool)
    gate = getattr(output, "gate", None)
    return np.asarray(gate)[mask] > 0 if gate is not None else shared


def shared_states(obs_key: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per valid record: is its observation seen by another record of its group? (the estimators' own
    merge of equal observations, ``graph.state_ids``, then each state's record count)"""
    from ..credit.graph import state_ids

    ids = np.asarray(jax.vmap(lambda o, m: state_ids(o, m)[0])(obs_key, mask))
    mask = np.asarray(mask)
    counts = [np.bincount(i[m], minlength=i.size) for i, m in zip(ids, mask)]
    return np.concatenate([c[i[m]] > 1 for c, i, m in zip(counts, ids, mask)])


# ------------------------------------------------------------------------------ one batch


@dataclasses.dataclass
class _Truth:
    models: Sequence[TabularModel]
    probs: Sequence[np.ndarray]
    evals: Sequence[Evaluation]
    value_evals: dict

    def values(self, gamma: float) -> Sequence[Evaluation]:
        if gamma not in self.value_evals:
            self.value_evals[gamma] = [evaluate(m, p, gamma) for m, p in zip(self.models, self.probs)]
        return self.value_evals[gamma]


def _sample_batch(truth: _Truth, cfg: LabConfig, key):
    """Concatenated groups over the tasks: the StepBatch and per-record hidden facts."""
    n_tasks = len(truth.models)
    counts = [len(range(j, cfg.num_groups, n_tasks)) for j in range(n_tasks)]
    parts = []
    for j, (m, p, c) in enumerate(zip(truth.models, truth.probs, counts)):
        if c == 0:
            continue
        smp = sample_groups(m, p, jax.random.fold_in(key, j), num_groups=c, group_size=cfg.group_size)
        parts.append((j, jax.device_get(smp)))
    batch = StepBatch(*(np.concatenate([np.asarray(getattr(s.batch, f)) for _, s in parts])
                        for f in ("obs_key", "reward", "mask", "outcome", "penalty", "action_key")))
    task = np.concatenate([np.full(s.state.shape, j) for j, s in parts])
    state = np.concatenate([np.asarray(s.state) for _, s in parts])
    action = np.concatenate([np.asarray(s.action) for _, s in parts])
    return batch, task, state, action


def _gradient(x, task, state, action, truth: _Truth) -> list[np.ndarray]:
    grads = []
    for j, (m, p) in enumerate(zip(truth.models, truth.probs)):
        g = np.zeros((m.num_states, m.num_actions))
        sel = task == j
        s, a, w = state[sel], action[sel], x[sel]
        np.add.at(g, (s, a), w)
        np.add.at(g, s, -w[:, None] * p[s])
        grads.append(g)
    return grads


def _per_task(tables: Sequence[np.ndarray], task: np.ndarray, *index: np.ndarray) -> np.ndarray:
    """tables[task_i][index_i] for every record i (one gather per task)."""
    out = np.zeros(task.shape, np.float64)
    for j, table in enumerate(tables):
        sel = task == j
        out[sel] = table[tuple(ix[sel] for ix in index)]
    return out


def _batch_metrics(truth: _Truth, specs: Sequence[EstimatorSpec], cfg: LabConfig, key) -> dict:
    batch, task, state, action = _sample_batch(truth, cfg, key)
    mask = np.asarray(batch.mask)
    B, K, T = mask.shape
    t_idx = np.broadcast_to(np.arange(T), (B, K, T))
    group = np.broadcast_to(np.arange(B)[:, None, None], (B, K, T))
    sel = lambda z: np.asarray(z)[mask]
    tk, st, ac, tt = sel(task), sel(state), sel(action), sel(t_idx)
    y = _per_task([e.A for e in truth.evals], tk, tt, st, ac)
    true_grad = np.concatenate([e.gradient.ravel() for e in truth.evals])

    outputs: dict = {}

    def run(name: str, overrides: tuple = ()):  # each distinct config once per batch
        if (name, overrides) not in outputs:
            outputs[name, overrides] = compute_advantages(name, batch, make_config(name, None, **dict(overrides)))
        return outputs[name, overrides]

    ref = run("gated_bepo")
    won = np.broadcast_to((np.asarray(batch.outcome) == SUCCESS)[:, :, None], (B, K, T))
    gate = sel(ref.gate)
    H = T
    splits = {"gated": gate, "ungated": ~gate, "success": sel(won), "failed": ~sel(won),
              "early": tt < H / 3, "middle": (tt >= H / 3) & (tt < 2 * H / 3), "late": tt >= 2 * H / 3}
    out = {"_records": float(mask.sum()), "_gated_share": float(gate.mean()),
           "_success": float((np.asarray(batch.outcome) == SUCCESS).mean())}
    ret = sel(np.broadcast_to(np.where(mask, np.asarray(batch.reward), 0.0).sum(-1, keepdims=True), (B, K, T)))
    shared = shared_states(np.asarray(batch.obs_key), mask)
    for sp in list(specs) + [None]:
        if sp is None:
            label, x, covered = ORACLE, y, None
        else:
            res = run(sp.name, sp.overrides)
            label, x = sp.label, sel(res.advantage).astype(np.float64)
            covered = acting(sp.name, res, shared, mask)
        m = record_metrics(x, y, sel(group), splits, ret=ret, covered=covered)
        m["grad_cos"] = _cosine(np.concatenate([g.ravel() for g in _gradient(x, tk, st, ac, truth)]), true_grad)
        out[label] = m

    # Value quality at the estimators' own gamma.
    gam = float(make_config("gated_bepo").gamma)
    v_true = _per_task([e.V for e in truth.values(gam)], tk, tt, st)
    v_fp = sel(ref.value).astype(np.float64)
    v_mc = sel(run("bepo_mc").value).astype(np.float64)
    rmse = lambda v: float(np.sqrt(((v - v_true) ** 2).mean()))
    out["_values"] = {"rmse_mc": rmse(v_mc), "rmse_fp": rmse(v_fp), "fp_minus_mc": rmse(v_fp) - rmse(v_mc),
                      "corr_mc": _pearson(v_mc, v_true), "corr_fp": _pearson(v_fp, v_true)}
    return out


# ------------------------------------------------------------------------------ the report


def paired_difference(report: dict, a: str, b: str, metric: str = "pearson") -> dict:
    """Mean and 95% half-width over batches of metric(a) - metric(b): both specs ran on the
    same batches of one ``credit_quality`` call, so the difference is paired."""
    x = np.asarray(report["estimators"][a][metric]["batches"]) - np.asarray(report["estimators"][b][metric]["batches"])
    return _ci([float(v) for v in x])


def _ci(values: Sequence[float]) -> dict:
    from ..agent.train import mean_ci

    v = [x for x in values if not (isinstance(x, float) and math.isnan(x))]
    mean, half = mean_ci(v)
    return {"mean": mean, "ci95": half, "n": len(v)}


def credit_quality(models: Sequence[TabularModel] | TabularModel, probs, specs: Sequence[EstimatorSpec] = DEFAULT_SUITE,
                   config: LabConfig = LabConfig(), *, progress: Optional[Callable[[int], None]] = None) -> dict:
    """Metrics of every spec against A^pi over ``config.num_batches`` batches (module
    docstring). ``models``: one task's model or several (groups cycle over them);
    ``probs``: pi per model, float [num_states, num_actions]. Returns a JSON-ready dict:
    ``estimators[label][metric] = {"mean", "ci95", "n"}`` (n = batches where defined; the
    headline metrics also keep their per-batch values, for ``paired_difference``),
    ``values``, and the truth (exact J and success probability, mean over tasks)."""
    if isinstance(models, TabularModel):
        models, probs = [models], [probs]
    models, probs = list(models), list(probs)
    if not models or len(models) != len(probs):
        raise ValueError(f"credit_quality: {len(models)} models and {len(probs)} policies; give one policy per model.")
    if len({m.horizon for m in models}) != 1:
        raise ValueError("credit_quality: every model must share one horizon (one StepBatch T).")
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels) or ORACLE in labels:
        raise ValueError(f"credit_quality: estimator labels must be unique and not {ORACLE!r}; got {labels}.")
    probs = [check_probs(m, p) for m, p in zip(models, probs)]
    truth = _Truth(models, probs, [evaluate(m, p, config.gamma) for m, p in zip(models, probs)], {})
    key = jax.random.key(config.seed)
    per_batch = []
    for b in range(config.num_batches):
        per_batch.append(_batch_metrics(truth, specs, config, jax.random.fold_in(key, b)))
        if progress is not None:
            progress(1)
    rows = {}
    for label in labels + [ORACLE]:
        names = per_batch[0][label].keys()
        rows[label] = {k: _ci([pb[label][k] for pb in per_batch]) for k in names}
        for k in HEADLINE:  # per-batch values: every spec saw the same batches, so differences pair
            rows[label][k]["batches"] = [float(pb[label][k]) for pb in per_batch]
    values = {k: _ci([pb["_values"][k] for pb in per_batch]) for k in per_batch[0]["_values"]}
    return {
        "config": dataclasses.asdict(config),
        "tasks": len(models),
        "num_states": [m.num_states for m in models],
        "horizon": models[0].horizon,
        "true_value": float(np.mean([e.value for e in truth.evals])),
        "true_success": float(np.mean([e.success for e in truth.evals])),
        "sampled_success": _ci([pb["_success"] for pb in per_batch]),
        "gated_share": _ci([pb["_gated_share"] for pb in per_batch]),
        "records_per_batch": float(np.mean([pb["_records"] for pb in per_batch])),
        "estimators": {s.label: {"spec": s.describe(), **rows[s.label]} for s in specs} | {
            ORACLE: {"spec": "exact A^pi on the sampled records", **rows[ORACLE]}},
        "values": values,
    }
