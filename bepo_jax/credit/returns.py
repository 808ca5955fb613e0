"""Discounted returns and GAE by one masked reverse ``lax.scan``.

    y_t = x_t + d_t * y_{t+1}   on valid steps,   y_t = 0 after the last valid step.

* returns:  G_t = r_t + gamma G_{t+1}                      (x = r, d = gamma)
* GAE:      A_t = delta_t + gamma lam A_{t+1}              (x = delta, d = gamma lam)
  (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE", eq. 16)
* confidence returns (docs/estimators.md): d_t = c_t gamma.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float


def discounted_cumsum(
    x: Float[Array, "*batch T"],
    mask: Bool[Array, "*batch T"],
    discount: Float[Array, "*batch T"] | float,
) -> Float[Array, "*batch T"]:
    """Masked reverse discounted sum along the last axis (see module docstring).

    ``mask`` must be a prefix per row; values of ``x`` at masked-out steps are ignored
    (even NaN), and the output is 0 there.
    """
    x = jnp.where(mask, x, 0.0)
    d = jnp.broadcast_to(jnp.asarray(discount, x.dtype), x.shape)
    xs = (jnp.moveaxis(x, -1, 0), jnp.moveaxis(d, -1, 0), jnp.moveaxis(mask, -1, 0))

    def step(carry, inp):
        x_t, d_t, m_t = inp
        y = jnp.where(m_t, x_t + d_t * carry, 0.0)
        return y, y

    _, ys = jax.lax.scan(step, jnp.zeros(x.shape[:-1], x.dtype), xs, reverse=True)
    return jnp.moveaxis(ys, 0, -1)


def discounted_returns(reward, mask, gamma):
    """G_t = sum_{l >= 0} gamma^l r_{t+l} over the valid steps of each row.

    >>> import jax.numpy as jnp
    >>> discounted_returns(jnp.array([[0.0, 0.0, 1.0]]), jnp.array([[True, True, True]]), 0.5).tolist()
    [[0.25, 0.5, 1.0]]
    """
    return discounted_cumsum(reward, mask, gamma)


def gae(delta, mask, gamma, lam):
    """A_t = sum_{l >= 0} (gamma lam)^l delta_{t+l} over the valid steps of each row.

    The step after the last valid one contributes nothing (masked steps give 0):

    >>> import jax.numpy as jnp
    >>> gae(jnp.array([[1.0, 1.0, 9.0]]), jnp.array([[True, True, False]]), 1.0, 0.5).tolist()
    [[1.5, 1.0, 0.0]]
    """
    return discounted_cumsum(delta, mask, gamma * lam)
