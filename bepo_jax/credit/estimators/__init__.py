"""Advantage estimators: every one is (StepBatch, Config) -> Output, registered in ``ESTIMATORS``.

Each module registers its estimators when it is imported (``estimator_entry``, or
``register_estimator`` for an entry with further arguments). The built-ins are imported below in
the registry's order (baselines, then the BEPO family); any other module of this package registers
itself after them. An estimator's entry, kernel, config and output type are public because it is
registered (``public_names``). An estimator of your own registers the same way from your own module,
and ``bepo-jax --plugin MODULE`` loads it for the command line (docs/contributing.md).
"""

import importlib as _importlib
import pkgutil as _pkgutil

from .registry import (ESTIMATORS, Estimator, compute_advantages, estimator_settings, estimator_table, get_estimator,
                       make_config, parse_estimator_spec, parse_settings, public_names, register_estimator)
from .common import estimator_entry, max_states_for

BUILTINS = ("grpo", "gigpo", "graphgpo", "hgpo", "g2po", "g2po_abstract", "proxmo", "ecpo", "ecpo_abstract", "bepo",
            "ablations", "pgpo", "confidence")
_NOT_ESTIMATORS = ("registry", "common", "confidence_head")  # confidence_head needs Flax: loaded on first use
for _name in BUILTINS + tuple(sorted(m.name for m in _pkgutil.iter_modules(__path__)
                                     if m.name not in BUILTINS + _NOT_ESTIMATORS)):
    _importlib.import_module(f"{__name__}.{_name}")

from .confidence import confidence_features, confidence_loss  # noqa: E402
from .proxmo import tfidf_features  # noqa: E402

_PUBLIC = public_names()
globals().update(_PUBLIC)

__all__ = [
    "ESTIMATORS", "Estimator", "compute_advantages", "estimator_settings", "estimator_table", "get_estimator",
    "make_config", "parse_estimator_spec", "parse_settings", "public_names", "register_estimator", "estimator_entry",
    *_PUBLIC, "tfidf_features", "ConfidenceHead", "confidence_features", "confidence_loss", "max_states_for",
]


def __getattr__(name):  # ConfidenceHead needs Flax: imported on first use, so the kernels load none
    if name == "ConfidenceHead":
        from .confidence_head import ConfidenceHead

        return ConfidenceHead
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
