"""Environments by name: the library's own, the ones a user registers, and import paths.

A run names its environment with one string (``RunConfig.env``, ``--env``), so that a
run directory's ``config.json`` says what it trained on and ``--resume`` finds it again:

* the library's JAX environments: ``"sokoban"`` (6x6, 1..``boxes`` boxes, 10 steps),
  ``"sokoban_hard"`` (7x7, 1..``boxes`` boxes, 50 backward scrambling moves, 20 steps: the
  experiments' E1-hard), ``"maze"`` (Jumanji 5x5, 12 steps) and the credit lab's diagnostic
  worlds ``"key_door"``, ``"bump"``, ``"aliased"``, ``"loop"``, ``"slippery"`` (their exact
  models are enumerable: ``bepo_jax.lab``); ``"textworld"`` — the host one;
* a name given to ``register_env(name, factory)`` in the same process;
* an import path ``"package.module:factory"`` — imported on use, so the CLI, ``compare``
  and a resumed run in a fresh process find it without registering anything.

A factory is called with the run's environment part (``train.parts.EnvPart``: ``name``, ``max_steps``,
``task_pool``, ``boxes``, ``rooms``, ``objects``, ``quest_length`` and ``seed`` are there to read) and
returns an object satisfying
``bepo_jax.agent.envs.base.JaxEnv`` (README, "Bring your own environment").
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .base import JaxEnv
from .pools import DEFAULT_HELD_OUT

def _sokoban(cfg):
    from .sokoban import SokobanConfig, SokobanEnv

    return SokobanEnv(SokobanConfig(max_steps=cfg.max_steps or 10, num_boxes=(1, cfg.boxes)))


def _sokoban_hard(cfg):
    from .sokoban import SokobanConfig, SokobanEnv

    return SokobanEnv(SokobanConfig(size=7, num_boxes=(1, cfg.boxes), reverse_steps=50, max_steps=cfg.max_steps or 20))


def _maze(cfg):
    from .jumanji_env import maze

    return maze(5, 5, max_steps=cfg.max_steps or 12)


def _diagnostic(name):
    def build(cfg):
        from .diagnostic import make_diagnostic

        world = make_diagnostic(name)
        if cfg.max_steps:
            world.max_steps = int(cfg.max_steps)
        return world

    return build


# name -> factory(env part); a factory reads max_steps (0 = the environment's own) and boxes
JAX_BUILTINS: dict[str, Callable[[Any], JaxEnv]] = {
    "sokoban": _sokoban, "sokoban_hard": _sokoban_hard, "maze": _maze,
    **{n: _diagnostic(n) for n in ("key_door", "bump", "aliased", "loop", "slippery")}}
HOST_ENVS = ("textworld",)
BUILTIN_ENVS = tuple(JAX_BUILTINS) + HOST_ENVS
# import paths that stored run configs name, and the names that replaced them
RENAMED = {"experiments.claims:sokoban_hard": "sokoban_hard"}

_REGISTRY: dict[str, Callable[[Any], JaxEnv]] = {}


def register_env(name: str, factory: Callable[[Any], JaxEnv], *, overwrite: bool = False) -> None:
    """Make ``name`` usable as ``RunConfig.env``: ``factory(env_part)`` -> a ``JaxEnv`` (``train.parts.EnvPart``).

    Built-in names cannot be replaced; an existing registration only with ``overwrite``."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"register_env: name={name!r} must be a non-empty string without ':' "
                         "(':' marks an import path).")
    if name in BUILTIN_ENVS:
        raise ValueError(f"register_env: {name!r} is a built-in environment; choose another name.")
    if not callable(factory):
        raise ValueError(f"register_env({name!r}): factory must be callable (env part -> JaxEnv); got {factory!r}.")
    if name in _REGISTRY and not overwrite and _REGISTRY[name] is not factory:
        raise ValueError(f"register_env: {name!r} is already registered; pass overwrite=True to replace it.")
    _REGISTRY[name] = factory


def registered_envs() -> tuple[str, ...]:
    """The built-in names and the ones registered in this process."""
    return BUILTIN_ENVS + tuple(sorted(_REGISTRY))


def _import_factory(path: str) -> Callable[[Any], JaxEnv]:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"env={path!r}: an import path reads 'package.module:factory'.")
    try:
        obj = importlib.import_module(module)
    except ImportError as err:
        raise ValueError(f"env={path!r}: cannot import {module!r} ({err}); is it installed or on PYTHONPATH?") from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"env={path!r}: {module!r} has no attribute {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"env={path!r}: {attr!r} is not callable (a factory env part -> JaxEnv).")
    return obj


def check_env_name(name: str) -> None:
    """Raise a ValueError naming the valid choices unless ``name`` can be resolved."""
    if not isinstance(name, str):
        raise ValueError(f"RunConfig.env={name!r} must be a string.")
    if ":" in name:
        _import_factory(name)
    elif name not in BUILTIN_ENVS and name not in _REGISTRY:
        raise ValueError(f"RunConfig.env={name!r} is not valid; valid names: {', '.join(registered_envs())}, "
                         "or an import path 'package.module:factory' (or register_env(name, factory) first).")


def is_host_env(name: str) -> bool:
    return name in HOST_ENVS


def env_part(cfg: Any) -> Any:
    """The environment part of ``cfg``: a run config's (``RunConfig.parts.env``), or ``cfg`` itself."""
    parts = getattr(cfg, "parts", None)
    return parts.env if parts is not None else cfg


def make_host_env(name: str, cfg: Any, games_dir=None, *, eval_seed_offset: int, held_out: str = DEFAULT_HELD_OUT):
    """The host environment ``name`` of the env part ``cfg`` (or a run config): its tasks, shapes and host-rollout
    arguments (``envs.textworld_env.TextWorldRun``); ``held_out``: how its held-out games are kept
    apart from its training games (``TextWorldRun.held_out``)."""
    if name != "textworld":
        raise ValueError(f"{name!r} is not a host environment; host environments: {', '.join(HOST_ENVS)}.")
    from .textworld_env import TextWorldRun

    return TextWorldRun(env_part(cfg), games_dir, eval_seed_offset=eval_seed_offset, held_out=held_out)


def make_jax_env(name: str, cfg: Any) -> JaxEnv:
    """The JAX environment ``name`` built by its factory from the env part ``cfg`` (or a run config's)."""
    if name in HOST_ENVS:
        raise ValueError(f"{name!r} is a host environment (bepo_jax.agent.rollouts.host), not a JAX one.")
    factory = JAX_BUILTINS.get(name) or (_import_factory(name) if ":" in name else _REGISTRY.get(name))
    if factory is None:
        check_env_name(name)  # raises with the valid names
    env = factory(env_part(cfg))
    missing = [a for a in ("name", "action_words", "max_steps", "obs_len", "noop_reward", "sample_tasks", "reset",
                           "step", "render", "observation") if not hasattr(env, a)]
    if missing:
        raise ValueError(f"env={name!r}: the factory returned {type(env).__name__}, which lacks {missing} of the "
                         "JaxEnv interface (bepo_jax.agent.envs.base.JaxEnv; README, 'Bring your own environment').")
    return env
