"""Step credit inside a verl or verl-agent trainer: one call, or one line of config (docs/verl.md).

    from bepo_jax.integrations.verl import compute_step_advantage
    advantages, returns = compute_step_advantage(
        token_level_rewards, step_rewards, response_mask, anchor_obs, index, traj_index,
        estimator="gated_bepo", gamma=0.95)

The arguments are verl-agent's, row by row (one row per environment step): ``token_level_rewards``
[bs, L] (the episode's score on the row's response tokens: its sum over L is the row's episode
score), ``step_rewards`` [bs] (the discounted step return G_t, verl-agent's
``compute_step_discounted_returns``), ``response_mask`` [bs, L], ``anchor_obs`` [bs] (the observation
the row acted in), ``index`` [bs] (verl's ``uid``: the group) and ``traj_index`` [bs] (``traj_uid``).
torch tensors in give torch tensors out (on the input's device, in ``token_level_rewards``' dtype);
NumPy arrays in give NumPy arrays out. Both outputs are [bs, L], 0 outside ``response_mask``, and
``returns`` is ``advantages`` (verl-agent returns its scores twice).

``estimator="gigpo"`` is verl-agent's ``compute_gigpo_outcome_advantage`` (gigpo/core_gigpo.py),
vectorised over rows:

    episode term  e_i = (S_i - mean_u S) [/ (std_u S + epsilon)]      S_i = sum of the row's token rewards,
                  statistics over the rows of group u (unbiased std); a group of one row: mean 0, std 1
    step term     s_i = (G_i - mean_g G) [/ (std_g G + epsilon)]      g = rows of u with the same anchor_obs
                  (or, enable_similarity, difflib-similar ones, greedily in row order); one row: 0
    A_i = e_i + step_advantage_w s_i, broadcast to the row's response tokens

and needs no step order (rows in any order). Every other registered estimator (``gated_bepo``,
``grpo``, ``hgpo``, ``g2po``, ``proxmo``, ...) runs on the padded ``StepBatch`` of the rows
(``from_rows``): the per-step reward r_t = G_t - gamma G_{t+1} (or ``step_reward``, verl-agent's
per-step ``rewards``), the outcome SUCCESS where the episode score is above 0 (or ``outcome``), and the
step order within a trajectory from ``step_index`` when given, else the rows' order in the batch
(as verl-agent's own ``compute_step_discounted_returns`` reads it). A batch whose order cannot be
trusted is refused by name: a trajectory whose rows are not contiguous (a reordered batch, e.g. after
``balance_batch``) without ``step_index``, or ``step_reward`` that does not discount to
``step_rewards`` in the order given. A group holding one trajectory has no group baseline: it gets
verl-agent's episode rule (mean 0, std 1) and no step term. ``mode`` (verl-agent's; "mean_norm" when not given) is GiGPO's; given with another estimator
it sets that estimator's ``norm`` ("mean_norm" -> "mean", "mean_std_norm" -> "mean_std") unless
``norm`` is given, and otherwise the estimator keeps its own default.

JAX beside torch: the kernels run on JAX's CPU backend unless the user chose a platform
(``JAX_PLATFORMS``) before the first call; on a GPU machine JAX then never allocates GPU memory under
torch. Shapes are padded to powers of two, so a trainer's varying batches compile a few programs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import sys
from typing import Any, Optional

import numpy as np

MODES = {"mean_norm": "mean", "mean_std_norm": "mean_std"}
ORDER_FREE = ("gigpo",)  # estimators computed on the rows themselves (no step order)


def _ensure_cpu_jax():
    """Keep JAX off the accelerator torch holds: unless JAX_PLATFORMS is set or JAX's backends are
    already up, JAX uses its CPU backend only (no GPU client, so no preallocation)."""
    import jax
    from jax._src import xla_bridge

    if not os.environ.get("JAX_PLATFORMS") and not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")
    return jax


def _torch_of(x) -> Optional[Any]:
    mod = type(x).__module__
    return sys.modules.get("torch") if mod.startswith("torch") else None


def _host(name: str, x, ndim: int, n: Optional[int] = None) -> np.ndarray:
    if _torch_of(x) is not None:
        x = x.detach().float().cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim != ndim:
        raise ValueError(f"compute_step_advantage: {name} must have {ndim} dimension(s) "
                         f"({'[bs, L]' if ndim == 2 else '[bs]'}); got shape {a.shape}.")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"compute_step_advantage: {name} has {a.shape[0]} rows, token_level_rewards {n}; "
                         "pass one entry per row.")
    return a


def _hashable(x):
    """verl-agent's ``to_hashable``: str/number as is, arrays and sequences as tuples, dicts sorted."""
    if isinstance(x, (str, bytes, int, float, bool, np.integer, np.floating)):
        return x.item() if isinstance(x, (np.integer, np.floating)) else x
    if isinstance(x, np.ndarray):
        return tuple(x.reshape(-1).tolist())
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(e) for e in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    raise ValueError(f"compute_step_advantage: anchor_obs holds a {type(x).__name__}; use str, numbers, arrays, "
                     "lists or dicts of them.")


def _codes(values) -> np.ndarray:
    """Integer codes of equal values (any hashable)."""
    seen: dict = {}
    return np.fromiter((seen.setdefault(v, len(seen)) for v in values), np.int64, count=len(values))


def _factor(values) -> np.ndarray:
    """Codes of equal values as verl-agent's ``to_hashable`` compares them: hashable values as they are
    (str, numbers), anything else (arrays, lists, dicts) through ``_hashable``."""
    values = list(values)
    try:
        return _codes(values)
    except TypeError:
        return _codes([_hashable(v) for v in values])


def similar_groups(anchor_obs, index_codes: np.ndarray, thresh: float) -> np.ndarray:
    """verl-agent's similarity clustering: within each group, rows in batch order join the first
    cluster whose first observation has difflib ratio >= ``thresh`` with theirs, else open one."""
    if not 0.0 < thresh < 1.0:
        raise ValueError(f"compute_step_advantage: similarity_thresh={thresh} must be in (0, 1) with "
                         "enable_similarity=True.")
    out = np.empty(len(anchor_obs), np.int64)
    n_clusters = 0
    for g in np.unique(index_codes):
        reps: list = []
        for i in np.flatnonzero(index_codes == g):
            obs = anchor_obs[i]
            if not isinstance(obs, str):
                raise ValueError("compute_step_advantage: enable_similarity compares text; anchor_obs must hold str.")
            for c, rep in reps:
                if difflib.SequenceMatcher(None, obs, rep).ratio() >= thresh:
                    out[i] = c
                    break
            else:
                reps.append((n_clusters, obs))
                out[i] = n_clusters
                n_clusters += 1
    return out


def _group_norm(x: np.ndarray, codes: np.ndarray, *, std: bool, eps: float, singleton_mean_zero: bool) -> np.ndarray:
    """(x - mean_g) [/ (std_g + eps)] per group code, unbiased std; a one-row group: mean 0 (or the
    value itself, ``singleton_mean_zero=False``) and std 1."""
    n = np.bincount(codes).astype(np.float64)
    mean = np.bincount(codes, weights=x) / n
    dev = x - mean[codes]
    var = np.bincount(codes, weights=dev * dev) / np.maximum(n - 1, 1)
    one = n[codes] == 1
    mu = np.where(one, 0.0 if singleton_mean_zero else x, mean[codes])
    sd = np.where(one, 1.0, np.sqrt(var)[codes])
    return (x - mu) / (sd + eps) if std else x - mu


def gigpo_rows(scores: np.ndarray, step_returns: np.ndarray, anchor_obs, index, *, epsilon: float = 1e-6,
               step_advantage_w: float = 1.0, mode: str = "mean_norm", enable_similarity: bool = False,
               similarity_thresh: float = 0.95) -> np.ndarray:
    """verl-agent's GiGPO per row (module docstring): ``scores`` [bs] the episode scores, ``step_returns``
    [bs] G_t; float64 [bs]."""
    std = _mode(mode) == "mean_std"
    u = _factor(index)
    if enable_similarity:
        g = similar_groups(list(anchor_obs), u, similarity_thresh)
    else:
        o = _factor(anchor_obs)
        g = np.unique(u * (int(o.max(initial=0)) + 1) + o, return_inverse=True)[1].reshape(-1)
    episode = _group_norm(scores.astype(np.float64), u, std=std, eps=epsilon, singleton_mean_zero=True)
    step = _group_norm(step_returns.astype(np.float64), g, std=std, eps=epsilon, singleton_mean_zero=False)
    return episode + step_advantage_w * step


def _mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"compute_step_advantage: mode={mode!r}; use 'mean_norm' or 'mean_std_norm' (verl-agent's).")
    return MODES[mode]


def _pow2(n: int, lo: int = 1) -> int:
    return max(lo, 1 << max(int(n) - 1, 0).bit_length())


def step_order(traj: np.ndarray, step_index: Optional[np.ndarray]) -> np.ndarray:
    """Each row's step within its trajectory: ``step_index`` (checked to number each trajectory's rows
    0 .. L-1), else the rows' order in the batch, refused when a trajectory's rows are not contiguous."""
    n = len(traj)
    if step_index is not None:
        step = np.asarray(step_index).astype(np.int64)
        key = np.lexsort((step, traj))
        counts = np.bincount(traj)
        want = np.concatenate([np.arange(c) for c in counts[np.unique(traj)]]) if n else step
        if not np.array_equal(step[key], want):
            raise ValueError("compute_step_advantage: step_index must number each trajectory's rows 0, 1, ..., L-1 "
                             "(each once); it does not.")
        return step
    first = np.full(traj.max() + 1 if n else 0, -1)
    step = np.empty(n, np.int64)
    seen = np.zeros_like(first)
    last = -1
    for i, t in enumerate(traj.tolist()):  # O(rows); a trajectory must not resume after another began
        if first[t] < 0:
            first[t] = i
        elif t != last:
            raise ValueError(f"compute_step_advantage: the rows of trajectory {t} (traj_index order) are not contiguous, "
                             "so their step order cannot be known (was the batch reordered, e.g. by balance_batch?); "
                             "pass step_index=..., or compute advantages before reordering.")
        step[i] = seen[t]
        seen[t] += 1
        last = t
    return step


def _rewards_from_returns(G: np.ndarray, traj: np.ndarray, step: np.ndarray, gamma: float) -> np.ndarray:
    """r_t = G_t - gamma G_{t+1} (G after the last step: 0)."""
    nxt = np.zeros(len(G))
    order = np.lexsort((step, traj))
    same = traj[order][1:] == traj[order][:-1]
    nxt[order[:-1][same]] = G[order[1:][same]]
    return G - gamma * nxt


def _outcomes(outcome, scores: np.ndarray) -> np.ndarray:
    from ..credit.types import FAILURE, SUCCESS

    if outcome is None:
        return np.where(scores > 0, SUCCESS, FAILURE).astype(np.int32)
    o = np.asarray(outcome)
    if o.dtype == bool:
        return np.where(o, SUCCESS, FAILURE).astype(np.int32)
    return o.astype(np.int32)


def _estimator_rows(name: str, scores, G, anchor_obs, index, traj_index, *, step_index, step_reward, outcome,
                    epsilon, mode, estimator_config) -> np.ndarray:
    """Any registered estimator on the rows: their padded StepBatch, the estimator, one number per row."""
    jax = _ensure_cpu_jax()
    from ..credit.estimators import compute_advantages, get_estimator
    from .rows import from_rows, to_rows

    defaults = get_estimator(name).config_type()  # an unknown name raises, listing the registered ones
    fields = {f.name for f in dataclasses.fields(defaults)}
    cfg = dict(estimator_config)
    if mode is not None and "norm" in fields:
        cfg.setdefault("norm", _mode(mode))
    if "eps" in fields:
        cfg.setdefault("eps", epsilon)
    gamma = float(cfg.get("gamma", getattr(defaults, "gamma", 0.95)))
    u = _factor(index)
    t = _factor(traj_index)
    traj = np.unique(u * (int(t.max(initial=0)) + 1) + t, return_inverse=True)[1].reshape(-1)
    step = step_order(traj, step_index)
    if step_reward is None:
        r = _rewards_from_returns(G, traj, step, gamma)
    else:
        r = np.asarray(step_reward, np.float64)
        want = _rewards_from_returns(G, traj, step, gamma)  # the rewards the returns imply in this order
        if not np.allclose(want, r, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(G).max(initial=0.0)))):
            raise ValueError("compute_step_advantage: step_reward does not discount to step_rewards (gamma="
                             f"{gamma}) in the step order used: the rows are not in step order, or gamma differs from "
                             "the one step_rewards were computed with; pass step_index=... and gamma=....")
    o = _outcomes(outcome, scores)
    per_traj = np.bincount(u, minlength=u.max() + 1 if len(u) else 0)  # rows per group
    trajs_per_group = np.array([len(set(traj[u == g].tolist())) for g in range(len(per_traj))])
    several = trajs_per_group[u] >= 2
    adv = np.zeros(len(scores))
    if several.any():
        rows = np.flatnonzero(several)
        B = len(np.unique(u[rows]))
        K = int(max(trajs_per_group[trajs_per_group >= 2]))
        T = int(step[rows].max()) + 1
        batch, ix = from_rows(u[rows], traj[rows], step[rows], [anchor_obs[i] for i in rows], r[rows].astype(np.float32),
                              o[rows], shape=(_pow2(B), _pow2(K, 2), _pow2(T, 4)))
        on_cpu = jax.default_device(jax.devices("cpu")[0]) if not os.environ.get("JAX_PLATFORMS") else contextlib.nullcontext()
        with on_cpu:
            out = compute_advantages(name, batch, check=False, **cfg)
        adv[rows] = to_rows(np.asarray(out.advantage), ix)
    if (~several).any():  # one trajectory in the group: verl-agent's episode rule, no step term
        lone = ~several
        std = cfg.get("norm", getattr(defaults, "norm", "mean")) == "mean_std"
        adv[lone] = scores[lone] / (1.0 + epsilon) if std else scores[lone]
    return adv


def compute_step_advantage(token_level_rewards, step_rewards, response_mask, anchor_obs, index, traj_index, *,
                           estimator: str = "gigpo", epsilon: float = 1e-6, step_advantage_w: float = 1.0,
                           mode: Optional[str] = None, enable_similarity: bool = False, similarity_thresh: float = 0.95,
                           step_index=None, step_reward=None, outcome=None, **estimator_config):
    """Step credit for verl-agent's rows (module docstring); returns ``(advantages, returns)``, [bs, L] each."""
    torch = _torch_of(token_level_rewards)
    shape = tuple(getattr(token_level_rewards, "shape", np.shape(token_level_rewards)))
    if len(shape) != 2:
        raise ValueError(f"compute_step_advantage: token_level_rewards must be [bs, L]; got shape {shape}.")
    n = shape[0]
    mshape = tuple(getattr(response_mask, "shape", np.shape(response_mask)))
    if mshape != shape:
        raise ValueError(f"compute_step_advantage: response_mask has shape {mshape}, token_level_rewards {shape}; "
                         "they must match.")
    # the episode score S_i: the row's token rewards summed (in torch when torch came in, as verl-agent sums them)
    row_sum = token_level_rewards.detach().float().sum(-1) if torch is not None else np.asarray(
        token_level_rewards, np.float64).sum(-1)
    scores = _host("token_level_rewards", row_sum, 1, n).astype(np.float64)
    G = _host("step_rewards", step_rewards, 1, n).astype(np.float64)
    obs = list(_host("anchor_obs", np.asarray(anchor_obs, dtype=object), 1, n))
    idx = _host("index", np.asarray(index, dtype=object), 1, n)
    traj = _host("traj_index", np.asarray(traj_index, dtype=object), 1, n)
    for name, extra in (("step_index", step_index), ("step_reward", step_reward), ("outcome", outcome)):
        if extra is not None:
            _host(name, extra, 1, n)
    if not np.isfinite(G).all() or not np.isfinite(scores).all():
        raise ValueError("compute_step_advantage: step_rewards and token_level_rewards must be finite (a NaN or inf "
                         "reached them).")
    if estimator in ORDER_FREE:
        if estimator_config:
            raise ValueError(f"compute_step_advantage: estimator='gigpo' (verl-agent's) takes no settings beyond epsilon, "
                             f"step_advantage_w, mode and the similarity ones; got {sorted(estimator_config)}.")
        adv = gigpo_rows(scores, G, obs, idx, epsilon=epsilon, step_advantage_w=step_advantage_w, mode=mode or "mean_norm",
                         enable_similarity=enable_similarity, similarity_thresh=similarity_thresh)
    else:
        if enable_similarity:
            raise ValueError("compute_step_advantage: enable_similarity is verl-agent's GiGPO option; for other "
                             "estimators merge similar observations with bepo_jax.merge_similar (docs/verl.md).")
        if step_advantage_w != 1.0:
            raise ValueError(f"compute_step_advantage: step_advantage_w is verl-agent's GiGPO weight; set {estimator!r}'s "
                             "own step weight instead (its config field, e.g. w= for gated_bepo, omega= for ecpo).")
        adv = _estimator_rows(estimator, scores, G, obs, idx, traj, step_index=step_index, step_reward=step_reward,
                              outcome=outcome, epsilon=epsilon, mode=mode, estimator_config=estimator_config)
    if torch is not None:
        a = torch.from_numpy(adv.astype(np.float32)).to(token_level_rewards.device)
        out = (a[:, None] * response_mask.to(a.dtype)).to(token_level_rewards.dtype)
        return out, out
    tlr_dtype = np.asarray(token_level_rewards).dtype
    out = (adv[:, None] * np.asarray(response_mask, np.float64)).astype(
        tlr_dtype if np.issubdtype(tlr_dtype, np.floating) else np.float32)
    return out, out


def register(names=None, **estimator_config) -> list[str]:
    """Register bepo_jax's estimators in verl's registry (``verl.trainer.ppo.core_algos.register_adv_est``)
    so that ``algorithm.adv_estimator=<name>`` runs them (docs/verl.md). verl's generic estimator call
    passes only ``token_level_rewards``, ``response_mask``, ``index`` and ``config``, so verl's
    ``compute_advantage`` is wrapped as well: for these names it reads the rows' fields from the
    ``DataProto`` (``step_rewards`` in ``batch``; ``anchor_obs``, ``uid``, ``traj_uid`` and, when present,
    ``step_index`` / ``rewards`` in ``non_tensor_batch``), naming any that is missing; the estimators'
    settings are ``estimator_config`` (their discount is verl's ``gamma``). Returns the names as verl
    knows them."""
    from verl.trainer.ppo import core_algos, ray_trainer

    from ..credit.estimators import ESTIMATORS

    names = list(names) if names is not None else [n for n in ESTIMATORS if n != "confidence_returns"]
    unknown = [n for n in names if n not in ESTIMATORS]
    if unknown:
        raise ValueError(f"register: unknown estimator(s) {unknown}; choose from {sorted(ESTIMATORS)}.")
    for name in names:
        key = f"bepo_{name}" if name in ("grpo",) else name

        def direct(*args, _name=name, **kwargs):
            raise ValueError(f"verl called estimator {_name!r} without the rows' fields; bepo_jax.integrations.verl."
                             "register() wraps ray_trainer.compute_advantage for it: call register() before the trainer "
                             "is built.")

        if key not in getattr(core_algos, "ADV_ESTIMATOR_REGISTRY", {}):
            core_algos.register_adv_est(key)(direct)
    original = getattr(ray_trainer.compute_advantage, "__wrapped_by_bepo__", ray_trainer.compute_advantage)
    ours = {(f"bepo_{n}" if n in ("grpo",) else n): n for n in names}

    def compute_advantage(data, adv_estimator, *args, **kwargs):
        name = ours.get(str(getattr(adv_estimator, "value", adv_estimator)))
        if name is None:
            return original(data, adv_estimator, *args, **kwargs)
        gamma = kwargs.get("gamma", args[0] if args else 1.0)  # verl's compute_advantage(data, est, gamma=1.0, ...)
        adv, ret = advantage_from_dataproto(data, name, **{"gamma": gamma, **estimator_config})
        data.batch["advantages"], data.batch["returns"] = adv, ret
        return data

    compute_advantage.__wrapped_by_bepo__ = original
    ray_trainer.compute_advantage = compute_advantage
    return list(ours)


def _config_type(name: str):
    from ..credit.estimators import get_estimator

    return get_estimator(name).config_type


def advantage_from_dataproto(data, estimator: str, **config):
    """``compute_step_advantage`` on a verl ``DataProto`` carrying verl-agent's fields (register())."""
    nt, b = data.non_tensor_batch, data.batch
    missing = [f"non_tensor_batch[{k!r}]" for k in ("anchor_obs", "uid", "traj_uid") if k not in nt]
    missing += [f"batch[{k!r}]" for k in ("token_level_rewards", "response_mask", "step_rewards") if k not in b]
    if missing:
        raise ValueError(f"bepo_jax ({estimator}): the batch lacks {', '.join(missing)}; verl-agent's rollout loop "
                         "records them (step_rewards: gigpo.core_gigpo.compute_step_discounted_returns).")
    extra = {k: nt[k] for k in ("step_index",) if k in nt}
    if estimator != "gigpo":
        fields = {f.name for f in dataclasses.fields(_config_type(estimator))}
        extra.update({k: v for k, v in config.items() if k in fields or k != "gamma"})
        if "rewards" in nt:
            extra["step_reward"] = np.asarray(nt["rewards"], np.float64)
    return compute_step_advantage(b["token_level_rewards"], b["step_rewards"], b["response_mask"], nt["anchor_obs"],
                                  nt["uid"], nt["traj_uid"], estimator=estimator, **extra)
