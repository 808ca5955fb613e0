"""ProxMO as its authors' code computes it (GithubX-F/ProxMO-RL, ``proxmo/core_proxmo.py`` and its trainer
``verl/trainer/ppo/ray_trainer.py`` at 496efa7; docs/estimators.md), with the defaults of its run scripts.

Per group of K trajectories (rows = the valid records; a trajectory counts once per step), with R_k the
episode reward (the sum of its rewards), p_i the per-step penalty (``StepBatch.penalty``: the
invalid-action penalty, -0.1 x invalid in the scripts, per row and never discounted):

1. episode term: S_i = R_k + p_i; E_i = S_i - mean over the group's rows (``mode`` "soft" or "mean":
   the code's ``soft_grouping`` / ``mean_norm``), or (S_i - mean) / (std + eps) with the unbiased std
   ("mean_std": ``mean_std_norm``);
2. PSC (Polarized Signal Controller, on in the scripts): p = clip(mean of the rows' S, 0, 1) (written
   for 0/1 rewards: with rewards of 10, any group with a success has p = 1), beta = target_range /
   (sigmoid(1) - 0.5), w_i = 1 + beta (sigmoid((1 - p)^alpha) - 0.5) where S_i > 0.5, else
   1 + beta (sigmoid(-p^alpha) - 0.5); E_i <- w_i E_i;
3. step term on the discounted return G_i = sum_{l >= 0} gamma^l r_{t+l} + p_i (gamma 0.95):
   - "soft": a softmax over the group's rows of cos(x_i, x_j) / temperature (0.1), where x is the
     observation's TF-IDF vector (``tfidf_features``: scikit-learn's ``TfidfVectorizer(max_features=1024)``
     fitted on every row of the whole batch, then L2-normalised with +1e-8), so the row itself is in
     its own kernel: baseline_i = sum_j softmax_j G_j, a_step = G_i - baseline_i; a row whose state has
     no near-duplicate gets a baseline near its own G and almost no step credit (an implicit gate);
   - "mean" / "mean_std": rows grouped by identical observation within the group, G centred (or
     standardised) within each; a row alone in its group gets 0;
4. A_i = E_i + w a_step_i (w = ``step_advantage_w``, 1.0).

Without observation texts (``features`` None: the registered kernel, the credit lab) the soft kernel
sees each distinct observation (its hashed key) as one word of its own: cos = 1 for identical
observations, 0 otherwise, which equals the TF-IDF kernel whenever different observations share no
word. When the batch's texts hold no word of two or more letters (scikit-learn's empty vocabulary),
the code's step term is 0 everywhere; so is ours (``vocabulary=False``).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..configs import check_choice, check_int, check_range, pytree_config
from ..graph import history_keys, state_ids
from ..returns import discounted_returns
from ..stats import masked_moments
from ..types import PerRecord, StepBatch, pytree_dataclass
from .common import entry_point, stop_gradient, with_sanitized_input
from .gigpo import step_group_advantage
from .grpo import outcome_advantage
from .registry import register_estimator

@pytree_dataclass
class ProxMOOutput:
    """ProxMO's output as its authors' code computes it (docs/estimators.md, ProxMO): ``advantage`` =
    ``a_episode`` + w ``a_step``; ``a_episode`` the PSC-weighted episode term; ``psc_weight`` its
    weight (1 without PSC); ``a_step`` = G - ``baseline``, the discounted return minus its soft
    (or exact) state baseline; all float32 [B, K, T]; ``invalid`` int32 [B] input flags."""

    advantage: PerRecord
    a_episode: PerRecord
    a_step: PerRecord
    psc_weight: PerRecord
    baseline: PerRecord
    invalid: Int[Array, "B"]


MODES = ("soft", "mean", "mean_std")  # the code's soft_grouping, mean_norm, mean_std_norm


@pytree_config(static=("mode", "psc", "max_features"))
class ProxMOConfig:
    """ProxMO settings, defaulting to its run scripts (run_alfworld.sh, run_webshop.sh).

    mode: "soft" (default: the scripts' ``soft_grouping``), "mean" (``mean_norm``, the yaml's fallback)
      or "mean_std" (``mean_std_norm``).
    gamma: discount of the step return G (``algorithm.gamma`` 0.95), in [0, 1].
    w: weight of the step term (``step_advantage_w``, 1.0).
    psc: the Polarized Signal Controller on the episode term (True in the scripts; False in the yaml).
    psc_alpha: its steepness (4.0 in the scripts; the trainer's fallback 5.0).
    psc_target_range: its largest weight change (0.05 in the scripts; the trainer's fallback 0.2):
      beta = target_range / (sigmoid(1) - 0.5).
    temperature: of the soft kernel's softmax (0.1).
    eps: added to the std (1e-6).
    max_features: the TF-IDF vocabulary size (1024), used by ``tfidf_features``.
    """

    mode: str = "soft"
    gamma: float = 0.95
    w: float = 1.0
    psc: bool = True
    psc_alpha: float = 4.0
    psc_target_range: float = 0.05
    temperature: float = 0.1
    eps: float = 1e-6
    max_features: int = 1024

    def __post_init__(self):
        name = "ProxMOConfig"
        check_choice(name, "mode", self.mode, MODES)
        check_range(name, "gamma", self.gamma, lo=0.0, hi=1.0)
        check_range(name, "w", self.w)
        if not isinstance(self.psc, bool):
            raise ValueError(f"ProxMOConfig.psc={self.psc!r}; give True or False.")
        check_range(name, "psc_alpha", self.psc_alpha, lo=0.0, lo_open=True)
        check_range(name, "psc_target_range", self.psc_target_range, lo=0.0)
        check_range(name, "temperature", self.temperature, lo=0.0, lo_open=True)
        check_range(name, "eps", self.eps, lo=0.0, lo_open=True)
        check_int(name, "max_features", self.max_features, lo=1)

    @property
    def psc_beta(self) -> float:
        """beta = target_range / (sigmoid(1) - 0.5), as the trainer derives it."""
        return self.psc_target_range / (1.0 / (1.0 + math.exp(-1.0)) - 0.5)


def psc_weight(score: Float[Array, "K T"], mask: Bool[Array, "K T"], config: ProxMOConfig) -> Float[Array, "K T"]:
    """PSC's weight of each row (step 2 of the module docstring); 1 where PSC is off."""
    if not config.psc:
        return jnp.ones_like(score)
    p = jnp.clip(masked_moments(score, mask, ddof=1).mean, 0.0, 1.0)
    beta = jnp.float32(config.psc_beta)
    w_pos = 1.0 + beta * (jax.nn.sigmoid(jnp.power(1.0 - p, config.psc_alpha)) - 0.5)
    w_neg = 1.0 + beta * (jax.nn.sigmoid(-jnp.power(p, config.psc_alpha)) - 0.5)
    return jnp.where(score > 0.5, w_pos, w_neg)


def soft_baseline(g: Float[Array, "N"], valid: Bool[Array, "N"], sim: Float[Array, "N N"], temperature
                  ) -> Float[Array, "N"]:
    """baseline_i = sum_j softmax_j(sim_ij / temperature over the valid j) g_j."""
    logits = jnp.where(valid[None, :], sim / temperature, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1) @ jnp.where(valid, g, 0.0)


def _group(obs_key, reward, mask, outcome, penalty, features, config: ProxMOConfig, vocabulary: bool):
    del outcome
    K, T = mask.shape
    n = K * T
    pen = jnp.where(mask, penalty, 0.0)
    score = jnp.sum(jnp.where(mask, reward, 0.0), axis=-1)[:, None] + pen  # S_i = R_k + p_i
    norm = "mean_std" if config.mode == "mean_std" else "mean"
    weight = jnp.where(mask, psc_weight(score, mask, config), 0.0)
    a_ep = outcome_advantage(reward, penalty, mask, norm=norm, weighting="step", std="unbiased",
                             eps=config.eps) * weight
    g = jnp.where(mask, discounted_returns(reward, mask, config.gamma) + pen, 0.0)
    valid = mask.reshape(n)
    if config.mode == "soft":
        if features is None:  # each distinct observation one word of its own (module docstring)
            k = obs_key.reshape(n, -1)
            sim = jnp.all(k[:, None, :] == k[None, :, :], axis=-1).astype(jnp.float32)
        else:
            x = features.reshape(n, -1)
            x = x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-8)
            sim = x @ x.T
        baseline = soft_baseline(g.reshape(n), valid, sim, config.temperature).reshape(K, T)
    else:
        ids, _ = state_ids(history_keys(obs_key, 0), mask)
        baseline = g - step_group_advantage(g, ids, mask, norm=config.mode, std="unbiased", eps=config.eps)
    baseline = jnp.where(vocabulary, baseline, g)  # no word in the batch's texts: no step credit (the code's fallback)
    a_step = jnp.where(mask, g - baseline, 0.0)
    adv = jnp.where(mask, a_ep + config.w * a_step, 0.0)
    return ProxMOOutput(advantage=adv, a_episode=a_ep, a_step=a_step, psc_weight=weight,
                        baseline=jnp.where(mask, baseline, 0.0), invalid=jnp.zeros((), jnp.int32))


@with_sanitized_input
def proxmo_kernel(batch: StepBatch, config: ProxMOConfig, features: Optional[Float[Array, "B K T F"]] = None,
                  vocabulary: bool | Bool[Array, ""] = True) -> ProxMOOutput:
    """The jittable ProxMO kernel (no host checks; invalid groups are dropped and flagged). ``features``:
    the rows' TF-IDF vectors (``tfidf_features``), or None for the hashed observations as words;
    ``vocabulary`` (a bool, traced or not): False when the batch's texts held no word (the step term is
    then 0). ``text_inputs`` makes both from a rollout's state texts."""
    fn = lambda o, r, m, c, p, f: _group(o, r, m, c, p, f, config, vocabulary)  # f None: an empty pytree per group
    return stop_gradient(jax.vmap(fn)(batch.obs_key, batch.reward, batch.mask, batch.outcome,
                                      batch.penalty_or_zeros(), features))


_proxmo_jit = jax.jit(proxmo_kernel)


def tfidf_features(texts: Sequence[Sequence[Sequence[str]]], shape: tuple[int, int, int], *, max_features: int = 1024
                   ) -> Optional[np.ndarray]:
    """The rows' TF-IDF vectors float32 [B, K, T, F] as ProxMO's code makes them: scikit-learn's
    ``TfidfVectorizer(max_features=max_features)`` (every other argument its default: lower-case, words of
    two or more letters or digits, smooth idf, L2 rows) fitted on every row of the whole batch (all groups),
    ``texts[b][k][t]`` the observation before step t of trajectory k of group b (``str()`` of it, as the
    code does; rows past a trajectory's end are absent). None when the texts hold no word (the code's
    fallback: no step credit). Needs scikit-learn (``pip install 'bepo-jax[proxmo]'``)."""
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
    except ImportError as e:
        raise ImportError("ProxMO's TF-IDF grouping needs scikit-learn: pip install 'bepo-jax[proxmo]' (or "
                          "scikit-learn), or use mode='mean' / features=None.") from e
    B, K, T = shape
    if len(texts) != B or any(len(g) != K for g in texts) or any(len(tr) > T for g in texts for tr in g):
        raise ValueError(f"tfidf_features: texts must be [B={B}][K={K}][at most T={T}] observation strings, one per "
                         "valid step of each trajectory.")
    where = [(b, k, t) for b in range(B) for k in range(K) for t in range(len(texts[b][k]))]
    docs = [str(texts[b][k][t]) for b, k, t in where]
    try:
        x = TfidfVectorizer(max_features=max_features).fit_transform(docs).toarray().astype(np.float32)
    except ValueError:  # empty vocabulary
        return None
    out = np.zeros((B, K, T, x.shape[1]), np.float32)
    for (b, k, t), row in zip(where, x):
        out[b, k, t] = row
    return out


def text_inputs(texts: np.ndarray, mask: np.ndarray, config: ProxMOConfig
                ) -> tuple[()] | tuple[Float[Array, "B K T F"], Bool[Array, ""]]:
    """``proxmo_kernel``'s ``(features, vocabulary)`` from a rollout's state texts: ``texts`` [B, K, T] the
    string each record's state was hashed from, ``mask`` [B, K, T] the valid records (a prefix of each
    trajectory). The TF-IDF vectors (``tfidf_features``) are padded with zero words to ``max_features``
    (cosines and norms unchanged), so a jitted update sees one shape whatever the batch's vocabulary;
    with no word in the texts, zeros and ``vocabulary`` False. ``()`` unless ``config.mode`` is "soft"
    (the other modes group identical observations and read no texts). The registry's ``text_inputs``."""
    if config.mode != "soft":
        return ()
    texts, mask = np.asarray(texts, object), np.asarray(mask, bool)
    if texts.shape != mask.shape or texts.ndim != 3:
        raise ValueError(f"text_inputs: texts {texts.shape} and mask {mask.shape} must both be [B, K, T].")
    B, K, T = mask.shape
    rows = [[[str(x) for x in texts[b, k, : int(mask[b, k].sum())]] for k in range(K)] for b in range(B)]
    if any(not mask[b, k, : len(rows[b][k])].all() for b in range(B) for k in range(K)):
        raise ValueError("text_inputs: each trajectory's valid records must come first (mask a prefix per row).")
    x = tfidf_features(rows, (B, K, T), max_features=config.max_features)
    out = np.zeros((B, K, T, config.max_features), np.float32)
    if x is not None:
        out[..., : x.shape[-1]] = x
    return jnp.asarray(out), jnp.asarray(x is not None)


@register_estimator("proxmo", kernel=proxmo_kernel, config=ProxMOConfig, output=ProxMOOutput, graph=False,
                    text_inputs=text_inputs,
                    definition="PSC-weighted episode term (R + p centred over the group's rows) + w (G - soft baseline): "
                               "the baseline a softmax over the group's rows of cos(tf-idf) / 0.1, the row itself "
                               "included",
                    source="ProxMO (arXiv 2602.19225); official code GithubX-F/ProxMO-RL proxmo/core_proxmo.py @ 496efa7")
def proxmo(batch: StepBatch, config: ProxMOConfig = ProxMOConfig(), *, texts=None, check: bool = True
           ) -> ProxMOOutput:
    """ProxMO advantage as its authors' code computes it (module docstring); ``.advantage`` float32 [B, K, T].
    ``texts``: the observations as text (the soft grouping's TF-IDF, ``tfidf_features``), either
    ``texts[b][k][t]`` for every valid step or an array [B, K, T] of strings as the rollouts record them
    (``text_inputs``: padded to ``max_features`` words, one compiled program per batch shape); None: each
    distinct hashed observation is one word of its own."""
    features, vocabulary = None, True
    if texts is not None and config.mode == "soft":
        if isinstance(texts, np.ndarray):
            features, vocabulary = text_inputs(texts, np.asarray(batch.mask), config)
        else:  # nested lists of the valid steps' texts: the vectors at the batch's own vocabulary size
            features = tfidf_features(texts, tuple(np.shape(batch.mask)), max_features=config.max_features)
            vocabulary = features is not None
    return entry_point(_proxmo_jit, batch, config, ProxMOConfig, check=check,
                       extra=(None if features is None else jnp.asarray(features), vocabulary))
