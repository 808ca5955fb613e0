"""The public tools of every frozen, keyword-only config: the validators (``check_range``,
``check_int``, ``check_choice``, ``check_bool``: a bad value raises ``ValueError`` naming the class, the
field and the fix) and the decorators (``pytree_config`` for estimator configs, ``with_dict_methods``
for plain ones). Use them in your own configs (docs/contributing.md).

Every config is a frozen dataclass registered as a JAX pytree: numeric knobs
(gamma, lam, w, ...) are *data* leaves, so sweeping them under ``jax.jit`` does not
recompile; structural choices (norm, solver, ...) are *static* metadata, so each
choice compiles once. Validation runs in ``__post_init__`` whenever a field holds a
plain Python value (that is, when a user builds the config); inside a trace the
leaves are tracers and are left alone — a value you trace yourself (e.g. a vmapped
sweep over ``lam``) is NOT range-checked: check it before tracing. Float fields given
as ints are stored as floats, so ``lam=1`` does not compile a second kernel.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Iterable

import jax


def _is_concrete_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_choice(cls_name: str, field: str, value: Any, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(
            f"{cls_name}.{field}={value!r} is not valid; use one of {', '.join(map(repr, choices))}."
        )


def check_range(
    cls_name: str,
    field: str,
    value: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> None:
    """Check ``lo <= value <= hi`` (``lo < value`` when ``lo_open``, ``value < hi`` when
    ``hi_open``) for Python numbers. Traced values are not checked (see the module doc)."""
    if isinstance(value, bool):
        raise ValueError(f"{cls_name}.{field} must be a number, got the bool {value!r}.")
    if not _is_concrete_number(value):
        return  # a tracer or an array inside a transformation: nothing to check here
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{cls_name}.{field} must be finite, got {value!r}.")
    if lo is not None and (v <= lo if lo_open else v < lo):
        bound = f"> {lo}" if lo_open else f">= {lo}"
        raise ValueError(f"{cls_name}.{field}={value!r} is out of range; it must be {bound}.")
    if hi is not None and (v >= hi if hi_open else v > hi):
        bound = f"< {hi}" if hi_open else f"<= {hi}"
        raise ValueError(f"{cls_name}.{field}={value!r} is out of range; it must be {bound}.")


def check_int(cls_name: str, field: str, value: Any, *, lo: int) -> None:
    if isinstance(value, jax.core.Tracer) or (hasattr(value, "shape") and not isinstance(value, numbers.Integral)
                                              and getattr(value, "dtype", None) is not None
                                              and jax.numpy.issubdtype(value.dtype, jax.numpy.integer)):
        return  # a traced or array value inside a transformation
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{cls_name}.{field} must be an int, got {type(value).__name__} {value!r}.")
    if value < lo:
        raise ValueError(f"{cls_name}.{field}={value!r} is out of range; it must be >= {lo}.")


def check_bool(cls_name: str, field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{cls_name}.{field}={value!r} must be True or False.")


def pytree_config(*, static: Iterable[str]):
    """Class decorator: frozen keyword-only dataclass + pytree with ``static`` meta fields."""
    static = tuple(static)

    def wrap(cls):
        cls = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = set(static) - set(names)
        if unknown:
            raise TypeError(f"{cls.__name__}: static fields {sorted(unknown)} are not fields")
        data = [n for n in names if n not in static]
        floats = [f.name for f in dataclasses.fields(cls) if f.name in data and f.type in ("float", float)]
        user_post_init = getattr(cls, "__post_init__", None)

        def __post_init__(self):
            # Numeric float fields become Python floats (lam=1 and lam=1.0 are one jit cache
            # entry, not two), before validation; traced and array values are left alone.
            for name in floats:
                v = getattr(self, name)
                if isinstance(v, numbers.Real) and not isinstance(v, (bool, float)):
                    object.__setattr__(self, name, float(v))
            if user_post_init is not None:
                user_post_init(self)

        cls.__post_init__ = __post_init__
        return jax.tree_util.register_dataclass(with_dict_methods(cls), data_fields=data, meta_fields=list(static))

    return wrap


def with_dict_methods(cls):
    """Give a config dataclass ``to_dict``, ``from_dict`` and ``replace`` (unknown fields
    raise listing the valid ones). Used by every pytree config and by plain configs."""
    cls.to_dict = _to_dict
    cls.from_dict = classmethod(_from_dict)
    cls.replace = _replace
    return cls


def _check_fields(cls, names: Iterable[str], what: str) -> None:
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(f"{cls.__name__} has no field {', '.join(map(repr, unknown))} ({what}); "
                         f"valid fields: {', '.join(valid)}.")


def _to_dict(self) -> dict:
    """The config as a plain dict of Python values (JSON-serialisable)."""
    out = {}
    for f in dataclasses.fields(self):
        v = getattr(self, f.name)
        out[f.name] = v.item() if hasattr(v, "item") else v
    return out


def _from_dict(cls, d: dict):
    """Build a validated config from a plain dict; unknown keys raise with the valid ones."""
    if not isinstance(d, dict):
        raise ValueError(f"{cls.__name__}.from_dict expects a dict, got {type(d).__name__}.")
    _check_fields(cls, d, "the keys you gave")
    return cls(**d)


def _replace(self, **changes):
    """A copy with ``changes`` applied and validated; unknown fields raise with the valid ones."""
    _check_fields(type(self), changes, "the fields you set")
    return dataclasses.replace(self, **changes)
