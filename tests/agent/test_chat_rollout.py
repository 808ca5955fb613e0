"""A pretrained chat model as the policy: rollouts in a text game, the update's view of them, LoRA.

Each test checks the rollout against something outside it: the model's own full forward (the
log-probs), the tokenizer's own encoding of the reply (the loss mask), the game's own record of
what it showed and what it was told (states, no-ops), the base model (LoRA with B = 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bepo_jax as bj

from bepo_jax.agent.rollouts.chat import (ChatRollout, ChatRolloutConfig, format_command, parse_reply,
                                         turn_messages)
from bepo_jax.agent.models import load_pretrained, token_logprobs
from bepo_jax.agent.models.lora import LoRAConfig, add_lora, trainable
from bepo_jax.agent.rl.train_step import TrainConfig, Trainer, UpdateBatch
from bepo_jax.credit.hashing import hash_observations

from .conftest import Corridor

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def pre(tiny_chat_dir):
    return load_pretrained(tiny_chat_dir)


def _run(pre, *, trainer=None, tasks=(0, 1), seed=0, max_steps=3, capture=None, **kw):
    cfg = ChatRolloutConfig(**{"group_size": 2, "temperature": TEMPERATURE, "max_reply": 12, **kw})
    tr = trainer or Trainer(pre.model, TrainConfig(temperature=TEMPERATURE))
    envs: list[Corridor] = []

    def make():
        envs.append(Corridor())
        return envs[-1]

    ro = ChatRollout(pre, tr.graphdef, tr.rest, make, cfg, max_steps=max_steps, capture=capture)
    out = ro(tr.init_state().params, list(tasks), jax.random.PRNGKey(seed))
    return tr, ro, out, envs


def _flat(x):
    x = np.asarray(x)
    return x.reshape((-1,) + x.shape[3:])


def test_recorded_log_probs_are_the_models_and_the_first_ratio_is_one(pre):
    tr, ro, out, _ = _run(pre)
    tokens, mask, resp, old = map(_flat, (out.tokens, out.mask, out.response_mask, out.old_logp))
    assert resp.any() and (resp <= mask).all()
    # the model's full forward over the stored sequences, at the sampling temperature
    got, want = _full_forward_logp(pre, out)
    np.testing.assert_allclose(want, got, atol=2e-5)
    # the update itself (one minibatch, scoring from the prompt's end): ratio 1, nothing clipped
    P = tokens.shape[1] - ro.config.max_reply
    upd = Trainer(pre.model, TrainConfig(temperature=TEMPERATURE, score_from=P - 1))
    adv = np.where(resp, 1.0, 0.0).astype(np.float32)
    _, m = upd.step(upd.init_state(), UpdateBatch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(resp),
                                                  jnp.asarray(old), jnp.asarray(adv)))
    assert abs(float(m["approx_kl"])) < 1e-6 and float(m["clip_frac"]) == 0.0


@pytest.mark.parametrize("action_format", ["bare", "tag"])
def test_the_loss_mask_is_exactly_the_replys_tokens(pre, action_format):
    # constrained: each reply names a command; its tokens are the tokenizer's encoding of it, then end-of-turn
    _, ro, out, _ = _run(pre, constrained=True, action_format=action_format)
    tok = pre.tokenizer
    resp, tokens, valid = _flat(out.response_mask), _flat(out.tokens), np.asarray(out.batch.mask).reshape(-1)
    turns = [t for ep in ro.episodes for t in ep]
    assert len(turns) == valid.sum()
    for row, turn in zip(np.flatnonzero(valid), turns):
        assert turn["action"] >= 0
        expected = tok.encode(format_command(turn["commands"][turn["action"]], action_format))
        assert tokens[row][resp[row]].tolist() == expected + [ro.stop[0]]
    assert not resp[~valid].any()
    # unconstrained: the masked tokens decode to the reply the game was given (then the end of the turn, if sampled)
    _, ro, out, _ = _run(pre, seed=1)
    resp, tokens, valid = _flat(out.response_mask), _flat(out.tokens), np.asarray(out.batch.mask).reshape(-1)
    for row, turn in zip(np.flatnonzero(valid), [t for ep in ro.episodes for t in ep]):
        ids = tokens[row][resp[row]].tolist()
        ended = ids[-1] in tok.end_of_turn_ids
        assert ended or len(ids) == ro.config.max_reply
        assert tok.decode(ids[:-1] if ended else ids, skip_special_tokens=True) == turn["reply"]


@pytest.mark.parametrize("with_commands", [False, True])
def test_states_are_the_games_own_observations(pre, with_commands):
    _, _, out, envs = _run(pre, constrained=True, state_with_commands=with_commands, max_steps=4)
    keys, valid = np.asarray(out.batch.obs_key), np.asarray(out.batch.mask)
    B, K, T = valid.shape
    for i, env in enumerate(envs):
        b, k = divmod(i, K)
        n = int(valid[b, k].sum())
        assert len(env.steps) == n  # constrained: every turn names a command, so every turn steps the game
        shown = env.log[:n]  # the observation each turn acted on
        texts = [s + ("\n" + "\n".join(Corridor.commands) if with_commands else "") for s in shown]
        np.testing.assert_array_equal(keys[b, k, :n], hash_observations(texts))
        assert bool(out.success[b, k]) == (env.room == 3)


def test_an_unparseable_reply_is_a_no_op_with_the_penalty(pre):
    _, ro, out, envs = _run(pre, invalid_penalty=-0.25, seed=2)  # a random model rarely names a command
    pen, valid, act = np.asarray(out.batch.penalty), np.asarray(out.batch.mask), np.asarray(out.actions)
    K = out.success.shape[1]
    invalid_turns = 0
    for i, env in enumerate(envs):
        b, k = divmod(i, K)
        turns = ro.episodes[i]
        named = [t["reply"].strip().lower() in Corridor.commands for t in turns]  # an independent reading
        assert [a >= 0 for a in act[b, k][valid[b, k]]] == named
        np.testing.assert_array_equal(pen[b, k][valid[b, k]], np.where(named, 0.0, -0.25).astype(np.float32))
        assert env.steps == [t["commands"][t["action"]] for t in turns if t["action"] >= 0]
        # the action key: the command the game was given, or "" (no command) for an unparseable reply
        given = [t["commands"][t["action"]] if t["action"] >= 0 else "" for t in turns]
        np.testing.assert_array_equal(np.asarray(out.batch.action_key)[b, k][valid[b, k]], bj.action_keys(given))
        invalid_turns += named.count(False)
    assert invalid_turns > 0
    assert (pen[~valid] == 0).all()


def test_parse_reply_reads_the_formats():
    cmds = ["go east", "take key from box"]
    assert parse_reply("Go East.\nbecause", cmds, "bare") == 0
    assert parse_reply("  `take key from box`", cmds, "bare") == 1
    assert parse_reply("go", cmds, "bare") == -1 and parse_reply("", cmds, "bare") == -1
    assert parse_reply("I think <action>take key from box</action>", cmds, "tag") == 1
    assert parse_reply("go east", cmds, "tag") == -1  # no tags


def test_compiled_programs_stay_after_warm_up(pre):
    tr = Trainer(pre.model, TrainConfig(temperature=TEMPERATURE))
    _, ro, _, _ = _run(pre, trainer=tr)
    before = ro.compiles
    ro(tr.init_state().params, [0, 1], jax.random.PRNGKey(5))
    assert ro.compiles == before


def test_lora_with_zero_b_is_the_base_model_and_only_adapters_train(tiny_chat_dir):
    pre = load_pretrained(tiny_chat_dir)
    ids = jnp.asarray([pre.prompt_ids([{"role": "user", "content": "go east"}])])
    base = np.asarray(pre.model(ids, jnp.ones(ids.shape, bool)))
    add_lora(pre.model, LoRAConfig(rank=4, targets=("q_proj", "v_proj", "down_proj")))
    np.testing.assert_array_equal(np.asarray(pre.model(ids, jnp.ones(ids.shape, bool))), base)
    tr = Trainer(pre.model, TrainConfig(), trainable=trainable(pre.model, lora=True))
    leaves = jax.tree_util.tree_leaves_with_path(tr.init_state().params)
    names = {str(p[-2].key if hasattr(p[-2], "key") else p[-2]) for p, _ in leaves}
    assert names == {"lora_a", "lora_b"} and len(leaves) == 2 * 3 * len(pre.model.layers)
    pre.model.layers[0].q_proj.lora_b[...] = jnp.ones_like(pre.model.layers[0].q_proj.lora_b[...])
    assert not np.allclose(np.asarray(pre.model(ids, jnp.ones(ids.shape, bool))), base)


def test_top_layers_train_only_the_top_blocks_and_the_final_norm(tiny_chat_dir):
    pre = load_pretrained(tiny_chat_dir)
    params = nnx.state(pre.model, trainable(pre.model, top_layers=1))
    paths = [p for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    tops = {(getattr(p[0], "key", None), getattr(p[1], "key", None)) for p in paths}
    assert tops == {("layers", 1), ("norm", "scale")}
    with pytest.raises(ValueError, match="top_layers=3"):
        trainable(pre.model, top_layers=3)


def test_the_frozen_blocks_output_recorded_in_decoding_is_the_forwards(tiny_chat_dir):
    # training the top block: the rollout records block 1's input at every position, and the update's
    # log-probs from it equal the recorded ones (ratio 1) and the full forward's
    pre = load_pretrained(tiny_chat_dir)
    pre.model.capture_layer = 1
    tr = Trainer(pre.model, TrainConfig(temperature=TEMPERATURE), trainable=trainable(pre.model, top_layers=1))
    _, ro, out, _ = _run(pre, trainer=tr, seed=3)
    tokens, mask, resp, old = map(_flat, (out.tokens, out.mask, out.response_mask, out.old_logp))
    hidden = np.asarray(out.hidden).reshape(tokens.shape + (-1,))
    full = np.asarray(pre.model.hidden_states(jnp.asarray(tokens), jnp.asarray(mask)))
    real = mask.copy()
    real[:, -1] = False  # the last position predicts nothing; the decode path never runs it
    np.testing.assert_allclose(hidden[real], full[real], atol=2e-5)
    P = tokens.shape[1] - ro.config.max_reply
    logits = pre.model.score_hidden(jnp.asarray(hidden), jnp.asarray(mask), P - 1) / TEMPERATURE
    logp, _ = token_logprobs(logits, jnp.asarray(tokens), P - 1)
    np.testing.assert_allclose(np.asarray(logp)[resp], old[resp], atol=2e-5)
    upd = Trainer(pre.model, TrainConfig(temperature=TEMPERATURE, score_from=P - 1),
                  trainable=trainable(pre.model, top_layers=1))
    _, m = upd.step(tr.init_state(), UpdateBatch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(resp),
                                                 jnp.asarray(old), jnp.asarray(np.where(resp, 1.0, 0.0)),
                                                 hidden=jnp.asarray(hidden)))
    assert abs(float(m["approx_kl"])) < 1e-6 and float(m["clip_frac"]) == 0.0 and float(m["grad_norm"]) > 0


def test_an_evaluations_rollout_keeps_no_frozen_output_and_samples_the_same(tiny_chat_dir):
    # capture=False (an evaluation's rollout): no recorded block output, the same replies and log-probs as
    # the update's rollout, and both equal the model's own full forward
    pre = load_pretrained(tiny_chat_dir)
    pre.model.capture_layer = 1
    tr = Trainer(pre.model, TrainConfig(temperature=TEMPERATURE), trainable=trainable(pre.model, top_layers=1))
    outs = {c: _run(pre, trainer=tr, tasks=(2, 1), seed=5, max_steps=4, prompt_history=3, capture=c)[2]
            for c in (None, False)}
    kept, lean = outs[None], outs[False]
    assert kept.hidden is not None and lean.hidden is None
    assert np.asarray(lean.response_mask).sum() > 0
    for f in ("tokens", "mask", "response_mask", "success"):
        np.testing.assert_array_equal(np.asarray(getattr(lean, f)), np.asarray(getattr(kept, f)))
    np.testing.assert_allclose(np.asarray(lean.old_logp), np.asarray(kept.old_logp), atol=1e-6)
    got, want = _full_forward_logp(pre, lean)
    np.testing.assert_allclose(want, got, atol=2e-5)
    with pytest.raises(ValueError, match="capture_layer"):  # nothing to keep: refused, not silently empty
        _run(load_pretrained(tiny_chat_dir), capture=True)


def test_each_distinct_prompt_runs_once_and_a_row_keeps_what_its_cache_holds(pre):
    tr = Trainer(pre.model, TrainConfig())
    ro = ChatRollout(pre, tr.graphdef, tr.rest, Corridor, ChatRolloutConfig(group_size=2, bucket=2), max_steps=1)
    rows = [[5, 6, 7], [5, 6, 7], [8, 9], [5, 6, 7], [10]]
    cached = [[5, 6], [5, 6], [5], [5, 6], []]
    plan = ro.plan(rows, np.array([True, True, True, True, False]), cached)
    assert plan["expand"].tolist() == [0, 0, 1, 0, 0]  # the finished row points at the first
    assert plan["src"].tolist() == [0, 2] and plan["kept"].tolist() == [2, 0] and plan["len_new"].tolist() == [3, 2]
    assert plan["chunk"].shape == (2, 2) and plan["chunk"][0, -1] == 7 and plan["chunk_mask"][0].tolist() == [False, True]
    assert plan["computed"] == 3
    # a cache holding the whole prompt still runs its last token (the next token's logits come from it)
    plan = ro.plan([[1], [2], [3]], np.ones(3, bool), [[1], [2, 9], []])
    assert plan["chunk"].shape[0] == 4 and plan["expand"].tolist() == [0, 1, 2]  # three distinct pad to four
    assert plan["kept"].tolist()[:3] == [0, 0, 0]
    assert ro.plan([[1, 2]], np.ones(1, bool), [[1, 2]])["kept"].tolist() == [1]


def _full_forward_logp(pre, out):
    tokens, mask, resp, old = map(_flat, (out.tokens, out.mask, out.response_mask, out.old_logp))
    logp, _ = token_logprobs(pre.model(jnp.asarray(tokens), jnp.asarray(mask)) / TEMPERATURE, jnp.asarray(tokens))
    return np.asarray(logp)[resp], old[resp]


# the chat grows every turn / the window slides from turn 2; constrained replies win early (rows drop out
# mid-run), free ones from the tiny model are mostly invalid and run long
@pytest.mark.parametrize("history,constrained", [(3, True), (1, True), (3, False)])
def test_cache_reuse_samples_what_running_every_prompt_whole_samples(pre, history, constrained):
    # episodes from room 2 can win at once, so rows drop out mid-run
    outs, timing = {}, {}
    for reuse in (True, False):
        _, ro, out, _ = _run(pre, tasks=(2, 1), seed=4, max_steps=4, prompt_history=history, reuse_cache=reuse,
                             constrained=constrained)
        outs[reuse], timing[reuse] = out, dict(ro.timing)
    a, b = outs[True], outs[False]
    assert np.asarray(a.response_mask).sum() > 0
    assert not constrained or not np.asarray(a.batch.mask).all()  # some episode ended early
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.mask), np.asarray(b.mask))
    np.testing.assert_allclose(np.asarray(a.old_logp), np.asarray(b.old_logp), atol=2e-5)
    for out in (a, b):  # both equal the model's own full forward over the stored sequences
        got, want = _full_forward_logp(pre, out)
        np.testing.assert_allclose(want, got, atol=2e-5)
    # the K episodes of a game share their first prompt: run once either way
    assert timing[True]["prompt_tokens"] == timing[False]["prompt_tokens"] >= timing[False]["prefill_tokens"] > 0
    assert timing[True]["prefill_tokens"] < timing[False]["prefill_tokens"]
    assert timing[True]["shared_prefix"] > 0 and timing[False]["shared_prefix"] == 0


def test_the_prompt_extends_the_last_prompt_and_the_sampled_reply(pre):
    # the earlier reply enters the chat as the sampled tokens; the template's text stands around them
    _, ro, out, _ = _run(pre, seed=2, max_steps=2, prompt_history=2)
    tokens, mask, resp = map(np.asarray, (out.tokens, out.mask, out.response_mask))
    for b in range(tokens.shape[0]):
        for k in range(tokens.shape[1]):
            if not out.batch.mask[b, k, 1]:
                continue
            first = tokens[b, k, 0][mask[b, k, 0]].tolist()
            second = tokens[b, k, 1][mask[b, k, 1] & ~resp[b, k, 1]].tolist()
            assert second[: len(first)] == first
            # the rendered text of the turn: the template over the decoded reply (as transformers would render it)
            ep = ro.episodes[b * tokens.shape[1] + k]
            text = pre.chat_template(turn_messages(ro.envs[b * tokens.shape[1] + k].objective, [(ep[0]["observation"], ep[0]["commands"], ep[0]["reply"])],
                                                   ep[1]["observation"], ep[1]["commands"], ro.config))
            assert pre.tokenizer.decode(second) == text


def test_the_shared_prefix_computed_once_equals_the_prefix_inside_a_full_prefill(pre):
    m = pre.model
    ids = np.asarray([pre.prompt_ids([{"role": "system", "content": "Play."}, {"role": "user", "content": "go east"}])])
    n = ids.shape[1]
    full_logits, full = m.prefill(jnp.asarray(ids), jnp.ones(ids.shape, bool), n + 4)
    # the first n - 3 tokens once, the rest appended to that cache (chunked prefill)
    head_logits, head = m.extend(m.empty_cache(1, n + 4), jnp.asarray(ids[:, : n - 3]), jnp.ones((1, n - 3), bool), 0)
    logits, cache = m.extend(head, jnp.asarray(ids[:, n - 3:]), jnp.ones((1, 3), bool), n - 3)
    for kh, kf in zip(head.k, full.k):
        np.testing.assert_allclose(np.asarray(kh)[:, :, : n - 3], np.asarray(kf)[:, :, : n - 3], atol=2e-5)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full_logits), atol=2e-4)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(m(jnp.asarray(ids), jnp.ones(ids.shape, bool))[:, -1]),
                               atol=2e-4)
    assert np.asarray(cache.valid)[0, :n].all() and not np.asarray(cache.valid)[0, n:].any()
    assert int(cache.position[0]) == n


def test_state_texts_travel_as_bytes_for_similarity_merging(pre):
    from bepo_jax.credit.similarity import SimilarityConfig, merge_similar

    _, _, out, envs = _run(pre, constrained=True, max_steps=3)
    tok, valid = np.asarray(out.obs_tokens), np.asarray(out.batch.mask)
    K = out.success.shape[1]
    for i, env in enumerate(envs):
        b, k = divmod(i, K)
        for t in range(int(valid[b, k].sum())):
            row = tok[b, k, t]
            assert bytes((row[row > 0] - 1).astype(np.uint8).tolist()).decode() == env.log[t]
    # "room 0" and "room 1" differ by a character: a loose threshold merges them, exact hashing does not
    keys = np.asarray(out.batch.obs_key)
    merged = np.asarray(merge_similar(out.batch, out.obs_tokens, SimilarityConfig(threshold=0.5)).obs_key)
    distinct = lambda x: len({tuple(v) for v in x[valid]})
    assert distinct(merged) < distinct(keys)


def test_a_turn_that_cannot_fit_even_without_history_is_refused_by_name(pre):
    # a prompt over max_prompt first drops its oldest shown turns; one over it with none shown raises
    tr = Trainer(pre.model, TrainConfig())
    cfg = ChatRolloutConfig(group_size=1, max_prompt=160, bucket=16, prompt_history=2)
    ro = ChatRollout(pre, tr.graphdef, tr.rest, Corridor, cfg, max_steps=2)
    long = [("You are in room 0 of a corridor.", ["go east", "go west", "look"], [5] * 200)]
    short = ro.prompt_ids("Go.", [], "Room 1.", ["look"])
    assert len(short) <= 160
    assert ro.prompt_ids("Go.", long, "Room 1.", ["look"]) == short  # the 200-token turn dropped out
    with pytest.raises(ValueError, match="more than ChatRolloutConfig.max_prompt=160 with no earlier turn shown"):
        ro.prompt_ids("Go. " * 40, [], "Room 1.", ["look"])
