"""Which parameters a run trains: low-rank adapters (LoRA), the top N layers, or everything.

LoRA (Hu et al. 2021) adds a trainable low-rank update to a frozen linear map:

    y = x W (+ b)  +  (alpha / r) (x A) B,    A [in, r] (random), B [r, out] (zeros)

so a model with fresh adapters equals the base model exactly, and only A and B (of the
projections named in ``targets``) are trained and checkpointed. ``add_lora(model, ...)``
wraps the named ``nnx.Linear`` projections of every ``LlamaBlock`` in place;
``trainable(model, ...)`` returns the filter of the parameters a run trains, which
``Trainer(model, config, trainable=...)`` splits the model by (the rest stays frozen and is
not in the optimizer or the checkpoint). Training only the top N layers leaves the lower
layers out of the gradient entirely: the backward pass stops at layer L - N.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from ...credit.configs import check_int, check_range

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """rank r (8), alpha (16: the update is scaled by alpha / r), targets (the projections of each
    block that get adapters, a subset of ``PROJECTIONS``; default the attention's q and v), seed of
    A's initialisation (0)."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    seed: int = 0

    def __post_init__(self):
        n = "LoRAConfig"
        check_int(n, "rank", self.rank, lo=1)
        check_range(n, "alpha", self.alpha, lo=0.0, lo_open=True)
        check_int(n, "seed", self.seed, lo=0)
        object.__setattr__(self, "targets", tuple(self.targets))
        bad = [t for t in self.targets if t not in PROJECTIONS]
        if not self.targets or bad:
            raise ValueError(f"LoRAConfig.targets={self.targets!r}: name one or more of {PROJECTIONS}.")


class LoRALinear(nnx.Module):
    """``base(x) + (alpha / r) (x A) B`` with ``base`` a frozen ``nnx.Linear``; A and B are
    ``nnx.LoRAParam`` (B starts at zero)."""

    def __init__(self, base: nnx.Linear, rank: int, alpha: float, *, rngs: nnx.Rngs):
        din, dout = base.in_features, base.out_features
        dtype = base.kernel[...].dtype
        self.base = base
        self.lora_a = nnx.LoRAParam(jax.random.normal(rngs.params(), (din, rank), dtype) / jnp.sqrt(din).astype(dtype))
        self.lora_b = nnx.LoRAParam(jnp.zeros((rank, dout), dtype))
        self.scale = alpha / rank

    def __call__(self, x):
        return self.base(x) + ((x @ self.lora_a[...]) @ self.lora_b[...]) * jnp.asarray(self.scale, x.dtype)


def add_lora(model, config: LoRAConfig) -> None:
    """Wrap ``config.targets`` of every block of ``model`` (a ``LlamaLM``) in ``LoRALinear``, in place."""
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError(f"add_lora: {type(model).__name__} has no 'layers' of blocks; LoRA wraps a LlamaLM's "
                         "projections.")
    rngs = nnx.Rngs(config.seed)
    for blk in layers:
        for name in config.targets:
            lin = getattr(blk, name, None)
            if not isinstance(lin, nnx.Linear):
                raise ValueError(f"add_lora: a block's {name!r} is {type(lin).__name__}, not an nnx.Linear (already "
                                 "wrapped, or another architecture).")
            setattr(blk, name, LoRALinear(lin, config.rank, config.alpha, rngs=rngs))


def trainable(model, *, lora: bool = False, top_layers: int = 0):
    """The filter of the parameters a run trains: the adapters (``lora``), the top ``top_layers``
    blocks and the final norm (``top_layers`` > 0; with ``lora``: the adapters of those blocks
    only), or every parameter (the default)."""
    n = len(getattr(model, "layers", ()))
    if top_layers < 0 or (top_layers and top_layers > n):
        raise ValueError(f"top_layers={top_layers} must be in 0 .. {n} (the model's layers; 0 = all).")
    kind = nnx.LoRAParam if lora else nnx.Param
    if not top_layers:
        return kind
    first = n - top_layers

    def in_top(path, value) -> bool:
        if not isinstance(value, kind):
            return False
        if path and path[0] == "layers":
            return int(path[1]) >= first
        return not lora and path and path[0] == "norm"

    return in_top
