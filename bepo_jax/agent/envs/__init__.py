"""Environments: pure-JAX ones (reset/step as pure functions, vmappable) and adapters."""

from .registry import register_env, registered_envs
from .sokoban import SokobanConfig, SokobanState, generate_levels, render_text, reset, step

JAX_ENVS = ("sokoban", "maze")  # the main job's environments (every JAX built-in: registry.JAX_BUILTINS)


def jax_env(name: str, *, max_steps: int = 0, boxes: int = 2):
    """A built-in JAX environment by name (``registry.JAX_BUILTINS``: ``sokoban`` 6x6 with
    1..``boxes`` boxes and time limit ``max_steps`` or 10, ``maze`` Jumanji 5x5, ``max_steps``
    or 12, ``sokoban_hard``, the credit lab's worlds), as a run with these settings builds it."""
    from types import SimpleNamespace

    from .registry import JAX_BUILTINS

    if name not in JAX_BUILTINS:
        raise ValueError(f"unknown JAX environment {name!r}; valid names: {', '.join(JAX_BUILTINS)}.")
    return JAX_BUILTINS[name](SimpleNamespace(max_steps=max_steps, boxes=boxes))


__all__ = ["SokobanConfig", "SokobanState", "generate_levels", "render_text", "reset", "step", "JAX_ENVS",
           "jax_env", "register_env", "registered_envs"]
