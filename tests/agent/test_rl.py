"""Policy interface, PPO loss, the sharded training step, checkpoints, multi-host."""

import glob
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bepo_jax.agent.models import DecoderLM, PolicyModel, TransformerConfig, score_logits, token_logprobs
from bepo_jax.agent.rl import PPOLossConfig, TrainConfig, Trainer, ppo_loss
from bepo_jax.agent.rl.checkpoint import CheckpointError, Checkpointer
from bepo_jax.agent.rl.train_step import UpdateBatch
from bepo_jax.credit.sharding import make_mesh

TINY = TransformerConfig(vocab=32, layers=1, width=32, heads=2, context=16)


class ConvLM(nnx.Module):
    """A structurally different policy: embeddings + one causal depthwise convolution + MLP head."""

    def __init__(self, vocab=32, width=24, kernel=3, *, rngs):
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.conv = nnx.Conv(width, width, kernel_size=(kernel,), padding=[(kernel - 1, 0)], rngs=rngs)
        self.out = nnx.Linear(width, vocab, rngs=rngs)

    def __call__(self, tokens, mask):
        h = self.embed(tokens) * mask[..., None]
        return self.out(nnx.relu(self.conv(h)))


def make_update_batch(n=16, length=12, seed=0, vocab=32):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (n, length)).astype(np.int32)
    mask = np.ones((n, length), bool)
    mask[::3, -2:] = False  # some padding
    resp = np.zeros((n, length), bool)
    resp[:, 6:] = True
    resp &= mask
    old = np.where(resp, -3.4, 0.0).astype(np.float32)
    adv = np.where(resp, rng.normal(size=(n, length)), 0.0).astype(np.float32)
    return UpdateBatch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(resp), jnp.asarray(old), jnp.asarray(adv), None)


def make_trainer(mesh=None, model=None, **cfg):
    cfg = {"num_minibatches": 2, "grad_accum": 2, "ppo_epochs": 2, "learning_rate": 1e-2, **cfg}
    return Trainer(model or DecoderLM(TINY, rngs=nnx.Rngs(0)), TrainConfig(**cfg), mesh=mesh)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


# Parameters after updates whose gradient sums ran in another order (shards, processes, accumulated
# minibatches). Adam divides each gradient by its running RMS, so an element whose gradient nearly
# cancels turns a sum's rounding into a visible step: one element of 15,040 differed by 1.0e-5 after
# test_sharded_step_equals_single_device's 4 updates under the tests' O0 code generation on one CPU
# (1.6e-6 at full optimisation), the rest by under 1e-6. 5e-5 is 1% of the largest movement (4e-3); a
# sharding bug that loses or double-counts a share of the batch moves parameters by ~1e-3 (a step on
# another batch: 7.8e-3).
REORDER_ATOL = 5e-5


def _max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(_leaves(a), _leaves(b)))


# ------------------------------------------------------------------------------ models


@pytest.mark.parametrize("make", [lambda: DecoderLM(TINY, rngs=nnx.Rngs(0)), lambda: ConvLM(rngs=nnx.Rngs(0))])
def test_policy_interface_causal_and_padding(make):
    model = make()
    assert isinstance(model, PolicyModel)
    b = make_update_batch()
    logits = np.asarray(model(b.tokens, b.mask))
    assert logits.shape == (16, 12, 32)
    changed = b.tokens.at[:, 8].set((b.tokens[:, 8] + 1) % 32)
    logits2 = np.asarray(model(changed, b.mask))
    np.testing.assert_allclose(logits2[:, :8], logits[:, :8], atol=1e-5)  # the future does not leak back


@pytest.mark.parametrize("layers", [1, 2])
def test_score_is_the_full_forward_from_start(layers):
    """The scoring shortcut (the last layer from ``start`` only) equals the full forward's
    logits there; a model without it (ConvLM) is sliced."""
    import dataclasses

    model = DecoderLM(dataclasses.replace(TINY, layers=layers), rngs=nnx.Rngs(1))
    b = make_update_batch()
    full = np.asarray(model(b.tokens, b.mask))
    for start in (1, 5, 11):
        part = np.asarray(model.score(b.tokens, b.mask, start))
        assert part.shape == (16, 12 - start, 32)
        np.testing.assert_allclose(part, full[:, start:], atol=1e-5)
    conv = ConvLM(rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(score_logits(conv, b.tokens, b.mask, 5)),
                               np.asarray(conv(b.tokens, b.mask))[:, 5:], atol=1e-6)


def test_attention_with_a_query_offset_agrees_across_backends_paths(monkeypatch):
    """Queries from position 5 on: the CPU path (explicit causal bias) and the GPU/TPU path
    (``jax.nn.dot_product_attention`` with a mask, run here on CPU) equal the full
    attention's rows from 5 on."""
    from bepo_jax.agent.models import transformer as tf

    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.normal(size=(3, 9, 2, 4)).astype(np.float32)) for _ in range(3))
    bias = tf.key_bias(jnp.asarray(rng.random((3, 9)) > 0.2))
    full = np.asarray(tf.attention(q, k, v, bias, causal=True))[:, 5:]
    np.testing.assert_allclose(np.asarray(tf.attention(q[:, 5:], k, v, bias, causal=True, q_offset=5)), full, atol=1e-5)
    monkeypatch.setattr(tf.jax, "default_backend", lambda: "gpu")
    np.testing.assert_allclose(np.asarray(tf.attention(q[:, 5:], k, v, bias, causal=True, q_offset=5)), full, atol=1e-5)


def test_transformer_config_errors():
    with pytest.raises(ValueError, match="width=30 must be a multiple of heads=4"):
        TransformerConfig(width=30, heads=4)
    with pytest.raises(ValueError, match="exceeds TransformerConfig.context=16"):
        DecoderLM(TINY, rngs=nnx.Rngs(0))(jnp.zeros((1, 17), jnp.int32), jnp.ones((1, 17), bool))
    with pytest.raises(ValueError, match="head_init_scale"):
        TransformerConfig(head_init_scale=0.0)


def test_head_init_scale_scales_only_the_head_and_flattens_the_initial_policy():
    """scale 1 is plain LeCun init (the same draws as before the option existed); a small
    scale multiplies the head's weights and nothing else, and the next-token distribution
    starts near uniform."""
    import dataclasses

    key = jax.random.key(3)
    np.testing.assert_array_equal(  # what _dense draws at scale 1 is LeCun-normal, draw for draw
        nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")(key, (32, 16)),
        nnx.initializers.lecun_normal()(key, (32, 16)))
    plain = DecoderLM(TINY, rngs=nnx.Rngs(0))
    small = DecoderLM(dataclasses.replace(TINY, head_init_scale=0.01), rngs=nnx.Rngs(0))
    w, ws = plain.head.kernel[...], small.head.kernel[...]
    np.testing.assert_allclose(np.asarray(ws), 0.01 * np.asarray(w), rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(small.embed.embedding[...]), np.asarray(plain.embed.embedding[...]))
    tokens, mask = jnp.arange(8, dtype=jnp.int32)[None], jnp.ones((1, 8), bool)
    entropy = lambda m: float(-(jax.nn.softmax(m(tokens, mask)) * jax.nn.log_softmax(m(tokens, mask))).sum(-1).mean())
    assert entropy(small) > np.log(TINY.vocab) - 1e-3 > entropy(plain) + 0.1


def test_token_logprobs_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    tokens = rng.integers(0, 7, (2, 5)).astype(np.int32)
    logp, ent = (np.asarray(x) for x in token_logprobs(jnp.asarray(logits), jnp.asarray(tokens)))
    for n in range(2):
        assert logp[n, 0] == 0 and ent[n, 0] == 0
        for j in range(1, 5):
            z = logits[n, j - 1].astype(np.float64)
            lp = z - np.log(np.exp(z).sum())
            assert logp[n, j] == pytest.approx(lp[tokens[n, j]], abs=1e-5)
            assert ent[n, j] == pytest.approx(-(np.exp(lp) * lp).sum(), abs=1e-5)


def test_token_logprobs_from_start_are_the_full_ones_after_it():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(2, 6, 7)).astype(np.float32))
    tokens = jnp.asarray(rng.integers(0, 7, (2, 6)).astype(np.int32))
    full = [np.asarray(x) for x in token_logprobs(logits, tokens)]
    part = [np.asarray(x) for x in token_logprobs(logits[:, 3:], tokens, 3)]
    for f, q in zip(full, part):
        assert q.shape == (2, 6) and np.all(q[:, :4] == 0)
        np.testing.assert_allclose(q[:, 4:], f[:, 4:], atol=1e-6)
    with pytest.raises(ValueError, match="logits cover 6 positions.*start=3"):
        token_logprobs(logits, tokens, 3)


# -------------------------------------------------------------------------------- loss


def _ref_loss(logp, old, adv, m, cfg, ent=None, ref=None):
    per_tok, kl, en = np.zeros_like(logp), np.zeros_like(logp), np.zeros_like(logp)
    for i in np.ndindex(logp.shape):
        if not m[i]:
            continue
        r = np.exp(logp[i] - old[i])
        l = max(-adv[i] * r, -adv[i] * min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high))
        if cfg.dual_clip is not None and adv[i] < 0:
            l = min(l, -adv[i] * cfg.dual_clip)
        per_tok[i] = l
        if ref is not None:
            d = ref[i] - logp[i]
            kl[i] = np.exp(d) - d - 1
        if ent is not None:
            en[i] = ent[i]

    def agg(x):
        if cfg.aggregation == "token-mean":
            return x[m].sum() / m.sum()
        seqs = [x[n][m[n]].mean() for n in range(x.shape[0]) if m[n].any()]
        return float(np.mean(seqs))

    return agg(per_tok) + cfg.kl_coef * agg(kl) - cfg.entropy_coef * agg(en)


@pytest.mark.parametrize("cfg", [
    PPOLossConfig(),
    PPOLossConfig(clip_low=0.1, clip_high=0.28, dual_clip=3.0),
    PPOLossConfig(kl_coef=0.01, entropy_coef=0.02, aggregation="seq-mean-token-mean"),
    PPOLossConfig(dual_clip=1.5, aggregation="seq-mean-token-mean", kl_coef=0.1),
])
def test_ppo_loss_matches_loops(cfg):
    rng = np.random.default_rng(1)
    shape = (6, 8)
    logp = rng.normal(-2, 1, shape).astype(np.float32)
    old = (logp + rng.normal(0, 0.5, shape)).astype(np.float32)
    ref = (logp + rng.normal(0, 0.3, shape)).astype(np.float32)
    ent = rng.uniform(0, 2, shape).astype(np.float32)
    adv = rng.normal(0, 1, shape).astype(np.float32)
    m = rng.random(shape) < 0.7
    m[0] = False
    loss, metrics = ppo_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(m), cfg,
                             entropy=jnp.asarray(ent), ref_logp=jnp.asarray(ref))
    assert float(loss) == pytest.approx(_ref_loss(logp, old, adv, m, cfg, ent, ref), rel=1e-5, abs=1e-6)
    r = np.exp(logp - old)[m]
    assert float(metrics["clip_frac"]) == pytest.approx(np.mean((r < 1 - cfg.clip_low) | (r > 1 + cfg.clip_high)))
    assert float(metrics["adv_mean"]) == pytest.approx(adv[m].mean(), abs=1e-6)


def test_ppo_config_errors():
    with pytest.raises(ValueError, match="dual_clip=0.5 is out of range; it must be > 1.0"):
        PPOLossConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="aggregation='sum' is not valid"):
        PPOLossConfig(aggregation="sum")
    with pytest.raises(ValueError, match="not a multiple of num_minibatches \\* grad_accum = 4"):
        make_trainer().step(make_trainer().init_state(), make_update_batch(n=10))


# ------------------------------------------------------------------------------- train


@pytest.mark.parametrize("model", ["transformer", "conv"])
def test_training_raises_the_logprob_of_positive_advantage_tokens(model):
    m = ConvLM(rngs=nnx.Rngs(0)) if model == "conv" else None
    trainer = make_trainer(model=m, ppo_epochs=1, num_minibatches=1, grad_accum=1)
    b = make_update_batch()
    b = b._replace(advantage=jnp.where(b.response_mask, 1.0, 0.0))
    state = trainer.init_state()

    def mean_logp(st):
        lp, _ = token_logprobs(trainer.model(st)(b.tokens, b.mask), b.tokens)
        return float(jnp.sum(lp * b.response_mask) / jnp.sum(b.response_mask))

    before = mean_logp(state)
    for _ in range(5):
        b = b._replace(old_logp=jnp.where(b.response_mask, token_logprobs(trainer.model(state)(b.tokens, b.mask),
                                                                          b.tokens)[0], 0.0))
        state, metrics = trainer.step(state, b)
    assert mean_logp(state) > before + 0.1
    assert int(state.step) == 5 and np.isfinite(float(metrics["loss"]))


def test_init_state_survives_a_donating_step():
    """The update donates its state; a second init_state (a restart, a second seed) must
    still give the initial parameters, not arrays the first update deleted."""
    trainer = make_trainer(ppo_epochs=1, num_minibatches=1, grad_accum=1)
    first = trainer.init_state()
    before = jax.tree_util.tree_map(lambda x: np.array(x, copy=True), first.params)  # no view: keeps donation on
    trainer.step(first, make_update_batch())
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(first.params))  # the step donated them
    again = trainer.init_state()
    assert _max_diff(again.params, before) == 0.0
    state, metrics = trainer.step(again, make_update_batch())
    assert np.isfinite(float(metrics["loss"]))


def test_gradient_accumulation_equals_one_big_minibatch():
    b = make_update_batch()
    one = make_trainer(num_minibatches=1, grad_accum=1, ppo_epochs=1)
    four = make_trainer(num_minibatches=1, grad_accum=4, ppo_epochs=1)
    s1, _ = one.step(one.init_state(), b)
    s4, _ = four.step(four.init_state(), b)
    assert _max_diff(s1.params, s4.params) < REORDER_ATOL


def test_a_micro_batch_without_responses_leaves_the_metrics_finite():
    """Finished episodes' turns are rows with no response token; a micro-batch of only such rows
    counts for nothing (its advantage extremes are +-inf and once made the minibatch's nan)."""
    b = make_update_batch(n=8)
    empty = np.zeros(b.response_mask.shape, bool)
    empty[0] = np.asarray(b.response_mask)[0]  # one row with a response: 3 of the 4 micro-batches have none
    b = b._replace(response_mask=jnp.asarray(empty), advantage=jnp.where(empty, b.advantage, 0.0))
    trainer = Trainer(DecoderLM(TINY, rngs=nnx.Rngs(0)), TrainConfig(num_minibatches=1, grad_accum=4, ppo_epochs=1))
    _, m = trainer.step(trainer.init_state(), b)
    adv = np.asarray(b.advantage)[empty]
    assert all(np.isfinite(float(v)) for v in m.values())
    assert abs(float(m["adv_min"]) - adv.min()) < 1e-6 and abs(float(m["adv_max"]) - adv.max()) < 1e-6


@pytest.mark.parametrize("model", ["transformer", "conv"])
def test_score_from_gives_the_full_update(model):
    """The batch's responses start at position 6: scoring from 5 is the same update (the
    transformer through its shortcut, the conv model through the sliced forward); a
    response token at or before score_from is refused by name."""
    make = (lambda: ConvLM(rngs=nnx.Rngs(0))) if model == "conv" else (lambda: None)
    b = make_update_batch()
    full, part = make_trainer(model=make()), make_trainer(model=make(), score_from=5)
    s_full, m_full = full.step(full.init_state(), b)
    s_part, m_part = part.step(part.init_state(), b)
    assert _max_diff(s_full.params, s_part.params) < 1e-5
    assert abs(float(m_full["loss"]) - float(m_part["loss"])) < 1e-6
    assert float(m_part["unscored_response_tokens"]) == 0.0 and "unscored_response_tokens" not in m_full
    late = make_trainer(model=make(), score_from=6)
    with pytest.raises(ValueError, match="TrainConfig.score_from=6"):
        late.step(late.init_state(), b)
    with pytest.raises(ValueError, match="score_from"):
        TrainConfig(score_from=-1)


def test_sharded_step_equals_single_device():
    b = make_update_batch()
    # One step = 2 epochs x 2 minibatches = 4 AdamW updates (lr 1e-3).
    single = make_trainer(learning_rate=1e-3)
    s1 = single.init_state()
    mesh = make_mesh((4, 2), ("data", "fsdp"))
    multi = make_trainer(mesh, learning_rate=1e-3)
    s8 = multi.init_state()
    kernel = [x for x in jax.tree_util.tree_leaves(s8.params) if x.ndim == 2][0]
    assert kernel.sharding.spec[0] == "fsdp" and len(kernel.sharding.device_set) == 8
    s1, m1 = single.step(s1, b)
    s8, m8 = multi.step(s8, b)
    assert _max_diff(s1.params, s8.params) < REORDER_ATOL
    assert _max_diff(s1.opt_state, s8.opt_state) < 1e-5
    assert abs(float(m1["loss"]) - float(m8["loss"])) < 1e-5


@pytest.mark.slow  # two processes, each compiling the step (tens of seconds): make test skips it, CI=1 runs it
@pytest.mark.current_jax  # CI runs it on 3.12 (current JAX), not again on 3.11
def test_two_processes_compute_the_single_process_update(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}  # the worker sets its own device count
    procs = [subprocess.Popen([sys.executable, str(root / "tests" / "agent" / "multihost_worker.py"), str(port), str(i),
                               str(tmp_path / f"p{i}.npy")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i in range(2)]
    outs = [p.communicate(timeout=240)[0].decode()[-3000:] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    got = [np.load(tmp_path / f"p{i}.npy") for i in range(2)]
    np.testing.assert_array_equal(got[0], got[1])
    single = make_trainer()
    s1, _ = single.step(single.init_state(), make_update_batch())
    want = np.concatenate([x.ravel() for x in _leaves(s1.params)])
    assert np.max(np.abs(got[0] - want)) < REORDER_ATOL


# -------------------------------------------------------------------------- checkpoints


def _batch_at(position):
    return make_update_batch(seed=100 + position)


def _run(trainer, state, start, stop, ck=None):
    for pos in range(start, stop):
        state, _ = trainer.step(state, _batch_at(pos))
        if ck is not None:
            ck.save(pos + 1, state, {"data_position": pos + 1})
    return state


def test_kill_and_resume_equals_uninterrupted(tmp_path):
    full = _run(make_trainer(), make_trainer().init_state(), 0, 4)
    ck = Checkpointer(tmp_path / "run", max_to_keep=2)
    first = make_trainer()
    _run(first, first.init_state(), 0, 2, ck)
    del first  # "killed": a new process starts from the directory alone
    fresh = make_trainer()
    state, meta, step = Checkpointer(tmp_path / "run").restore_latest(fresh.abstract_state())
    assert step == 2 and meta == {"data_position": 2}
    resumed = _run(fresh, state, meta["data_position"], 4)
    for a, b in zip(_leaves(full), _leaves(resumed)):
        np.testing.assert_array_equal(a, b)  # bitwise: parameters, optimizer state, step, RNG


def test_keeps_last_n_and_survives_corruption_and_interrupted_saves(tmp_path):
    trainer = make_trainer()
    ck = Checkpointer(tmp_path / "ck", max_to_keep=2)
    _run(trainer, trainer.init_state(), 0, 3, ck)
    assert ck.steps() == [2, 3]
    # A save that died half-way leaves only orbax's temporary directory behind.
    (tmp_path / "ck" / "4.orbax-checkpoint-tmp-1234").mkdir()
    (tmp_path / "ck" / "4.orbax-checkpoint-tmp-1234" / "partial").write_bytes(b"\0" * 10)
    assert Checkpointer(tmp_path / "ck").steps() == [2, 3]
    # Truncate every file of the newest checkpoint.
    for f in glob.glob(str(tmp_path / "ck" / "3" / "**" / "*"), recursive=True):
        if os.path.isfile(f):
            open(f, "r+b").truncate(3)
    ck2 = Checkpointer(tmp_path / "ck")
    with pytest.raises(CheckpointError, match=r"checkpoint 3 under .* is unreadable .*earlier checkpoint\(s\) \[2\]"):
        ck2.restore(trainer.abstract_state())
    with pytest.warns(RuntimeWarning, match="skipped unreadable checkpoint"):
        restored, meta, step = ck2.restore_latest(trainer.abstract_state())
    assert step == 2 and meta["data_position"] == 2
    with pytest.raises(CheckpointError, match="no checkpoint 7 .* it has steps \\[2, 3\\]"):
        ck2.restore(trainer.abstract_state(), 7)


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
@pytest.mark.current_jax  # CI runs it on 3.12 (current JAX), not again on 3.11
def test_restore_onto_a_different_mesh(tmp_path):
    mesh = make_mesh((4, 2), ("data", "fsdp"))
    multi = make_trainer(mesh)
    state = _run(multi, multi.init_state(), 0, 1)
    Checkpointer(tmp_path / "m").save(1, state, {"data_position": 1})
    single = make_trainer()
    restored, _ = Checkpointer(tmp_path / "m").restore(single.abstract_state())
    leaf = jax.tree_util.tree_leaves(restored.params)[0]
    assert len(leaf.sharding.device_set) == 1
    assert _max_diff(restored, state) == 0.0
    # ... and it trains on: one more step on one device equals one more step on eight.
    s1, _ = single.step(restored, _batch_at(1))
    s8, _ = multi.step(state, _batch_at(1))
    assert _max_diff(s1.params, s8.params) < REORDER_ATOL
