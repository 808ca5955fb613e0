"""Environments: pure-JAX ones (reset/step as pure functions, vmappable) and adapters."""

from .registry import register_env, registered_envs
from .sokoban import SokobanConfig, SokobanState, generate_levels, render_text, reset, step

JAX_ENVS = ("sokoban", "maze")


def jax_env(name: str, *, max_steps: int = 0, boxes: int = 2):
    """The library's JAX environments by name, as the main job builds them: ``sokoban``
    (6x6, 1..``boxes`` boxes, time limit ``max_steps`` or 10) or ``maze`` (Jumanji 5x5,
    ``max_steps`` or 12)."""
    if name == "sokoban":
        from .sokoban import SokobanEnv

        return SokobanEnv(SokobanConfig(max_steps=max_steps or 10, num_boxes=(1, boxes)))
    if name == "maze":
        from .jumanji_env import maze

        return maze(5, 5, max_steps=max_steps or 12)
    raise ValueError(f"unknown JAX environment {name!r}; valid names: {', '.join(JAX_ENVS)}.")


__all__ = ["SokobanConfig", "SokobanState", "generate_levels", "render_text", "reset", "step", "JAX_ENVS",
           "jax_env", "register_env", "registered_envs"]
