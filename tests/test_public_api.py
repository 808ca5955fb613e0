"""The public API is what ``bepo_jax.__all__`` lists: every name there exists, is documented,
and is named in the package docstring; nothing else public sits at the top level; every
registered estimator's entry, kernel, config and output type is public."""

import inspect
import types

import bepo_jax as bj


def test_all_lists_exactly_the_public_top_level_names():
    public = {n for n in vars(bj) if not n.startswith("_") and not isinstance(getattr(bj, n), types.ModuleType)}
    assert public - set(bj.__all__) == set(), "public names not in __all__ (list them, or import them privately)"
    assert len(bj.__all__) == len(set(bj.__all__)), "a name listed twice"
    assert all(hasattr(bj, n) for n in bj.__all__)


def test_every_public_name_is_documented_and_named_in_the_package_docstring():
    undocumented = [n for n in bj.__all__ if (inspect.isfunction(getattr(bj, n)) or inspect.isclass(getattr(bj, n)))
                    and not (inspect.getdoc(getattr(bj, n)) or "").strip()]
    assert not undocumented
    unnamed = [n for n in bj.__all__ if n != "__version__" and f"``{n}``" not in bj.__doc__
               and not (n.endswith("_kernel") and "``*_kernel``" in bj.__doc__)]
    assert not unnamed, f"public names the package docstring does not name: {unnamed}"


def test_every_registered_estimator_is_public_with_its_config_and_output():
    for name, est in bj.ESTIMATORS.items():
        for obj in (est.fn, est.kernel, est.config_type, est.output_type):
            assert getattr(bj, obj.__name__, None) is obj, f"{name}: {obj.__name__} is not bepo_jax.{obj.__name__}"


def test_internals_stay_internal():
    for name in ("outcome_advantage", "step_group_advantage", "token_words", "parse_settings"):
        assert not hasattr(bj, name), name
