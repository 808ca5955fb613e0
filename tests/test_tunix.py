"""Step credit inside Tunix's agentic GRPO learner (bepo_jax.integrations.tunix).

A randomly initialised Qwen3 (Tunix's own architecture, shrunk to 2 layers, 32 wide)
samples multi-turn episodes of a three-room corridor through Tunix's vanilla rollout
engine for two training steps; nothing is downloaded. Checked: the per-token advantages
of every group equal the reference Gated-BEPO on the same turns laid on the assistant
spans of Tunix's own completion mask; what Tunix's policy loss receives is exactly
those rows; the model is updated; our diagnostics reach Tunix's metrics; switching the
estimator changes the advantages and the loss gradient on the same trajectories.
Python 3.12 with the tunix extra only.
"""

import numpy as np
import pytest

tunix = pytest.importorskip("tunix", reason="the tunix extra (Python 3.12): pip install 'bepo-jax[tunix]'")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import grain.python as grain  # noqa: E402
from tunix.generate import tokenizer_adapter  # noqa: E402
from tunix.models.qwen3 import model as qwen3  # noqa: E402
from tunix.rl import function_registry  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.agentic.environments.base_environment import BaseTaskEnv, EnvStepResult  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402
from tunix.tests import test_common  # noqa: E402

from bepo_jax import reference as ref  # noqa: E402
from bepo_jax.integrations import tunix as bt  # noqa: E402
from bepo_jax.types import FAILURE, SUCCESS, TRUNCATED  # noqa: E402

WORDS = ["<pad>", "<s>", "</s>", "System:", "User:", "Assistant:", "room", "1", "2", "3", "left", "right", "wait"]
B_DEF = dict(gamma=0.95, lam=0.5, w=1.0, eta_gated=0.5, norm="mean_std", weighting="step", std="unbiased", eps=1e-6,
             min_successors=2, gate_on="successor", tol=1e-6, max_iters=1000)
L = 64
STOP = [WORDS.index(w) for w in ("</s>", "wait")]  # a reply ends at "wait" (short replies, many turns)


class Corridor(BaseTaskEnv):
    """Rooms 1-3, start in 2; a reply whose first word is "left" or "right" moves,
    anything else waits; reaching room 3 ends the episode with reward 1."""

    def __init__(self, entry, max_steps=4, **kwargs):
        self.room = 2
        super().__init__(max_steps=max_steps, **kwargs)

    def _initial_observation(self):
        self.room = 2
        return "room 2"

    def _step_impl(self, action):
        words = str(getattr(action, "action", action)).split()[:1]
        if words in (["left"], ["right"]):
            self.room = max(1, self.room - 1) if words[0] == "left" else min(3, self.room + 1)
        done = self.room == 3
        return EnvStepResult(observation=f"room {self.room}", reward=1.0 if done else 0.0, done=done, info={})


class ChatParser:
    def parse(self, messages, add_generation_prompt=False, is_first_msg=False):
        roles = {"system": "System: ", "user": " User: ", "assistant": " Assistant: "}
        text = "".join(roles[m["role"]] + m["content"] for m in messages)
        return text + (" Assistant: " if add_generation_prompt else "")

    @property
    def assistant_token(self):
        return "Assistant: "

    def update_assistant_end_tokens(self, tokens):
        return tokens, 0


def make_cluster(packing=None):
    vocab = test_common.MockVocab(mapping_text_to_id={w: i for i, w in enumerate(WORDS)})
    cfg = qwen3.ModelConfig(num_layers=2, vocab_size=len(WORDS), embed_dim=32, hidden_dim=64, num_heads=2,
                            head_dim=16, num_kv_heads=1, rope_theta=10000, norm_eps=1e-6)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    roles = rl_cluster_lib.Role
    cluster = rl_cluster_lib.RLCluster(
        actor=qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)), reference=qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)),
        tokenizer=tokenizer_adapter.TokenizerAdapter(vocab),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(actor_optimizer=optax.sgd(1e-2), eval_every_n_steps=100,
                                                            max_steps=2, gradient_accumulation_steps=None,
                                                            max_seq_token_per_tpu=packing),
            rollout_config=base_rollout.RolloutConfig(max_prompt_length=32, max_tokens_to_generate=L,
                                                      return_logprobs=True, kv_cache_size=256, temperature=1.0,
                                                      eos_tokens=STOP)))
    bt.fresh_sampling_seeds(cluster, seed=0)
    return cluster


def make_learner(cluster, estimator):
    algo = bt.StepCreditConfig(num_generations=4, num_iterations=1, max_response_length=L, beta=0.0,
                               advantage_estimator=estimator, max_concurrency=1, policy_loss_fn="bepo_jax_test_capture")
    return bt.StepCreditGRPOLearner(rl_cluster=cluster, reward_fns=None, algo_config=algo, chat_parser=ChatParser(),
                                    env_class=Corridor, env_kwargs={"max_steps": 6})


LOSS_SAW = []


@function_registry.register_policy_loss_fn("bepo_jax_test_capture")
def _capturing_loss(model, train_example, **kwargs):
    jax.debug.callback(lambda a, m: LOSS_SAW.append((np.asarray(a), np.asarray(m))), train_example.advantages,
                       train_example.completion_mask)
    return function_registry.get_policy_loss_fn("grpo")(model, train_example, **kwargs)


def mask_runs(mask):
    """The runs of ones in a completion mask: the assistant spans, in order."""
    m = np.concatenate([[0], (np.asarray(mask) != 0).astype(int), [0]])
    d = np.diff(m)
    return list(zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1)))


def reference_tokens(trajectories, width):
    """Gated-BEPO by the reference on the group's turns, laid on the mask's assistant spans."""
    turns = [item.traj["bepo_turns"] for item in trajectories]
    ids, K, T = {}, len(turns), max(1, max(len(t) for t in turns))
    obs = np.zeros((1, K, T, 2), np.uint32)
    reward, mask = np.zeros((1, K, T), np.float32), np.zeros((1, K, T), bool)
    outcome = np.zeros((1, K), np.int32)
    for k, (item, tr) in enumerate(zip(trajectories, turns)):
        for t, turn in enumerate(tr):
            obs[0, k, t, 0] = ids.setdefault(turn.state, len(ids) + 1)
            reward[0, k, t], mask[0, k, t] = turn.reward, True
        total = sum(x.reward for x in tr)
        outcome[0, k] = (SUCCESS if total > 0 else FAILURE) if item.traj["status"] == "SUCCEEDED" else TRUNCATED
    adv = ref.ref_gated_bepo((obs, reward, mask, outcome, np.zeros_like(reward)), **B_DEF)["advantage"][0]
    if sum(len(t) > 0 for t in turns) < 2:  # nothing to compare: no credit
        adv = np.zeros_like(adv)
    out = np.zeros((K, width), np.float32)
    for k, item in enumerate(trajectories):
        cm = np.asarray(item.traj["conversation_masks"])[:width]
        spans = [t for t, turn in enumerate(turns[k]) if turn.assistant_tokens > 0]  # an empty reply has no span
        for t, (a, b) in zip(spans, mask_runs(cm)):
            out[k, a:b] = adv[k, t]
    return out


@pytest.fixture(scope="module")
def trained():
    cluster = make_cluster()
    learner = make_learner(cluster, "gated_bepo")
    before = jax.tree.map(jnp.copy, nnx.state(cluster.actor_trainer.model, nnx.Param))
    groups = []
    process = learner._process_results

    def spy(trajectories, mode, expected_step):
        res = process(trajectories, mode, expected_step)
        groups.append((trajectories, res[0]))
        return res

    learner._process_results = spy
    LOSS_SAW.clear()
    data = grain.MapDataset.source(["go"] * 4).batch(2).map(lambda x: {"prompts": x})
    learner.train(data)
    return cluster, learner, groups, before, list(LOSS_SAW)


def test_tunix_receives_gated_bepo_per_token_advantages(trained):
    cluster, learner, groups, before, loss_saw = trained
    assert cluster.global_steps == 2 and len(groups) == 4
    assert any(len(item.traj["bepo_turns"]) > 1 for trajs, _ in groups for item in trajs)  # multi-turn
    assert any(np.abs(np.asarray(ex.advantages)).max() > 0 for _, ex in groups)
    for trajectories, ex in groups:
        adv = np.asarray(ex.advantages)
        assert adv.shape == np.asarray(ex.completion_ids).shape == (4, L)
        np.testing.assert_allclose(adv, reference_tokens(trajectories, L), atol=1e-4)
        assert not adv[np.asarray(ex.completion_mask) == 0].any()  # environment tokens and padding get 0
    # the policy loss received exactly these rows (Tunix may re-batch and re-pad them)
    sent = [row[: int(np.flatnonzero(row)[-1]) + 1] if row.any() else row[:0]
            for _, ex in groups for row in np.asarray(ex.advantages)]
    got = [row[: int(np.flatnonzero(row)[-1]) + 1] if row.any() else row[:0] for a, _ in loss_saw for row in a]
    assert len(got) == len(sent)
    for row in got:
        assert any(len(row) == len(s) and np.allclose(row, s) for s in sent)
    after = nnx.state(cluster.actor_trainer.model, nnx.Param)
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), before, after))
    assert any(changed)


def test_our_diagnostics_reach_tunix_metrics(trained):
    cluster = trained[0]
    log = cluster._rl_metrics_logger
    for name in ("states", "gated_share", "converged", "advantage/abs_mean"):
        assert len(log.get_metric_history("bepo", name, "train")) >= 1, name


def test_switching_the_estimator_changes_the_update(trained):
    cluster, learner, groups, _, _ = trained
    trajectories, ex = max(groups, key=lambda g: np.abs(np.asarray(g[1].advantages)).sum())
    other = make_learner(cluster, "grpo")
    ex2 = other._process_results(trajectories, rl_cluster_lib.Mode.TRAIN, 0)[0]
    assert not np.allclose(np.asarray(ex.advantages), np.asarray(ex2.advantages))
    loss = function_registry.get_policy_loss_fn("grpo")
    model = cluster.actor_trainer.model

    def grad(example):
        g = nnx.grad(lambda m: loss(m, example, algo_config=learner.algo_config, pad_id=0, eos_id=2)[0])(model)
        return np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])

    assert np.linalg.norm(grad(ex) - grad(ex2)) > 1e-6


def test_config_and_learner_refuse_bad_input():
    with pytest.raises(ValueError, match="advantage_estimator='gated-bepo' is not a bepo_jax estimator"):
        bt.StepCreditConfig(num_generations=4, advantage_estimator="gated-bepo")
    with pytest.raises(ValueError, match="lamda"):
        bt.StepCreditConfig(num_generations=4, estimator_config={"lamda": 0.5})
    from tunix.rl.agentic import agentic_grpo_learner

    with pytest.raises(ValueError, match="must be a StepCreditConfig"):
        bt.StepCreditGRPOLearner(rl_cluster=None, algo_config=agentic_grpo_learner.GRPOConfig(num_generations=4))
    assert bt.StepCreditConfig(num_generations=2, advantage_estimator="bepo_jax/gigpo").step_estimator == "gigpo"


def test_trajectory_level_registry_entries():
    names = bt.register_tunix_estimators()
    assert "bepo_jax/grpo" in names and "gated_bepo" in names and "grpo" not in names
    r = np.array([1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0], np.float32)
    ours = function_registry.get_advantage_estimator("bepo_jax/grpo")(rewards=r, num_generations=4)
    theirs = function_registry.get_advantage_estimator("grpo")(rewards=r, num_generations=4)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)  # same definition: unbiased std, eps 1e-6


def test_train_unpads_multi_turn_streams_while_packing(monkeypatch):
    """With sequence packing on, Tunix's train loop unpads with unpad_multi_turn (and the
    original is back afterwards); without packing nothing is replaced."""
    from tunix.rl import utils as rl_utils
    from tunix.rl.agentic import agentic_grpo_learner

    seen = []
    monkeypatch.setattr(agentic_grpo_learner.GRPOLearner, "train", lambda self, *a, **k: seen.append(
        rl_utils.unpad_train_example))
    original = rl_utils.unpad_train_example
    for packing, want in ((256, bt.unpad_multi_turn), (None, original)):
        learner = make_learner(make_cluster(packing=packing), "gated_bepo")
        learner.train([])
        assert seen[-1] is want and rl_utils.unpad_train_example is original


def test_multi_turn_unpadding_keeps_the_whole_stream():
    from tunix.rl import utils as rl_utils
    from tunix.rl.agentic.agentic_rl_learner import TrainExample

    mask = np.array([[1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]], np.int32)
    adv = np.where(mask == 1, np.array([[1, 1, 0, 0, 2, 2, 0, 0], [3, 3, 3, 0, 0, 0, 0, 0]], np.float32), 0)
    ex = TrainExample(prompt_ids=np.array([[0, 5], [5, 6]]), prompt_mask=np.array([[0, 1], [1, 1]]),
                      completion_ids=np.arange(16).reshape(2, 8) + 7, completion_mask=mask, advantages=adv,
                      ref_per_token_logps=None, old_per_token_logps=-np.ones((2, 8), np.float32),
                      policy_version=np.zeros(2, np.int32))
    tunix_cut = rl_utils.unpad_train_example(ex)
    assert len(tunix_cut[0]["completion_ids"]) == 4  # Tunix's cut: sum(mask) drops the second turn's tokens
    ours = bt.unpad_multi_turn(ex)
    np.testing.assert_array_equal(ours[0]["completion_ids"], np.arange(6) + 7)
    np.testing.assert_array_equal(ours[0]["advantages"], [1, 1, 0, 0, 2, 2])
    np.testing.assert_array_equal(ours[0]["completion_mask"], [1, 1, 0, 0, 1, 1])
    assert len(ours[0]["old_per_token_logps"]) == 6
    for k in ("completion_ids", "advantages", "completion_mask", "prompt_ids"):  # single-turn rows: Tunix's cut
        np.testing.assert_array_equal(ours[1][k], tunix_cut[1][k])
