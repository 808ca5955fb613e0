"""``ConfidenceHead``: the learned confidence c_t of ``confidence_returns`` (a small Flax NNX MLP).

Kept apart from ``confidence`` so that importing the kernels loads no Flax: ``bepo_jax.ConfidenceHead``
imports this module on first use.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from .confidence import _C_MIN


class ConfidenceHead(nnx.Module):
    """c = sigmoid(MLP(features)); the output layer starts at kernel 0, bias logit(c0),
    so every record starts at confidence c0 (0.7)."""

    def __init__(self, num_features: int = 6, hidden: int = 32, *, c0: float = 0.7, rngs: nnx.Rngs):
        if not 0.0 < c0 < 1.0:
            raise ValueError(f"ConfidenceHead c0={c0} must lie in (0, 1).")
        self.hidden = nnx.Linear(num_features, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, 1, kernel_init=nnx.initializers.zeros,
                              bias_init=nnx.initializers.constant(math.log(c0 / (1.0 - c0))), rngs=rngs)

    def logits(self, features: Float[Array, "... F"]) -> Float[Array, "..."]:
        return self.out(nnx.relu(self.hidden(features)))[..., 0]

    def __call__(self, features: Float[Array, "... F"]) -> Float[Array, "..."]:
        # float32 sigmoid rounds to exactly 1 (or 0) for large logits: keep c in (0, 1).
        return jnp.clip(jax.nn.sigmoid(self.logits(features)), _C_MIN, 1.0 - _C_MIN)
