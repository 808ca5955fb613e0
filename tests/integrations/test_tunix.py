"""Step credit inside Tunix's agentic GRPO learner (bepo_jax.integrations.tunix).

A randomly initialised Qwen3 (Tunix's own architecture, 2 layers, width 32) plays
examples/tunix_agent.py's four-room world: the task as a user message, every later
observation as a tool message, a step cost, a success flag in the step info, a step
limit, a reward_fns format bonus on the first reply, two groups per ``_process_results``
call. The reference is built from what the environment itself recorded (``RoomsEnv.LOG``:
the observation it showed, the reward it paid, whether it or its step limit ended the
episode) and the conversation's own text, never from the adapter's records; the
reference Gated-BEPO on it, laid on the assistant spans of Tunix's completion mask, must
equal what the policy loss receives. Python 3.12 with the tunix extra only.
"""

import copy

import numpy as np
import pytest

tunix = pytest.importorskip("tunix", reason="the tunix extra (Python 3.12): pip install 'bepo-jax[tunix]'")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from tunix.rl import function_registry  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.agentic import agentic_grpo_learner  # noqa: E402
from tunix.rl.agentic.agents.agent_types import TrajectoryItem  # noqa: E402

from bepo_jax.credit import reference as ref  # noqa: E402
from bepo_jax.integrations import tunix as bt  # noqa: E402
from bepo_jax.integrations.tunix import engine as bt_engine  # noqa: E402
from bepo_jax.integrations.tunix import compat as tunix_compat  # noqa: E402
from bepo_jax.credit.types import FAILURE, SUCCESS, TRUNCATED  # noqa: E402
from examples import tunix_agent as ta  # noqa: E402

B_DEF = dict(gamma=0.95, lam=0.5, w=1.0, eta_gated=0.5, norm="mean_std", weighting="step", std="unbiased", eps=1e-6,
             min_successors=2, gate_on="successor", tol=1e-6, max_iters=1000)
LAM = 0.25
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


def env_record(item, budget=ta.L):
    """What the environment recorded for this trajectory: per step the observation it had
    shown, its reward; the outcome from its own ending (success flag), TRUNCATED when its
    step limit or anything but the environment stopped the episode. One more turn, which the
    environment never saw, where Tunix's own record says a reply ran out the token budget:
    status MAX_CONTEXT_LIMIT_REACHED with fewer tokens in the stream than the budget (the reply
    that crossed it is not in the stream); its state is what the environment showed last."""
    steps = ta.RoomsEnv.LOG[(item.group_id, item.pair_index)]
    last = steps[-1] if steps else None
    outcome = (SUCCESS if last["success"] else FAILURE) if last and last["env_done"] else TRUNCATED
    states, rewards = [s["before"] for s in steps], [s["reward"] for s in steps]
    if (not (last and last["env_done"]) and item.traj["status"] == "MAX_CONTEXT_LIMIT_REACHED"
            and len(item.traj["conversation_tokens"]) < budget):
        states.append(last["after"] if last else ta.RoomsEnv.START)
        rewards.append(0.0)
    return states, rewards, outcome


def first_reply(item):
    return next((m["content"] for m in item.traj["conversation_text"] if m["role"] == "assistant"), "")


def reference_rows(items, width, lam=LAM, bonus_turn="first"):
    """Reference Gated-BEPO on one group from the environment's record, the reward_fns share
    on the first turn (the reply Tunix's reward functions score), laid on the mask's spans."""
    recs = [env_record(it) for it in items]
    K, T = len(items), max(1, max(len(r[0]) for r in recs))
    ids = {}
    obs = np.zeros((1, K, T, 2), np.uint32)
    reward, mask = np.zeros((1, K, T), np.float32), np.zeros((1, K, T), bool)
    outcome = np.zeros((1, K), np.int32)
    extra = ta.format_bonus(None, [first_reply(it) for it in items])
    for k, (states, rewards, out) in enumerate(recs):
        at = 0 if bonus_turn == "first" else len(states) - 1
        for t, (s, r) in enumerate(zip(states, rewards)):
            obs[0, k, t, 0] = ids.setdefault(s, len(ids) + 1)
            reward[0, k, t], mask[0, k, t] = r + (extra[k] if t == at else 0.0), True
        outcome[0, k] = out
    adv = ref.ref_gated_bepo((obs, reward, mask, outcome, np.zeros_like(reward)), **{**B_DEF, "lam": lam})["advantage"]
    if sum(len(r[0]) > 0 for r in recs) < 2:
        adv = np.zeros_like(adv)
    out = np.zeros((K, width), np.float32)
    for k, it in enumerate(items):
        replies = [m["content"] for m in it.traj["conversation_text"] if m["role"] == "assistant"]
        assert len(replies) == len(ta.RoomsEnv.LOG[(it.group_id, it.pair_index)])  # one reply per environment step
        spoken = [t for t, text in enumerate(replies) if text]  # an empty reply has no tokens, no span
        runs = mask_runs(np.asarray(it.traj["conversation_masks"])[:width])
        assert len(runs) <= len(spoken)  # (fewer where the stream was cut at L)
        for t, (a, b) in zip(spoken, runs):
            out[k, a:b] = adv[0, k, t]
    return out, recs


def by_group(items):
    groups = {}
    for i, it in enumerate(items):
        groups.setdefault(it.group_id, []).append(i)
    return list(groups.values())


# One worker runs this module (--dist loadgroup), so its module fixture is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("tunix")


@pytest.fixture(scope="module")
def trained():
    ta.RoomsEnv.LOG.clear()
    cluster = ta.make_cluster(micro_batch=2, steps=2)
    learner = ta.make_learner(cluster, "gated_bepo", estimator_config={"lam": LAM},
                              policy_loss_fn="bepo_jax_test_capture")
    before = jax.tree.map(jnp.copy, nnx.state(cluster.actor_trainer.model, nnx.Param))
    calls = []
    process = learner._process_results

    def spy(trajectories, mode, expected_step):
        res = process(trajectories, mode, expected_step)
        calls.append((trajectories, res[0]))
        return res

    learner._process_results = spy
    LOSS_SAW.clear()
    learner.train(ta.prompts(4, 2))
    learner.training_buckets = (learner.buckets.calls, learner.buckets.compiles_after_warmup, dict(learner.buckets.overflows))
    return cluster, learner, calls, before, list(LOSS_SAW)


def test_every_group_gets_the_reference_credit_from_the_environments_record(trained):
    cluster, learner, calls, _, _ = trained
    assert cluster.global_steps == 2 and len(calls) == 2
    assert all(len(trajs) == 8 and len(by_group(trajs)) == 2 for trajs, _ in calls)  # two groups per call
    outcomes, multi = set(), False
    for trajectories, ex in calls:
        adv = np.asarray(ex.advantages)
        assert adv.shape == np.asarray(ex.completion_ids).shape == (8, ta.L)
        assert np.abs(adv).max() > 0
        for rows in by_group(trajectories):
            want, recs = reference_rows([trajectories[i] for i in rows], ta.L)
            np.testing.assert_allclose(adv[rows], want, atol=1e-4)
            outcomes |= {r[2] for r in recs}
            multi |= any(len(set(r[0])) > 1 for r in recs)
        assert not adv[np.asarray(ex.completion_mask) == 0].any()  # environment tokens and padding get 0
    assert TRUNCATED in outcomes and multi  # step-limit / budget endings and multi-state trajectories were seen
    assert any(s["step_limit"] for steps in ta.RoomsEnv.LOG.values() for s in steps)  # the env's step limit cut


def test_the_policy_loss_receives_exactly_these_rows(trained):
    cluster, _, calls, before, loss_saw = trained
    sent = [row for _, ex in calls for row in np.asarray(ex.advantages)]
    got = [row for a, _ in loss_saw for row in np.atleast_2d(a)]
    assert len(got) == len(sent) and any(np.abs(r).max() > 0 for r in got)
    for row in got:  # Tunix may re-batch the rows
        assert any(np.allclose(row, s) for s in sent)
    after = nnx.state(cluster.actor_trainer.model, nnx.Param)
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), before, after))
    assert any(changed)


def test_per_group_diagnostics_reach_tunix_metrics_and_the_credit_log(trained):
    cluster, learner, calls, _, _ = trained
    log = cluster._rl_metrics_logger
    for name in ("states", "states_per_turn", "collapsed", "gated_share", "converged", "advantage/abs_mean",
                 "advantage/turn_spread", "outcome/truncated", "outcome/from_reward"):
        assert len(log.get_metric_history("bepo", name, "train")) >= 1, name
    assert not any(np.asarray(log.get_metric_history("bepo", "collapsed", "train")))  # tool turns are seen
    # the environment reports success in its info: no outcome fell back to the reward's sign
    assert not any(np.asarray(log.get_metric_history("bepo", "outcome/from_reward", "train")))
    assert len(learner.credit_log) == 4
    credit = learner.credit_log[0]
    assert credit.diagnostics["states"] >= 1 and "group" in credit.table()
    items = [it for it in calls[0][0] if it.group_id == credit.group_id]
    assert [env_record(it)[2] for it in items] == credit.outcomes


def test_tool_messages_and_silent_observations_are_states():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "task"},
            {"role": "assistant", "content": "call"}, {"role": "tool", "content": "Tool returned result: 3",
                                                       "tool_call_id": "a1b2"}]
    assert bt.conversation_state(msgs[:2], "task") == "system: S\nuser: task"
    assert bt.conversation_state(msgs, None) == "tool: Tool returned result: 3"  # the call id is not part of it
    two_tools = msgs + [{"role": "tool", "content": "x"}]
    assert bt.conversation_state(two_tools, None) == "tool: Tool returned result: 3\ntool: x"
    # an agent that rendered nothing for a dict observation: the observation itself
    assert bt.conversation_state(msgs[:3], {"b": 1, "a": [2]}) == 'observation: {"a": [2], "b": 1}'
    with pytest.raises(ValueError, match=r"state_fn must accept \(messages, observation\)"):
        bt_engine._check_state_fn(lambda messages: "")


def test_a_group_whose_turns_all_map_to_one_state_is_flagged(trained):
    _, learner, calls, _, _ = trained
    trajectories = copy.deepcopy(calls[0][0])
    for it in trajectories:  # what the old default (the last user message) captured for tool turns
        it.traj["bepo_turns"] = [t._replace(state="task") for t in it.traj["bepo_turns"]]
    credits = learner.step_credit(trajectories)
    assert any(c.collapsed for c in credits)
    assert all(c.diagnostics.get("states", 1) == 1 for c in credits)


def test_endings_and_outcome_rules(trained):
    cluster, learner, _, _, _ = trained
    E = bt.Ending
    cases = [(E("step_limit", {}, 5.0), TRUNCATED, False), (E("context_limit", {"success": True}, 1.0), TRUNCATED, False),
             (E("env", {"success": False}, 5.0), FAILURE, False),  # a positive reward is not a success
             (E("env", {"success": True}, -1.0), SUCCESS, False),  # nor a cost-style reward a failure
             (E("env", {}, 0.5), SUCCESS, True), (E("env", {}, 0.0), FAILURE, True)]
    for ending, code, fallback in cases:
        assert learner.outcome({"bepo_ending": ending}) == (code, fallback), ending
    hooked = ta.make_learner(cluster, learner={"outcome_fn": lambda traj: TRUNCATED})
    assert hooked.outcome({"bepo_ending": E("env", {"success": True}, 1.0)}) == (TRUNCATED, False)
    bad = ta.make_learner(cluster, learner={"outcome_fn": lambda traj: True})
    with pytest.raises(ValueError, match="outcome_fn returned True"):
        bad.outcome({})


def test_groups_are_told_apart_or_refused():
    def item(gid, traj_gid=None):
        return TrajectoryItem(pair_index=0, group_id=gid, start_step=0, traj={"group_id": traj_gid})

    assert bt.split_groups([item(7), item(3), item(7), item(3)], 2) == [[0, 2], [1, 3]]
    assert bt.split_groups([item(None, 1), item(None, 1), item(None, 2), item(None, 2)], 2) == [[0, 1], [2, 3]]
    assert bt.split_groups([item(None)] * 4, 2) == [[0, 1], [2, 3]]  # no ids: chunks of num_generations
    with pytest.raises(ValueError, match="not a multiple of num_generations=4"):
        bt.split_groups([item(None)] * 6, 4)
    with pytest.raises(ValueError, match="some trajectories carry a group id and others none"):
        bt.split_groups([item(1), item(None)], 2)


def _equal_total_group(trajectories):
    """One group's trajectories with every trajectory total 0 (Tunix would call the group
    degenerate) while the step rewards still differ: +0.5 then -0.5 on two-turn paths."""
    rows = by_group(trajectories)[0]
    items = copy.deepcopy([trajectories[i] for i in rows])
    for it in items:
        turns = it.traj["bepo_turns"]
        r = [0.5 * (-1) ** t for t in range(len(turns))]
        if len(turns) % 2:
            r[-1] = 0.0 if len(turns) == 1 else r[-1] - 0.5 * (-1) ** (len(turns) - 1)
        it.traj["bepo_turns"] = [t._replace(reward=x) for t, x in zip(turns, r)]
        it.traj["trajectory_reward"] = float(sum(r))
    return items


def test_rescued_groups_keep_their_sampler_importance_weights(trained):
    cluster, _, calls, _, _ = trained
    trajectories = max((c[0] for c in calls), key=lambda ts: max(len(t.traj["bepo_turns"]) for t in ts))
    items = _equal_total_group(trajectories)
    assert len({it.traj["trajectory_reward"] for it in items}) == 1
    with pytest.raises(ValueError, match="mask_zero_credit_groups"):
        bt.StepCreditConfig(num_generations=4, degenerate_group_masking=True)
    ours = ta.make_learner(cluster, reward_fns=(), sampler_is="token", mask_zero_credit_groups=True)
    ex = ours._process_results(items, rl_cluster_lib.Mode.TRAIN, 0)[0]
    on = np.asarray(ex.completion_mask) != 0
    assert on.any() and np.abs(np.asarray(ex.advantages)).max() > 0
    w = np.asarray(ex.sampler_is_weights)
    assert (w[on] > 0).all()  # the rescued group is trained, with its importance weights
    # Tunix's own degenerate masking on the same group: mask and weights zero (what the old adapter inherited)
    algo = agentic_grpo_learner.GRPOConfig(num_generations=4, max_response_length=ta.L, beta=0.0, max_concurrency=1,
                                           sampler_is="token", degenerate_group_masking=True)
    tunix_learner = agentic_grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo, chat_parser=ta.ChatParser())
    tex = tunix_learner._process_results(items, rl_cluster_lib.Mode.TRAIN, 0)[0]
    assert not np.asarray(tex.completion_mask).any() and not np.asarray(tex.sampler_is_weights).any()
    # a group with no step credit at all is dropped, weights with it
    flat = copy.deepcopy(items)
    for it in flat:
        it.traj["bepo_turns"] = [t._replace(state="same", reward=0.0) for t in it.traj["bepo_turns"]]
    fex = ours._process_results(flat, rl_cluster_lib.Mode.TRAIN, 0)[0]
    assert not np.asarray(fex.completion_mask).any() and not np.asarray(fex.sampler_is_weights).any()


def test_reward_fns_share_goes_on_the_turn_chosen(trained):
    cluster, learner, calls, _, _ = trained
    trajectories = calls[0][0]
    items = [trajectories[i] for i in by_group(trajectories)[0]]
    last = ta.make_learner(cluster, estimator_config={"lam": LAM}, reward_fns_turn="last")
    got = np.asarray(last._process_results(items, rl_cluster_lib.Mode.TRAIN, 0)[0].advantages)
    want_last, _ = reference_rows(items, ta.L, bonus_turn="last")
    np.testing.assert_allclose(got, want_last, atol=1e-4)
    # the trained learner (reward_fns_turn="first") saw the environment's rewards with the
    # bonus on the first turn, the reply Tunix's reward functions scored
    bonus_on_a_later_turn = False
    for credit in learner.credit_log:
        items = [it for trajs, _ in calls for it in trajs if it.group_id == credit.group_id]
        for it, seen in zip(items, credit.rewards):
            _, env_rewards, _ = env_record(it)
            bonus = ta.format_bonus(None, [first_reply(it)])[0]
            np.testing.assert_allclose(seen, [r + (bonus if t == 0 else 0.0) for t, r in enumerate(env_rewards)],
                                       atol=1e-6)
            bonus_on_a_later_turn |= bool(bonus) and len(env_rewards) > 1
    assert bonus_on_a_later_turn  # the old rule (the last turn) would have failed here


def test_switching_the_estimator_changes_the_update(trained):
    cluster, learner, calls, _, _ = trained
    trajectories, ex = max(calls, key=lambda g: np.abs(np.asarray(g[1].advantages)).sum())
    other = ta.make_learner(cluster, "grpo")
    ex2 = other._process_results(trajectories, rl_cluster_lib.Mode.TRAIN, 0)[0]
    assert not np.allclose(np.asarray(ex.advantages), np.asarray(ex2.advantages))
    loss = function_registry.get_policy_loss_fn("grpo")
    model = cluster.actor_trainer.model

    def grad(example):
        g = nnx.grad(lambda m: tunix_compat.loss_value(loss(m, example, algo_config=learner.algo_config, pad_id=0,
                                                            eos_id=2)))(model)
        return np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])

    assert np.linalg.norm(grad(ex) - grad(ex2)) > 1e-6


def test_config_and_learner_refuse_bad_input():
    with pytest.raises(ValueError, match="advantage_estimator='gated-bepo' is not a bepo_jax estimator"):
        bt.StepCreditConfig(num_generations=4, advantage_estimator="gated-bepo")
    with pytest.raises(ValueError, match="lamda"):
        bt.StepCreditConfig(num_generations=4, estimator_config={"lamda": 0.5})
    with pytest.raises(ValueError, match="reward_fns_turn='middle'"):
        bt.StepCreditConfig(num_generations=4, reward_fns_turn="middle")
    with pytest.raises(ValueError, match="StepCreditConfig.similarity"):
        bt.StepCreditConfig(num_generations=4, similarity={"treshold": 0.9})
    with pytest.raises(ValueError, match="must be a StepCreditConfig"):
        bt.StepCreditGRPOLearner(rl_cluster=None, algo_config=agentic_grpo_learner.GRPOConfig(num_generations=4))
    assert bt.StepCreditConfig(num_generations=2, advantage_estimator="bepo_jax/gigpo").step_estimator == "gigpo"
    with pytest.raises(ValueError, match="sequence packing"):
        ta.make_learner(ta.make_cluster(training={"max_seq_token_per_tpu": 256}))
    with pytest.raises(ValueError, match="serial_generate must be True or False"):
        ta.make_learner(ta.make_cluster(), learner={"serial_generate": "yes"})


def test_the_vanilla_engine_gets_fresh_sampling_keys_by_default(trained):
    cluster, _, calls, _, _ = trained
    assert getattr(cluster.rollout.generate, "bepo_fresh_seeds", False)
    # the four trajectories of a group, sampled from one prompt, are not all the same
    for trajectories, _ in calls:
        for rows in by_group(trajectories):
            streams = {tuple(np.asarray(trajectories[i].traj["conversation_tokens"]).tolist()) for i in rows}
            assert len(streams) > 1


def test_trajectory_level_registry_entries():
    names = bt.register_tunix_estimators()
    assert "bepo_jax/grpo" in names and "gated_bepo" in names and "grpo" not in names
    r = np.array([1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0], np.float32)
    ours = function_registry.get_advantage_estimator("bepo_jax/grpo")(rewards=r, num_generations=4)
    theirs = function_registry.get_advantage_estimator("grpo")(rewards=r, num_generations=4)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)  # same definition: unbiased std, eps 1e-6


def test_single_turn_grpo_learner_trains_with_a_registry_entry():
    """Tunix's single-turn GRPOLearner with "bepo_jax/gigpo": the loss receives the reference
    GiGPO of the rewards the reward function returned (each completion one step from the prompt)."""
    from tunix.rl.grpo import grpo_learner

    seen = []

    def reward(prompts, completions, **kwargs):
        r = [float(len(c.split()) % 3) for c in completions]
        seen.append(r)
        return r

    cluster = ta.make_cluster(steps=1)
    bt.fresh_sampling_seeds(cluster)
    algo = grpo_learner.GRPOConfig(num_generations=4, num_iterations=1, beta=0.0,
                                   advantage_estimator="bepo_jax/gigpo", policy_loss_fn="bepo_jax_test_capture")
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=reward)
    LOSS_SAW.clear()
    learner.train(ta.prompts(2, 2))
    assert cluster.global_steps == 1 and LOSS_SAW
    rewards = np.concatenate(seen).reshape(-1, 4)
    K = rewards.shape[1]
    batch = (np.zeros((len(rewards), K, 1, 2), np.uint32), rewards[:, :, None].astype(np.float32),
             np.ones((len(rewards), K, 1), bool), np.where(rewards > 0, SUCCESS, FAILURE).astype(np.int32),
             np.zeros((len(rewards), K, 1), np.float32))
    want = ref.ref_gigpo(batch, gamma=0.95, omega=1.0, norm="mean", weighting="step", std="unbiased",
                         eps=1e-6)[:, :, 0].reshape(-1)
    got = np.concatenate([np.ravel(a) for a, _ in LOSS_SAW])
    np.testing.assert_allclose(np.sort(got), np.sort(want), atol=1e-4)
    assert np.abs(got).max() > 0


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


@pytest.mark.slow
@pytest.mark.current_jax  # CI runs it on 3.12 (current JAX), not again on 3.11
def test_the_example_script_runs_and_prints_the_credit(capsys):
    assert ta.main(["--steps", "1", "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "groups credited with gated_bepo" in out and "gated share" in out and "bepo/states:" in out


@pytest.mark.parametrize("status", ["TIMEOUT", "MAX_STEPS_REACHED", "MAX_CONTEXT_LIMIT_REACHED", "SUCCEEDED"])
def test_a_limit_recorded_after_the_environment_ended_keeps_the_environments_ending(status):
    # the environment said done on its last step (a success); Tunix then records a limit: the ending stays "env"
    from types import SimpleNamespace

    from bepo_jax.integrations.tunix import StepCollectEngine

    eng = StepCollectEngine.__new__(StepCollectEngine)
    eng.agent = SimpleNamespace(trajectory=SimpleNamespace(status=SimpleNamespace(name=status)))
    eng._env_rec = SimpleNamespace(env_done=True, info={"success": True}, reward=1.0)
    assert eng._ending().kind == "env"
    eng._env_rec = SimpleNamespace(env_done=False, info={}, reward=0.0)
    assert eng._ending().kind == ("step_limit" if status == "SUCCEEDED" else
                                  {"TIMEOUT": "time_limit", "MAX_STEPS_REACHED": "step_limit",
                                   "MAX_CONTEXT_LIMIT_REACHED": "context_limit"}[status])


def test_evaluation_groups_are_marked_in_the_credit_log(trained):
    _, learner, calls, _, _ = trained
    assert {c.mode for c in learner.credit_log} == {"train"}
    kept = list(learner.credit_log)
    try:
        learner._process_results(calls[0][0], rl_cluster_lib.Mode.EVAL, None)
        new = list(learner.credit_log)[len(kept):]
        assert new and {c.mode for c in new} == {"eval"}
    finally:
        learner.credit_log.clear()
        learner.credit_log.extend(kept)


def test_metric_fns_see_the_step_credit_the_loss_uses(trained):
    _, learner, calls, _, _ = trained
    seen = []

    def metric_fn(prompts, completions, rewards, advantages, **kwargs):
        seen.append((np.asarray(advantages), np.asarray(kwargs["step_advantages"]), np.asarray(rewards)))
        return {"my/advantage_mean": (float(np.mean(advantages)), np.mean)}

    kept_fns, kept_log = learner.metric_fns, list(learner.credit_log)
    learner.metric_fns = [learner._deferred(metric_fn)]
    try:
        (ex,) = learner._process_results(calls[0][0], rl_cluster_lib.Mode.TRAIN, None)
    finally:
        learner.metric_fns = kept_fns
        learner.credit_log.clear()
        learner.credit_log.extend(kept_log)
    (per_seq, per_token, rewards), = seen
    adv, mask = np.asarray(ex.advantages), np.asarray(ex.completion_mask)
    np.testing.assert_array_equal(per_token, adv)  # exactly what the loss gets
    on = mask != 0
    np.testing.assert_allclose(per_seq, (adv * on).sum(-1) / np.maximum(on.sum(-1), 1), rtol=1e-6)
    assert per_seq.shape == rewards.shape  # the shape Tunix passes


def test_a_batch_tunix_did_not_score_with_reward_fns_is_said_and_counted(trained, caplog):
    # a Tunix path that builds the batch without our _compute_rewards hook: the reward_fns share cannot be
    # in the step credit; the learner says so once and counts the batch, instead of dropping it silently
    cluster, learner, calls, _, _ = trained
    hist = cluster._rl_metrics_logger.get_metric_history("bepo", "reward_fns_unscored", "train")
    assert len(hist) >= 1 and not np.asarray(hist).any()  # the training batches were scored
    kept, buffered = list(learner.credit_log), []
    engine = learner._engine
    learner._compute_rewards = lambda *a, **k: agentic_grpo_learner.GRPOLearner._compute_rewards(learner, *a, **k)
    engine.buffer_metrics_async = lambda metrics, **k: buffered.append(metrics)
    try:
        with caplog.at_level("WARNING"):
            learner._process_results(calls[0][0], rl_cluster_lib.Mode.TRAIN, None)
    finally:
        del learner._compute_rewards, engine.buffer_metrics_async
        learner.credit_log.clear()
        learner.credit_log.extend(kept)
    assert "reward_fns share of the reward is not in the step credit" in caplog.text
    assert [m["bepo/reward_fns_unscored"][0] for m in buffered if "bepo/reward_fns_unscored" in m] == [1.0]


def _play(replies, budget, group_id=7):
    """One episode per reply list through StepCollectEngine with a stand-in model: reply t of
    episode k is ``replies[k][t]`` (text, token count); the rest as the learner builds it."""
    import asyncio

    from tunix.generate import tokenizer_adapter
    from tunix.rl.rollout import base_rollout
    from tunix.tests import test_common

    vocab = test_common.MockVocab(mapping_text_to_id={w: i for i, w in enumerate(ta.WORDS)})
    out = []
    for k, script in enumerate(replies):
        calls = iter(script)

        def model_call(messages, env, max_generation_steps=None, **kw):
            text, n = next(calls)
            n = min(n, max_generation_steps)  # the sampler stops at the remaining budget
            return base_rollout.RolloutOutput(text=[text], logits=[None], tokens=[np.arange(n) % 3],
                                              left_padded_prompt_tokens=None, logprobs=None)

        env = ta.RoomsEnv({}, max_steps=3, group_id=group_id, pair_index=k)
        eng = bt.StepCollectEngine(ta.ToolObservationAgent(system_prompt=""), env, model_call=model_call,
                                   max_response_length=budget, tokenizer=tokenizer_adapter.TokenizerAdapter(vocab),
                                   chat_parser=ta.ChatParser())
        out.append(TrajectoryItem(pair_index=k, group_id=group_id, start_step=0,
                                  traj=asyncio.run(eng.collect("Token")), metadata={}))
    return out


def test_an_episode_whose_first_reply_exhausts_the_token_budget_stays_in_its_group(trained):
    # episodes 0 and 1 reply "right right" twice (room 4: success); 2 and 3 reply with more tokens than the
    # budget at once: Tunix ends them before any Step. They are failures of the group, not absent from it.
    ta.RoomsEnv.LOG.clear()
    items = _play([[("right", 2), ("right", 2)]] * 2 + [[("right", 50)]] * 2, budget=20)
    assert [len(it.traj["bepo_turns"]) for it in items] == [2, 2, 1, 1]
    assert [it.traj["bepo_ending"].kind for it in items] == ["env", "env", "context_limit", "context_limit"]
    # each turn carries its parsed action's text (ECPO's action key); the cut turn has none ("")
    assert all("right" in t.action for it in items[:2] for t in it.traj["bepo_turns"])
    assert [t.action for it in items[2:] for t in it.traj["bepo_turns"]] == ["", ""]
    assert not ta.RoomsEnv.LOG[(7, 2)] and not ta.RoomsEnv.LOG[(7, 3)]  # the environment never stepped them
    _, learner, *_ = trained
    (credit,) = learner.step_credit(items, [[0, 1, 2, 3]])
    assert credit.outcomes == [SUCCESS, SUCCESS, TRUNCATED, TRUNCATED]
    # the reference: Gated-BEPO on the environment's own record, the cut episodes as one decision at the
    # observation the environment had shown at reset
    start = ta.RoomsEnv.START
    states = [[s["before"] for s in ta.RoomsEnv.LOG[(7, k)]] for k in (0, 1)] + [[start], [start]]
    rewards = [[s["reward"] for s in ta.RoomsEnv.LOG[(7, k)]] for k in (0, 1)] + [[0.0], [0.0]]
    ids, T = {}, 2
    obs = np.zeros((1, 4, T, 2), np.uint32)
    reward, mask = np.zeros((1, 4, T), np.float32), np.zeros((1, 4, T), bool)
    for k in range(4):
        for t, (s, r) in enumerate(zip(states[k], rewards[k])):
            obs[0, k, t, 0], reward[0, k, t], mask[0, k, t] = ids.setdefault(s, len(ids) + 1), r, True
    outcome = np.array([[SUCCESS, SUCCESS, TRUNCATED, TRUNCATED]], np.int32)
    expect = ref.ref_gated_bepo((obs, reward, mask, outcome, np.zeros_like(reward)), **{**B_DEF, "lam": LAM})["advantage"][0]
    for k in range(4):
        np.testing.assert_allclose(credit.advantages[k], expect[k, : len(states[k])], atol=1e-5)
    assert credit.advantages[0][0] > 0 and credit.advantages[2][0] < 0
    # the cut reply has no tokens in the stream: nothing is laid on them
    assert len(items[2].traj["conversation_tokens"]) == 0


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from tests.agent.conftest import write_tiny_chat_model

    return write_tiny_chat_model(tmp_path_factory.mktemp("tunix_ckpt") / "model")


@pytest.mark.parametrize("agent", ["model", "tool"])
def test_the_example_trains_a_checkpoint_through_tunix_with_its_tokenizer_and_template(tiny_checkpoint, agent,
                                                                                        capsys):
    # a random Llama in the Hugging Face layout with SmolLM2's real tokenizer and chat template, loaded by
    # bepo_jax, placed into Tunix's Qwen2 class; Tunix's ModelAgent or its ToolAgent
    assert ta.main(["--steps", "1", "--model", str(tiny_checkpoint), "--agent", agent]) == 0
    out = capsys.readouterr().out
    assert "1 training steps, 2 groups credited with gated_bepo" in out
    # a random model never ends its reply: every episode's first reply exhausts the token budget, and each
    # stays in its group as a truncated episode (8 of them) instead of vanishing
    assert out.count("TRUNCATED (context_limit)") == 8
    assert "bepo/outcome/truncated: 1.000" in out


def test_tunix_tool_agent_drives_the_rooms_and_reads_tool_outputs():
    from tunix.rl.agentic.agents.tool_agent import ToolAgent

    agent = ToolAgent(system_prompt=ta.SYSTEM, tool_map={"move": ta.MoveTool}, tool_parser_name="qwen")
    assert '"name": "move"' in agent.chat_completions[0]["content"]  # the tool's schema is in the system prompt
    env = ta.RoomsEnv({}, max_steps=3, group_id=5, pair_index=0)
    obs, _ = env.reset()
    agent.update_from_env(obs, 0.0, False, {})
    replies = ['<tool_call>\n{"name": "move", "arguments": {"direction": "right"}}\n</tool_call>', "I go right."]
    for reply in replies:  # a parsed tool call, then a reply without one (Tunix's "finish" fallback)
        action = agent.update_from_model(reply).action
        obs, reward, done, info = env.step(action)
        agent.update_from_env(obs, reward, done, info)
    log = ta.RoomsEnv.LOG[(5, 0)]
    assert [s["before"] for s in log] == ["task reach room 4 you are in room 2", "you are in room 3"]
    assert log[-1]["success"] and done and info == {"success": True}
    # the environment's answer came back as a tool output, which the state reads without its call id
    assert agent.chat_completions[-1]["role"] == "tool"
    assert bt.conversation_state(agent.chat_completions, obs) == "tool: Tool returned result: you are in room 4"


def _first_step_streams(concurrency):
    """The token streams of one training step's trajectories, by (group, trajectory)."""
    ta.RoomsEnv.LOG.clear()
    cluster = ta.make_cluster(micro_batch=2, steps=1)
    learner = ta.make_learner(cluster, "gated_bepo", max_concurrency=concurrency)
    seen = {}
    process = learner._process_results

    def spy(trajectories, mode, expected_step):
        for it in trajectories:
            seen[(it.group_id, it.pair_index)] = tuple(np.asarray(it.traj["conversation_tokens"]).tolist())
        return process(trajectories, mode, expected_step)

    learner._process_results = spy
    learner.train(ta.prompts(2, 2))
    return seen


def test_sampling_keys_follow_group_trajectory_and_turn_not_thread_order():
    one, four = _first_step_streams(1), _first_step_streams(4)
    assert len(one) == 8 and one == four  # the same tokens for each (group, trajectory), whatever the concurrency
    assert len(set(one.values())) > 1


def _model_calls_at_once(serial_generate):
    """The most model calls that were inside the vanilla engine at one time during one training
    step with 4 threads, counted where the learner's calls reach the engine. The engine itself is
    entered one call at a time either way (the spy's own lock: concurrent first calls crash JAX 0.12)."""
    import threading
    import time

    ta.RoomsEnv.LOG.clear()
    cluster = ta.make_cluster(micro_batch=2, steps=1)
    generate, counter, engine = cluster.rollout.generate, threading.Lock(), threading.Lock()
    now, most = [0], [0]

    def spy(*args, **kwargs):
        with counter:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            time.sleep(0.05)  # long enough for another thread's call to arrive, if the learner lets it
            with engine:
                return generate(*args, **kwargs)
        finally:
            with counter:
                now[0] -= 1

    cluster.rollout.generate = spy
    learner = ta.make_learner(cluster, "gated_bepo", max_concurrency=4,
                              learner={"serial_generate": serial_generate, "sampling_seed": None})
    learner.train(ta.prompts(2, 2))
    assert cluster.global_steps == 1
    return most[0]


def test_the_vanilla_engine_gets_one_model_call_at_a_time():
    assert _model_calls_at_once(serial_generate=True) == 1
    assert _model_calls_at_once(serial_generate=False) > 1  # the control: Tunix's threads do call at once


def test_serial_model_calls_is_idempotent_and_keeps_the_fresh_keys():
    from types import SimpleNamespace

    seen = []
    cluster = SimpleNamespace(rollout=SimpleNamespace(generate=lambda prompts, config: seen.append(config.seed)))
    bt.fresh_sampling_seeds(cluster, 7)
    bt.serial_model_calls(cluster)
    wrapped = cluster.rollout.generate
    bt.serial_model_calls(cluster)
    bt.fresh_sampling_seeds(cluster, 7)  # already fresh: not wrapped again
    assert cluster.rollout.generate is wrapped
    from tunix.rl.rollout import base_rollout

    cluster.rollout.generate(["go"], base_rollout.RolloutConfig())
    cluster.rollout.generate(["go"], base_rollout.RolloutConfig())
    # the i-th call outside a collect engine samples with fold_in(PRNGKey(seed), i)
    want = [jax.random.fold_in(jax.random.PRNGKey(7), i) for i in (1, 2)]
    np.testing.assert_array_equal(np.asarray(seen), np.asarray(want))
    # the other order: each wrapper still seen inside the other
    other = SimpleNamespace(rollout=SimpleNamespace(generate=lambda prompts, config: None))
    bt.serial_model_calls(other)
    bt.fresh_sampling_seeds(other, 7)
    wrapped = other.rollout.generate
    bt.serial_model_calls(other)
    assert other.rollout.generate is wrapped


def test_the_loss_is_read_from_either_tunix_form():
    from types import SimpleNamespace

    assert tunix_compat.loss_value((3.0, {"aux": 1})) == 3.0  # Tunix 0.1.7: (loss, aux)
    weighted = SimpleNamespace(unreduced_sum=6.0, compute=lambda: 1.5)  # main: LossOutput(primary_loss=WeightedMetric)
    assert tunix_compat.loss_value(SimpleNamespace(primary_loss=weighted, aux_metrics={})) == 1.5
    assert tunix_compat.loss_value(SimpleNamespace(primary_loss=2.5, aux_metrics={})) == 2.5


def test_a_bucket_overflow_is_counted_and_said_with_a_hint(trained, caplog):
    import logging

    _, learner, calls, _, _ = trained
    calls_made, compiled, overflowed = learner.training_buckets
    assert calls_made >= 2 and compiled == 0 and not overflowed  # training stayed in its buckets
    compiled, state_overflows = learner.buckets.compiles_after_warmup, learner.buckets.overflows["state_words"]
    trajectories = [copy.copy(it) for it in calls[0][0]]
    for it in trajectories:  # the same turns with 20,000-character states (a width nothing else in the process hashes)
        it.traj = dict(it.traj, bepo_turns=[t._replace(state=t.state + " " + "x" * 20_000)
                                            for t in it.traj["bepo_turns"]])
    with caplog.at_level(logging.WARNING):
        learner.step_credit(trajectories)
    assert set(learner.buckets.last) == {"state_words"}
    assert learner.buckets.overflows["state_words"] == state_overflows + 1
    assert learner.buckets.compiles_after_warmup > compiled  # the state hashing compiled again
    assert "state_words reached" in caplog.text and "state_fn" in caplog.text
    learner.step_credit(trajectories)  # the same widths again: no new overflow
    assert not learner.buckets.last and learner.buckets.overflows["state_words"] == state_overflows + 1
