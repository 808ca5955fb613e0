"""The sharded PPO training step: optax, PPO epochs over minibatches with gradient
accumulation, one jitted program.

    for epoch in 1..E:  shuffle;  for minibatch:  g = sum_m w_m grad(loss(micro_m));  params <- AdamW(clip(g))

w_m is the micro-batch's share of the minibatch's valid response tokens (token-mean)
or responses (seq-mean-token-mean), so accumulation gives the gradient of the whole
minibatch's loss. The batch is sharded on the mesh's ``data`` axis and the parameters
and optimizer state on its ``fsdp`` axis through the model's partition annotations
(``jax.jit`` with ``NamedSharding`` on a ``Mesh``, the successor of pjit).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array, Bool, Float, Int

from ...credit.configs import check_choice, check_int, check_range
from ..models.interface import score_logits, token_logprobs
from .loss import PPOLossConfig, ppo_loss

SCHEDULES = ("constant", "cosine")


def _unscored(response_mask: Bool[Array, "N L"], score_from: int, *, count: bool = False):
    """Whether (or how many) response tokens sit at positions 0 .. score_from, where a
    loss scoring from ``score_from`` gives them no log-probability."""
    head = response_mask[:, : score_from + 1]
    return jnp.sum(head, dtype=jnp.float32) if count else jnp.any(head)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """learning_rate (3e-4), weight_decay (0.0), max_grad_norm (1.0, global-norm clip),
    warmup_steps (0), total_steps (1000, for the cosine decay), schedule ("constant" or
    "cosine"), ppo_epochs (1), num_minibatches (1) and grad_accum (micro-batches per
    minibatch, 1) over the batch's N sequences, loss (PPOLossConfig), seed (0).
    score_from (0): the first position whose logit the loss needs -- every response token
    lies after it (the prompt fills positions 0 .. score_from); a model with the scoring
    shortcut (``models.interface``) then skips the work only earlier positions need.
    ``Trainer.step`` refuses a batch with a response token at or before it; inside a
    larger jitted program the metric ``unscored_response_tokens`` counts them (0).
    temperature (1.0): the loss scores tokens under softmax(logits / temperature) -- the
    distribution the rollout sampled from when its log-probs were recorded at that temperature
    (the chat rollouts; verl's convention), so the first minibatch's ratio is 1."""

    learning_rate: float = 3e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    total_steps: int = 1000
    schedule: str = "constant"
    ppo_epochs: int = 1
    num_minibatches: int = 1
    grad_accum: int = 1
    loss: PPOLossConfig = PPOLossConfig()
    seed: int = 0
    score_from: int = 0
    temperature: float = 1.0

    def __post_init__(self):
        n = "TrainConfig"
        check_range(n, "temperature", self.temperature, lo=0.0, lo_open=True)
        check_int(n, "score_from", self.score_from, lo=0)
        check_range(n, "learning_rate", self.learning_rate, lo=0.0, lo_open=True)
        check_range(n, "weight_decay", self.weight_decay, lo=0.0)
        check_range(n, "max_grad_norm", self.max_grad_norm, lo=0.0, lo_open=True)
        check_int(n, "warmup_steps", self.warmup_steps, lo=0)
        check_int(n, "total_steps", self.total_steps, lo=1)
        check_choice(n, "schedule", self.schedule, SCHEDULES)
        for f in ("ppo_epochs", "num_minibatches", "grad_accum"):
            check_int(n, f, getattr(self, f), lo=1)
        if not isinstance(self.loss, PPOLossConfig):
            raise ValueError("TrainConfig.loss must be a PPOLossConfig.")


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) then AdamW with a warmup + constant/cosine schedule."""
    if cfg.schedule == "cosine":
        lr = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1), cfg.total_steps)
    elif cfg.warmup_steps:
        lr = optax.join_schedules([optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps),
                                   optax.constant_schedule(cfg.learning_rate)], [cfg.warmup_steps])
    else:
        lr = cfg.learning_rate
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adamw(lr, weight_decay=cfg.weight_decay))


def _combine_micro(metrics: dict, share: Float[Array, "A"]) -> dict:
    """A minibatch's metrics from its micro-batches': the ``share``-weighted mean, the extremes for
    ``adv_min`` / ``adv_max``; a micro-batch with no response token (share 0) counts for none (its
    extremes are +-inf: a weighted sum would make them nan)."""
    used = share > 0
    out = {}
    for k, x in metrics.items():
        if k == "adv_min":
            out[k] = jnp.min(jnp.where(used, x, jnp.inf))
        elif k == "adv_max":
            out[k] = jnp.max(jnp.where(used, x, -jnp.inf))
        else:
            out[k] = jnp.sum(jnp.where(used, x, 0.0) * share)
    return out


class UpdateBatch(NamedTuple):
    """Token-level data of N sequences (one per record: prompt + response).

    tokens int32 [N, L]; mask bool [N, L] (real tokens); response_mask bool [N, L] (the
    policy's tokens, which the loss covers); old_logp, advantage float32 [N, L]
    (``to_token_advantages``); ref_logp float32 [N, L] or None (KL reference); hidden [N, L, W] or
    None: the input of the model's block ``capture_layer`` (its frozen blocks' output, recorded by
    the rollout), from which the loss runs only the blocks above (``LlamaLM.score_hidden``)."""

    tokens: Int[Array, "N L"]
    mask: Bool[Array, "N L"]
    response_mask: Bool[Array, "N L"]
    old_logp: Float[Array, "N L"]
    advantage: Float[Array, "N L"]
    ref_logp: Optional[Float[Array, "N L"]] = None
    hidden: Optional[Float[Array, "N L W"]] = None


class TrainState(NamedTuple):
    """Everything a resumed run needs: parameters, optimizer state, step, RNG."""

    params: Any
    opt_state: Any
    step: Int[Array, ""]
    rng: Any


def _replace_axes(spec: P, mesh: Optional[Mesh]) -> P:
    if mesh is None:
        return P()
    return P(*[a if (a is None or a in mesh.shape) else None for a in spec])


class Trainer:
    """Holds the model's graph and the jitted update; the state stays a plain pytree.

        trainer = Trainer(model, TrainConfig(), mesh=mesh)   # mesh axes "data" (and "fsdp")
        state = trainer.init_state()
        state, metrics = trainer.step(state, batch)
    """

    def __init__(self, model: nnx.Module, config: TrainConfig = TrainConfig(), *, mesh: Optional[Mesh] = None,
                 data_axis: str = "data", trainable=nnx.Param):
        """``trainable``: an NNX filter of the parameters to train (default every ``nnx.Param``;
        ``models.lora.trainable`` gives adapters only or the top N layers); the others stay
        as they are, outside the optimizer and the state."""
        self.config = config
        self.mesh = mesh
        self.data_axis = data_axis
        self.graphdef, params, self.rest = nnx.split(model, trainable, ...)
        self._template = params
        self.tx = make_optimizer(config)
        self._params_spec = jax.tree_util.tree_map(lambda s: _replace_axes(s, mesh), nnx.get_partition_spec(params),
                                                   is_leaf=lambda x: isinstance(x, P))
        self._update = None  # jitted on the first step, with the state's shardings as outputs

    # -- state and sharding -------------------------------------------------------------
    def _param_shardings(self):
        return jax.tree_util.tree_map(lambda sp: NamedSharding(self.mesh, sp), self._params_spec,
                                      is_leaf=lambda x: isinstance(x, P))

    def init_state(self) -> TrainState:
        """Fresh state: parameters placed by their partition annotations (``fsdp`` axis),
        optimizer state initialised from them (its moments inherit their shardings)."""
        # a copy: the update donates the state, which must not delete the template
        params = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), self._template)
        step = jnp.zeros((), jnp.int32)
        rng = jax.random.PRNGKey(self.config.seed)
        if self.mesh is not None:
            params = jax.device_put(params, self._param_shardings())
            rep = NamedSharding(self.mesh, P())
            step, rng = jax.device_put(step, rep), jax.device_put(rng, rep)
        opt_state = jax.jit(self.tx.init)(params)
        if self.mesh is not None:  # counters and other scalars: replicated on the mesh
            opt_state = jax.tree_util.tree_map(
                lambda x: x if isinstance(x.sharding, NamedSharding) and x.sharding.mesh == self.mesh
                else jax.device_put(x, NamedSharding(self.mesh, P())), opt_state)
        return TrainState(params=params, opt_state=opt_state, step=step, rng=rng)

    def abstract_state(self) -> TrainState:
        """Shapes, dtypes and shardings of the state (a restore target on this trainer's mesh)."""
        return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                      self.init_state())

    def place_batch(self, batch: UpdateBatch) -> UpdateBatch:
        if self.mesh is None:
            return batch
        return jax.device_put(batch, NamedSharding(self.mesh, P(self.data_axis)))

    def model(self, state: TrainState) -> nnx.Module:
        """The policy with ``state``'s parameters (for rollouts and evaluation)."""
        return nnx.merge(self.graphdef, state.params, self.rest)

    # -- the update ----------------------------------------------------------------------
    def step(self, state: TrainState, batch: UpdateBatch):
        """One update (PPO epochs x minibatches x micro-batches); returns (state, metrics)."""
        N = batch.tokens.shape[0]
        per = self.config.num_minibatches * self.config.grad_accum
        if N % per:
            raise ValueError(f"the batch has N={N} sequences, not a multiple of num_minibatches * grad_accum = {per}.")
        s = self.config.score_from
        if s and bool(jax.device_get(_unscored(batch.response_mask, s))):
            raise ValueError(f"the batch has response tokens at or before position TrainConfig.score_from={s}, "
                             "which the loss would not score: lower score_from to the prompt length - 1 (or 0).")
        if self._update is None:
            out = None
            if self.mesh is not None:
                out = (jax.tree_util.tree_map(lambda x: x.sharding, state), None)
            self._update = jax.jit(self.update_fn, donate_argnums=(0,), out_shardings=out)
        return self._update(state, self.place_batch(batch), self.rest)

    def logprobs(self, model: nnx.Module, tokens, mask, hidden=None):
        """log pi and the entropy of every token as the loss scores them (traceable): from position
        ``score_from`` on, at ``temperature``; from the frozen blocks' recorded output ``hidden``
        (``UpdateBatch.hidden``) when given."""
        start = self.config.score_from
        logits = (score_logits(model, tokens, mask, start) if hidden is None
                  else model.score_hidden(hidden, mask, start))
        if self.config.temperature != 1.0:
            logits = logits / self.config.temperature
        return token_logprobs(logits, tokens, start)

    def _loss(self, params, mb: UpdateBatch, rest=None):
        model = nnx.merge(self.graphdef, params, self.rest if rest is None else rest)
        logp, ent = self.logprobs(model, mb.tokens, mb.mask, mb.hidden)
        return ppo_loss(logp, mb.old_logp, mb.advantage, mb.response_mask, self.config.loss, entropy=ent,
                        ref_logp=mb.ref_logp)

    def _weight(self, mb: UpdateBatch):
        if self.config.loss.aggregation == "token-mean":
            return jnp.sum(mb.response_mask).astype(jnp.float32)
        return jnp.sum(jnp.any(mb.response_mask, axis=-1)).astype(jnp.float32)

    def update_fn(self, state: TrainState, batch: UpdateBatch, rest=None):
        """The pure update (traceable: call it inside a larger jitted program). ``rest``: the
        parameters that do not train (``Trainer.rest``; default this trainer's own). Inside a jitted
        program pass them as an argument of that program: a closed-over ``rest`` becomes constants
        of the compiled program (a pretrained model's frozen weights: minutes of compile time and a
        second copy in memory)."""
        cfg = self.config
        N = batch.tokens.shape[0]
        M, A = cfg.num_minibatches, cfg.grad_accum
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)

        def minibatch(carry, mb):
            params, opt_state = carry
            weights = jax.vmap(self._weight)(mb)  # [A]
            share = weights / jnp.maximum(weights.sum(), 1.0)

            def micro(acc, inp):
                m, s = inp
                (loss, metrics), g = grad_fn(params, m, rest)
                acc = jax.tree_util.tree_map(lambda a, b: a + s * b, acc, g)
                return acc, (loss, metrics)

            zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
            grads, (loss, metrics) = jax.lax.scan(micro, zeros, (mb, share))
            updates, opt_state = self.tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics = _combine_micro(metrics, share)
            metrics["loss"] = jnp.sum(loss * share)
            metrics["grad_norm"] = optax.tree.norm(grads)
            return (params, opt_state), metrics

        def epoch(carry, key):
            perm = jax.random.permutation(key, N)
            shuffled = jax.tree_util.tree_map(lambda x: None if x is None else x[perm], batch)
            split = jax.tree_util.tree_map(lambda x: x.reshape((M, A, N // (M * A)) + x.shape[1:]), shuffled)
            carry, metrics = jax.lax.scan(minibatch, carry, split)
            return carry, metrics

        rng, sub = jax.random.split(state.rng)
        keys = jax.random.split(sub, cfg.ppo_epochs)
        (params, opt_state), metrics = jax.lax.scan(epoch, (state.params, state.opt_state), keys)
        metrics = jax.tree_util.tree_map(lambda x: x[-1, -1], metrics)  # the last minibatch's numbers
        if cfg.score_from:
            metrics["unscored_response_tokens"] = _unscored(batch.response_mask, cfg.score_from, count=True)
        return TrainState(params, opt_state, state.step + 1, rng), metrics
