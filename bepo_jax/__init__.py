"""bepo_jax: critic-free, step-level credit assignment for LLM agents, in JAX.

Gated-BEPO (confidence-gated Bellman credit on the empirical state graph of each group of
K trajectories) and the baselines it is compared with, as jittable, vmappable kernels. The
numerics contract is docs/ in the repository (data model, every estimator's equations and
conventions, defaults, test vectors). ``import bepo_jax`` loads JAX and NumPy only; the
agent stack (``bepo_jax.agent``: environments, models, rollouts, training), the trainer
integrations (``bepo_jax.integrations``) and the credit lab (``bepo_jax.lab``) are imported
when you need them.

The public names, each documented where it is defined:

Data model (``bepo_jax.credit.types``)
    ``StepBatch`` — the padded records of B groups x K trajectories x T steps;
    ``SUCCESS``, ``FAILURE``, ``TRUNCATED`` — trajectory outcome codes; ``check_batch`` —
    host-side validation with errors that name the field; ``sanitize`` and ``group_flags`` —
    the in-jit guard and its per-group flags ``INVALID_OUTCOME``, ``INVALID_MASK``,
    ``INVALID_VALUE``, ``INVALID_PENALTY``, ``INVALID_SCALE``, ``SINGLE_TRAJECTORY``,
    ``DROPPED`` (``INVALID_FLAGS`` their union; ``SCALE_LIMIT`` the largest magnitude
    accepted); ``split_key64`` — a 64-bit host key as the two uint32 words of ``obs_key``.

Estimators (``bepo_jax.credit.estimators``; one registry, ``ESTIMATORS``)
    {registered}
    ``GraphDiagnostics`` is the graph estimators' shared diagnostics. ``compute_advantages`` runs one by
    name (``tfidf_features``: ProxMO's TF-IDF of observation texts); ``register_estimator`` adds one (an
    ``Estimator`` entry); ``get_estimator``, ``make_config`` and ``estimator_settings`` read and validate
    settings; ``parse_estimator_spec`` reads ``LABEL=NAME:field=value``; ``max_states_for`` sizes the
    fixed point's state bucket. ``confidence_features`` / ``confidence_loss`` train a ``ConfidenceHead``
    (Flax; loaded on first use).

Around the kernels
    ``hash_observation``, ``hash_observations`` (host digests of text), ``hash_tokens``
    (the in-jit digest of token arrays); ``action_keys`` / ``canonical_action`` (the optional
    ``StepBatch.action_key``: canonical action texts or ids, hashed); ``Trajectory`` and ``batch_from_trajectories``
    (a StepBatch from Python lists); ``from_rows`` / ``to_rows`` / ``RowIndex`` (verl-agent's
    flat rows); ``SimilarityConfig`` / ``merge_similar`` (near-duplicate states);
    ``to_token_advantages`` (record -> token credit).
"""

from ._version import __version__
from .credit.builders import Trajectory, batch_from_trajectories
from .credit import estimators as _estimators
from .credit.estimators import (ESTIMATORS, Estimator, compute_advantages, confidence_features, confidence_loss,
                                estimator_settings, get_estimator, make_config, max_states_for, parse_estimator_spec,
                                register_estimator, tfidf_features)
from .credit.hashing import action_keys, canonical_action, hash_observation, hash_observations, hash_tokens
from .credit.similarity import SimilarityConfig, merge_similar
from .credit.tokens import to_token_advantages
from .credit.types import (DROPPED, FAILURE, INVALID_FLAGS, INVALID_MASK, INVALID_OUTCOME, INVALID_PENALTY,
                           INVALID_SCALE, INVALID_VALUE, SCALE_LIMIT, SINGLE_TRAJECTORY, SUCCESS, TRUNCATED,
                           GraphDiagnostics, StepBatch, check_batch, group_flags, sanitize, split_key64)
from .integrations.rows import RowIndex, from_rows, to_rows

__all__ = [
    "__version__",
    # data model
    "StepBatch", "SUCCESS", "FAILURE", "TRUNCATED", "check_batch", "sanitize", "group_flags", "split_key64",
    "INVALID_FLAGS", "INVALID_OUTCOME", "INVALID_MASK", "INVALID_VALUE", "INVALID_PENALTY", "INVALID_SCALE",
    "SCALE_LIMIT", "SINGLE_TRAJECTORY", "DROPPED",
    # estimators: every registered one's entry, kernel, config and output (below), and the registry
    "GraphDiagnostics", "tfidf_features", "ConfidenceHead", "confidence_features", "confidence_loss",
    "ESTIMATORS", "Estimator", "register_estimator", "compute_advantages", "get_estimator", "make_config",
    "estimator_settings", "parse_estimator_spec", "max_states_for",
    # around the kernels
    "hash_observation", "hash_observations", "hash_tokens", "action_keys", "canonical_action", "Trajectory", "batch_from_trajectories",
    "RowIndex", "from_rows", "to_rows", "SimilarityConfig", "merge_similar", "to_token_advantages",
]

# Every registered estimator's host entry, kernel, config and output type is public because it is registered
# (``public_names``); the package docstring names them from the same registry.
_REGISTERED = _estimators.public_names()
globals().update(_REGISTERED)
__all__ += [n for n in _REGISTERED if n not in __all__]


def _registered_paragraph() -> str:
    kinds = {"entries": [], "configs": [], "outputs": []}
    for e in ESTIMATORS.values():
        for kind, obj in (("entries", e.fn), ("configs", e.config_type), ("outputs", e.output_type)):
            if f"``{obj.__name__}``" not in kinds[kind]:
                kinds[kind].append(f"``{obj.__name__}``")
    import textwrap

    text = (f"Host entries {', '.join(kinds['entries'])} and their jittable ``*_kernel``; configs "
            f"{', '.join(kinds['configs'])}; outputs {', '.join(kinds['outputs'])} (read from the registry).")
    return textwrap.fill(text, 100, subsequent_indent="    ")


__doc__ = __doc__.replace("{registered}", _registered_paragraph())


def __getattr__(name):  # ConfidenceHead needs Flax: loaded on first use, so `import bepo_jax` loads none
    if name == "ConfidenceHead":
        from .credit.estimators.confidence_head import ConfidenceHead

        return ConfidenceHead
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
