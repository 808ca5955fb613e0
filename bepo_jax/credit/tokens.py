"""Record -> token advantages (docs/estimators.md, tokens and the policy loss).

    adv_tok[b, k, t, j] = A[b, k, t] * response_mask[b, k, t, j]

Every valid response token of step t shares the step's (stop-gradient) advantage.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float


def to_token_advantages(
    advantage: Float[Array, "B K T"], response_mask: Bool[Array, "B K T L"]
) -> Float[Array, "B K T L"]:
    """Broadcast per-record advantages to the valid tokens of each response.

    >>> import numpy as np
    >>> to_token_advantages(np.array([[[2.0]]]), np.array([[[[True, True, False]]]])).tolist()
    [[[[2.0, 2.0, 0.0]]]]
    """
    advantage = jnp.asarray(advantage)
    if not isinstance(response_mask, jax.core.Tracer):
        response_mask = np.asarray(response_mask)
        if response_mask.dtype != np.bool_:
            if not np.isin(response_mask, (0, 1)).all():
                raise ValueError("response_mask must be bool (or 0/1 values); got other values.")
            response_mask = response_mask.astype(bool)
    if response_mask.ndim != advantage.ndim + 1 or tuple(response_mask.shape[:-1]) != tuple(advantage.shape):
        raise ValueError(
            f"response_mask has shape {tuple(response_mask.shape)}; expected {tuple(advantage.shape)} + [L] "
            "(the advantage's shape plus a token axis)."
        )
    mask = jnp.asarray(response_mask).astype(bool)
    return jnp.where(mask, jax.lax.stop_gradient(advantage)[..., None], 0.0).astype(jnp.float32)
