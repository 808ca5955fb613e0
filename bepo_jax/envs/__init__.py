"""Environments: pure-JAX ones (reset/step as pure functions, vmappable) and adapters."""

from .sokoban import SokobanConfig, SokobanState, generate_levels, render_text, reset, step

__all__ = ["SokobanConfig", "SokobanState", "generate_levels", "render_text", "reset", "step"]
