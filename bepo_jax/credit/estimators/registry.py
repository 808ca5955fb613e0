"""The one registry of estimators: ``@register_estimator`` adds one, ``ESTIMATORS`` lists them.

Every entry point reads this table: ``compute_advantages``, the command line's
``--estimator`` / ``--arms`` choices, the run config (``RunConfig.estimator_config``), the
credit lab's default suite, the estimator table in docs/estimators.md
(``bepo-jax estimators --markdown``) and the tests that hold every estimator to the shared
contract (tests/credit/test_registry.py). An estimator's settings are parsed and validated
here, whatever their entry: a config instance, a plain dict, ``--set FIELD=VALUE`` or an
arm spec ``LABEL=NAME:field=value`` (``estimator_settings``, ``parse_settings``).

Adding an estimator is one module that decorates its host entry (docs/contributing.md):

>>> from bepo_jax.credit.estimators.registry import ESTIMATORS
>>> ESTIMATORS["grpo"].config_type.__name__, ESTIMATORS["grpo"].output_type.__name__
('GRPOConfig', 'GRPOOutput')
>>> parse_estimator_spec("lam0=gated_bepo:lam=0:norm=mean")
('lam0', 'gated_bepo', {'lam': 0, 'norm': 'mean'})
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
from typing import Any, Callable, Mapping, Optional, Sequence

from ..types import StepBatch


@dataclasses.dataclass(frozen=True)
class Estimator:
    """A registered estimator: host entry ``fn`` (checks the batch on the host, runs the jitted
    kernel), jittable ``kernel(batch, config)``, its config and output types, a one-line
    ``definition`` and its ``source``; ``graph``: whether it builds the state graph (and takes
    ``history``); ``lab``: whether the credit lab's default suite runs it; ``text_inputs``: for an
    estimator that reads the states' texts (ProxMO's TF-IDF), ``text_inputs(texts, mask, config) ->
    tuple`` making the kernel's further arguments on the host from the texts [B, K, T] each state key
    was hashed from (``()`` when the config reads none), and its host entry takes ``texts=`` too; None
    for the others. The training loops (``Setup.credit_inputs``) and the turns path
    (``credit_for_groups``) ask this field, not the estimator's name."""

    name: str
    fn: Callable
    kernel: Callable
    config_type: type
    output_type: type
    definition: str
    source: str
    graph: bool
    lab: bool = True
    text_inputs: Optional[Callable] = None


_REGISTRY: dict[str, Estimator] = {}
# A read-only view of the registry, in registration order (the import order of
# ``bepo_jax/credit/estimators/__init__.py`` for the built-ins).
ESTIMATORS: Mapping[str, Estimator] = types.MappingProxyType(_REGISTRY)
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def register_estimator(name: str, *, kernel: Callable, config: type, output: type, definition: str, source: str,
                       graph: bool, lab: bool = True, text_inputs: Optional[Callable] = None
                       ) -> Callable[[Callable], Callable]:
    """Decorate an estimator's host entry ``fn(batch, config=Config(), *, check=True)`` to
    register it under ``name`` with its jittable ``kernel(batch, config) -> output``.

    ``config`` must be a frozen config with ``from_dict`` / ``to_dict`` / ``replace`` (made
    with ``_config.pytree_config``) and build with no arguments (its defaults); ``output``
    the dataclass the kernel returns; ``text_inputs``: see ``Estimator``. A name registered twice, a malformed name or a config
    without those methods raises here, at import, naming the fix."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"register_estimator: name {name!r} must be lower-case letters, digits and '_', "
                         "starting with a letter (it is a command-line choice and a results key).")
    missing = [m for m in ("from_dict", "to_dict", "replace") if not hasattr(config, m)]
    if missing:
        raise TypeError(f"register_estimator({name!r}): config {getattr(config, '__name__', config)!r} lacks "
                        f"{', '.join(missing)}; build it with bepo_jax.credit.configs.pytree_config.")
    if not dataclasses.is_dataclass(output):
        raise TypeError(f"register_estimator({name!r}): output must be the dataclass the kernel returns.")

    def wrap(fn: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(f"estimator {name!r} is registered already (by {_REGISTRY[name].fn.__module__}); "
                             "choose another name.")
        _REGISTRY[name] = Estimator(name, fn, kernel, config, output, definition, source, graph, lab, text_inputs)
        return fn

    return wrap


def get_estimator(name: str) -> Estimator:
    """The registered estimator ``name``; an unknown name raises, listing the valid ones."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; valid names: {', '.join(ESTIMATORS)}.")
    return ESTIMATORS[name]


def make_config(name: str, config: Any = None, **overrides):
    """The estimator's config: ``config`` (an instance or a plain dict) or the defaults, plus overrides.

    >>> make_config("gated_bepo", {"lam": 0.3}, norm="mean").lam
    0.3
    """
    est = get_estimator(name)
    if config is None:
        config = est.config_type()
    elif isinstance(config, Mapping):
        config = est.config_type.from_dict(dict(config))
    elif not isinstance(config, est.config_type):
        raise ValueError(f"estimator {name!r} takes a {est.config_type.__name__}, got {type(config).__name__}.")
    return config.replace(**overrides) if overrides else config


def estimator_settings(name: str, settings: Any = None, *, what: str = "the settings") -> dict:
    """An estimator's settings as a run stores them (``config.json``): a config instance becomes
    the dict of its fields that differ from the defaults, a dict of fields is kept as given;
    either is validated here (an unknown field, a wrong type or a value out of range raises,
    naming the field and the valid ones). ``what`` names the input in the error.

    >>> from bepo_jax import GatedBEPOConfig
    >>> estimator_settings("gated_bepo", GatedBEPOConfig(lam=0.5, w=2.0))
    {'w': 2.0}
    >>> estimator_settings("gated_bepo", {"lam": 0.5})
    {'lam': 0.5}
    """
    est = get_estimator(name)
    if settings is None:
        return {}
    if isinstance(settings, est.config_type):
        given, default = settings.to_dict(), est.config_type().to_dict()
        return {k: v for k, v in given.items() if v != default[k]}
    if not isinstance(settings, Mapping):
        raise ValueError(f"{what} must be a {est.config_type.__name__} (the {name!r} estimator's config) or a dict "
                         f"of its fields; got {type(settings).__name__}.")
    make_config(name, **settings)  # unknown fields and bad values raise, listing the valid ones
    return dict(settings)


def parse_settings(items: Sequence[str], *, what: str = "--set") -> dict:
    """``["lam=0.5", "norm=mean"]`` -> ``{"lam": 0.5, "norm": "mean"}``: each value read as JSON,
    else kept as a string. The one reader of settings written as text (``--set`` and the fields
    of an arm spec); ``make_config`` / ``estimator_settings`` then validate them."""
    out = {}
    for item in items or ():
        if "=" not in item:
            raise ValueError(f"{what} {item!r}: write FIELD=VALUE, e.g. lam=0.5.")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def parse_estimator_spec(text: str) -> tuple[str, str, dict]:
    """One estimator setting as text, the grammar every command shares: ``NAME`` or
    ``LABEL=NAME:field=value:field=value`` (values read as JSON, else kept as strings), e.g.
    ``lam0=gated_bepo:lam=0:eta_gated=1``. Returns ``(label, name, overrides)``; the name and
    the fields are validated here (an unknown one raises, listing the valid ones)."""
    head, *fields = text.strip().split(":")
    label, _, name = head.partition("=")
    label, name = label.strip(), (name or label).strip()
    if not label:
        raise ValueError(f"estimator spec {text!r} is empty; write NAME or LABEL=NAME:field=value "
                         "(e.g. lam0=gated_bepo:lam=0).")
    if any("=" not in item for item in fields):
        raise ValueError(f"estimator spec {text!r}: write LABEL=NAME:field=value:field=value "
                         "(e.g. lam0=gated_bepo:lam=0).")
    over = parse_settings(fields, what=f"estimator spec {text!r}:")
    make_config(name, **over)
    return label, name, over


def compute_advantages(name: str, batch: StepBatch, config: Any = None, *, check: bool = True, **overrides):
    """Run estimator ``name`` on ``batch``.

    ``compute_advantages("gated_bepo", batch, lam=0.3)`` — config fields may be given as
    keyword overrides or as ``config`` (an instance or a dict); unknown names and
    fields raise a ValueError listing the valid ones.

    >>> import bepo_jax as bj
    >>> batch = bj.batch_from_trajectories([[bj.Trajectory(["a"], [10.0], bj.SUCCESS),
    ...                                      bj.Trajectory(["a"], [0.0], bj.FAILURE)]])
    >>> compute_advantages("grpo", batch, norm="mean").advantage[0, :, 0].tolist()
    [5.0, -5.0]
    """
    est = get_estimator(name)
    return est.fn(batch, make_config(name, config, **overrides), check=check)


def public_names() -> dict[str, Any]:
    """The registered estimators' public objects by name, in the registry's order: each one's host entry,
    kernel, config type and output type (one shared by several, such as ``GatedBEPOConfig``, once). The
    package exports these (``bepo_jax.__all__``): registering an estimator is what makes it public.

    >>> list(public_names())[:4]
    ['grpo', 'grpo_kernel', 'GRPOConfig', 'GRPOOutput']
    """
    out: dict[str, Any] = {}
    for e in ESTIMATORS.values():
        for obj in (e.fn, e.kernel, e.config_type, e.output_type):
            out.setdefault(obj.__name__, obj)
    return out


def estimator_table() -> list[str]:
    """The registry as the Markdown table of docs/estimators.md ("Every registered estimator"):
    ``bepo-jax estimators --markdown`` prints it, tests/test_docs.py checks the page holds it."""
    lines = ["| name | config | output | definition | source |", "|---|---|---|---|---|"]
    for e in ESTIMATORS.values():
        lines.append(f"| `{e.name}` | `{e.config_type.__name__}` | `{e.output_type.__name__}` | {e.definition} | "
                     f"{e.source} |")
    return lines
