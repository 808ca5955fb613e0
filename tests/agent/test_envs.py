"""The environment interface: Jumanji Maze (adapter), TextWorld (host), the host loop vs the jitted loop."""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bepo_jax as bj
from bepo_jax.agent.envs import sokoban as sk
from bepo_jax.agent.envs.base import env_reset, env_step
from bepo_jax.agent.envs.text import encode
from bepo_jax.agent.rollouts.host import JaxEnvOnHost, make_host_rollout
from bepo_jax.agent.rollouts.jitted import RolloutConfig, make_rollout, prompt_length
from bepo_jax.agent.train import RunConfig, Setup

from tests.agent.test_rollout import ScriptedLM, _words


def _maze_path(grid):
    """BFS on a rendered maze grid (0 wall, 2 target, 3 agent): the shortest action list
    (0 up, 1 right, 2 down, 3 left)."""
    g = np.asarray(grid)
    start = tuple(np.argwhere(g == 3)[0])
    goal = tuple(np.argwhere(g == 2)[0])
    moves = [(-1, 0), (0, 1), (1, 0), (0, -1)]
    prev = {start: None}
    q = collections.deque([start])
    while q:
        p = q.popleft()
        for a, (dr, dc) in enumerate(moves):
            n = (p[0] + dr, p[1] + dc)
            if 0 <= n[0] < g.shape[0] and 0 <= n[1] < g.shape[1] and g[n] != 0 and n not in prev:
                prev[n] = (p, a)
                q.append(n)
    path, p = [], goal
    while prev[p] is not None:
        p, a = prev[p]
        path.append(a)
    return path[::-1]


def test_jumanji_maze_adapter_steps_like_the_maze():
    from bepo_jax.agent.envs.jumanji_env import maze

    env = maze(5, 5, max_steps=30)
    tasks = env.sample_tasks(4, 0)
    for i in range(4):
        s = env_reset(env, tasks[i])
        text = bj.agent.envs.base.render_tokens_text(env.render(s.inner))
        assert text.count("P") == 1 and text.count("O") == 1 and len(text) == 5 * 6
        path = _maze_path(env.observation(s.inner))
        assert path, "the target is reachable"
        total = 0.0
        for a in path:
            assert not bool(s.done)
            s, r, valid = env_step(env, s, jnp.int32(a))
            total += float(r)
        assert bool(s.success) and bool(s.done) and total == 1.0 and int(s.t) == len(path)
    # invalid action: a no-op that spends a step
    s = env_reset(env, tasks[0])
    s2, r, valid = env_step(env, s, jnp.int32(-1))
    assert int(s2.t) == 1 and float(r) == 0.0 and bool(valid)
    np.testing.assert_array_equal(env.observation(s2.inner), env.observation(s.inner))


def _tiny(env, **kw):
    return RunConfig(env=env, iterations=1, groups=2, group_size=2, width=16, heads=2, eval_tasks=2, task_pool=2,
                     max_steps=3, **kw)


def test_the_advantage_drives_the_update(tmp_path):
    """With the entropy bonus off, zero advantages leave the parameters exactly where they
    were and nonzero ones move them (so "parameters moved" below is evidence of credit)."""
    from bepo_jax.agent.rl.train_step import UpdateBatch

    setup = Setup(_tiny("sokoban", entropy_coef=0.0), cache_dir=tmp_path / "games")
    state = setup.trainer.init_state()
    tasks = jax.tree_util.tree_map(jnp.asarray, setup.train_tasks)
    ro = jax.jit(setup.rollout)(state.params, tasks, jax.random.PRNGKey(3))
    L = ro.tokens.shape[-1]
    flat = lambda x: x.reshape(-1, L)
    rng = np.random.default_rng(0)
    adv = np.where(np.asarray(ro.response_mask), rng.normal(size=ro.response_mask.shape), 0.0).astype(np.float32)
    update = jax.jit(setup.trainer.update_fn)
    moved = {}
    for name, a in (("zero", np.zeros_like(adv)), ("credit", adv)):
        new, m = update(state, UpdateBatch(flat(ro.tokens), flat(ro.mask), flat(ro.response_mask), flat(ro.old_logp),
                                           flat(jnp.asarray(a))))
        diff = jax.tree_util.tree_map(lambda x, y: float(np.abs(np.asarray(x) - np.asarray(y)).max()),
                                      state.params, new.params)
        moved[name] = max(jax.tree_util.tree_leaves(diff))
    assert moved["zero"] == 0.0 and moved["credit"] > 1e-4


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
@pytest.mark.parametrize("env", ["sokoban", "maze", "textworld"])
def test_end_to_end_rollout_advantages_update(env, tmp_path):
    """Each environment through rollout, Gated-BEPO advantages and one update."""
    setup = Setup(_tiny(env), cache_dir=tmp_path / "games")
    state = setup.trainer.init_state()
    before = jax.tree_util.tree_map(np.asarray, state.params)
    state, m = setup.iterate(state, 1)
    after = jax.tree_util.tree_map(np.asarray, state.params)
    changed = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)), before, after))
    assert any(changed) == (m["step_advantage_abs_max"] > 0), "parameters move iff there is credit (entropy off)"
    assert all(np.isfinite(v) for v in m.values())
    assert m["env_steps"] > 0 and 0.0 <= m["success_rate"] <= 1.0
    assert m["invalid_rate"] == 0.0  # constrained decoding: every response is a valid action
    # the update scores from the prompt's last position: no response token sits before it
    assert setup.trainer.config.score_from > 0 and m["unscored_response_tokens"] == 0.0
    if env != "textworld":  # the sampled actions' shares and entropy (nats) against a count of the rollout
        ro = jax.jit(setup.rollout_fn)(state, jax.tree_util.tree_map(jnp.asarray, setup.train_tasks),
                                       setup.iteration_key(2))
        _, m2 = setup.learn_from(state, ro, setup.advantages(ro.batch))
        acts = np.asarray(ro.actions)[np.asarray(ro.batch.mask)]
        share = np.array([np.mean(acts == a) for a in range(len(setup.env.action_words))])
        got = np.array([float(m2[f"actions/share_{w}"]) for w in setup.env.action_words])
        np.testing.assert_allclose(got, share, atol=1e-6)
        nz = share[share > 0]
        np.testing.assert_allclose(float(m2["actions/entropy"]), -np.sum(nz * np.log(nz)), atol=1e-5)
    ev = setup.evaluate(state.params)
    assert 0.0 <= ev["success_rate"] <= 1.0 and ev["tasks"] == 2


def test_textworld_env_wins_with_the_walkthrough(tmp_path):
    textworld = pytest.importorskip("textworld")
    from bepo_jax.agent.envs.textworld_env import TextWorldEnv, generate_games

    (path,) = generate_games(1, tmp_path, seed=3)
    assert generate_games(1, tmp_path, seed=3) == [path]  # reused, not regenerated
    infos = textworld.EnvInfos(policy_commands=True)
    ref = textworld.start(str(path), request_infos=infos)
    walkthrough = ref.reset().policy_commands
    ref.close()
    env = TextWorldEnv(command_chars=40, max_commands=64)
    obs, cmds = env.reset(path)
    assert env.objective and obs and all(c == c.lower() for c in cmds)
    encode(obs), encode(env.objective)  # in the tokenizer's alphabet
    won = False
    for c in walkthrough:
        assert c.lower() in cmds, (c, cmds)
        obs, r, done, won, cmds = env.step(c.lower())
    assert won and done and r == 1.0
    env.close()


def test_an_evaluation_plays_eval_episodes_per_task_not_the_group_size():
    """eval_episodes K' plays K' episodes of each held-out task: the evaluation equals a plain rollout of
    the same tasks with K' samples per task and the evaluation's key; 0 keeps the group size."""
    setup = Setup(_tiny("sokoban", eval_episodes=3), cache_dir=None)
    params = setup.trainer.init_state().params
    ev = setup.evaluate(params, seed=5)
    ro = jax.jit(make_rollout(setup.model, setup.env, dataclasses.replace(setup.rollout_cfg, group_size=3)))(
        params, jax.tree_util.tree_map(jnp.asarray, setup.eval_pool), jax.random.PRNGKey(5))
    success = np.asarray(ro.success, np.float64)
    assert success.shape == (2, 3)
    assert ev["per_task"] == pytest.approx(list(success.mean(1))) and ev["success_rate"] == pytest.approx(success.mean())
    assert setup.rollout_for(0) is setup.rollout and setup.rollout_for(2) is setup.rollout  # the group size: the run's own
    with pytest.raises(ValueError, match="eval_episodes"):
        RunConfig(eval_episodes=-1)


@pytest.mark.slow  # long (tens of seconds on 2 cores): make test skips it, CI=1 runs it
def test_textworld_evaluates_the_held_out_games_it_is_asked_for(tmp_path):
    """eval_tasks and evaluate(n_tasks=) reach TextWorld (its held-out games once stopped at 8
    whatever was asked): a larger evaluation extends the run's held-out games, disjoint from
    the training games; the training-task evaluation covers at most the pool."""
    pytest.importorskip("textworld")
    setup = Setup(_tiny("textworld").replace(eval_tasks=3), cache_dir=tmp_path / "games")
    assert len(setup.eval_pool) == 3 and not set(setup.eval_pool) & set(setup.train_tasks)
    params = setup.trainer.init_state().params
    more = setup.evaluate(params, n_tasks=4)
    assert more["tasks"] == 4 and len(more["per_task"]) == 4
    assert setup.held_out_tasks(4)[:3] == setup.eval_pool
    assert setup.evaluate(params)["tasks"] == 3
    assert setup.evaluate(params, n_tasks=4, training=True)["tasks"] == 2  # task_pool=2


@pytest.mark.parametrize("constrained", [False, True])
def test_host_loop_equals_jitted_loop_for_a_fixed_policy(constrained):
    """The host-driven loop (JaxEnvOnHost) and the jitted rollout give the same episodes
    under a deterministic policy: actions, rewards, outcomes, tokens, key equality (with
    constrained decoding: static forced positions vs the host's per-row skip)."""
    env = sk.SokobanEnv(sk.SokobanConfig(max_steps=4))
    cfg = RolloutConfig(group_size=2, constrained=constrained)
    P = prompt_length(env.obs_len, cfg.prompt_history, 5)
    model = ScriptedLM(P + cfg.max_response, P, _words("left"))
    params = nnx.state(model, nnx.Param)
    levels = env.sample_tasks(3, 5)
    a = jax.jit(make_rollout(model, env, cfg))(params, levels, jax.random.PRNGKey(0))
    host = make_host_rollout(model, lambda: JaxEnvOnHost(env), cfg, max_steps=4, obs_len=env.obs_len,
                             word_width=5, max_commands=4)
    b = host(params, [sk.level_at(levels, i) for i in range(3)], jax.random.PRNGKey(1))
    for f in ("reward", "mask", "outcome", "penalty"):
        np.testing.assert_array_equal(np.asarray(getattr(a.batch, f)), np.asarray(getattr(b.batch, f)), err_msg=f)
    np.testing.assert_array_equal(np.asarray(a.actions), np.asarray(b.actions))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.response_mask), np.asarray(b.response_mask))
    np.testing.assert_allclose(np.asarray(a.old_logp), np.asarray(b.old_logp), atol=1e-5)
    ka, kb = np.asarray(a.batch.obs_key), np.asarray(b.batch.obs_key)
    m = np.asarray(a.batch.mask)
    for g in range(3):
        ia = [tuple(k) for k in ka[g][m[g]]]
        ib = [tuple(k) for k in kb[g][m[g]]]
        same_a = np.array([[x == y for y in ia] for x in ia])
        same_b = np.array([[x == y for y in ib] for x in ib])
        np.testing.assert_array_equal(same_a, same_b)


@pytest.mark.slow  # TextWorld games are generated (tens of seconds): make test skips it, CI=1 runs it
def test_proxmo_in_the_host_loop_reads_the_texts_the_state_keys_were_hashed_from(tmp_path):
    """The character policy's TextWorld loop keeps each state's text (``rollout.state_texts``): its hash is
    the record's state key, and ProxMO's kernel inputs are that text's TF-IDF (``Setup.credit_inputs``:
    with random returns on the rollout's records, the row loop from the authors' code over the same texts
    gives the same advantages); one iteration runs."""
    from bepo_jax.credit.hashing import hash_observations
    from bepo_jax.credit.reference import ref_proxmo
    from tests.helpers import reference_batch

    setup = Setup(_tiny("textworld", estimator="proxmo", constrained=False), cache_dir=tmp_path / "games")
    state = setup.trainer.init_state()
    ro = setup.rollout(state.params, setup.train_tasks[:2], jax.random.key(0))
    texts, mask = setup.rollout.state_texts, np.asarray(ro.batch.mask)
    keys = hash_observations([str(x) for x in texts[mask]])
    np.testing.assert_array_equal(np.asarray(ro.batch.obs_key)[mask], np.asarray(keys))
    assert all(str(x) == "" for x in texts[~mask])
    rng = np.random.default_rng(0)  # random returns on the rollout's records: the kernel's grouping decides
    b = dataclasses.replace(ro.batch, reward=np.where(mask, rng.normal(size=mask.shape), 0.0).astype(np.float32))
    lists = [[[str(x) for x in texts[g, k][mask[g, k]]] for k in range(mask.shape[1])] for g in range(mask.shape[0])]
    want = ref_proxmo(reference_batch(b), lists)
    assert np.abs(want).max() > 0.01
    np.testing.assert_allclose(np.asarray(setup.advantages(b, setup.credit_inputs(ro)).advantage), want, rtol=3e-4,
                               atol=1e-5)
    _, m = setup.iterate(state, 1)
    assert all(np.isfinite(v) for v in m.values())


def test_a_renamed_copy_of_a_game_has_its_structure_not_its_signature(tmp_path):
    """Seeds 8 and 17 of the 2-room, 3-object, quest-length-1 set generate the same world and quest with
    other names ("lock locker with key" / "lock safe with passkey"); the game's own .json says so."""
    pytest.importorskip("textworld")
    import json

    from bepo_jax.agent.envs.textworld_env import game_signature, game_structure, generate_games

    a, b, c = (generate_games(1, tmp_path, seed=s)[0] for s in (8, 17, 0))
    da, db = (json.loads(p.with_suffix(".json").read_text()) for p in (a, b))
    assert da["world"] == db["world"] and da["quests"][0]["commands"] != db["quests"][0]["commands"]
    assert game_signature(a) != game_signature(b) and game_structure(a) == game_structure(b)
    assert game_structure(a) != game_structure(c)
    # names only: the same file with one entity renamed keeps its structure; a changed fact does not
    d = json.loads(a.with_suffix(".json").read_text())
    renamed, changed = tmp_path / "renamed", tmp_path / "changed"
    for k, v in (d["infos"].items() if isinstance(d["infos"], dict) else d["infos"]):
        if isinstance(v, dict) and v.get("name") == "key":
            v["name"] = "brass key"
            d["quests"][0]["commands"] = [cmd.replace("key", "brass key") for cmd in d["quests"][0]["commands"]]
    renamed.with_suffix(".json").write_text(json.dumps(d))
    assert game_structure(renamed) == game_structure(a) and game_signature(renamed) != game_signature(a)
    d["world"] = d["world"][1:]
    changed.with_suffix(".json").write_text(json.dumps(d))
    assert game_structure(changed) != game_structure(a)


def test_structural_held_out_games_skip_a_renamed_copy_of_a_training_game(tmp_path):
    """Seed 8's game is among the training games (seeds 0-8) and the held-out sequence starts at seed 17,
    its renamed copy: a run's default pools ("structural") skip it, a run recorded with content-disjoint
    pools ("disjoint") or plain ones ("seeded") keeps the games it was scored on."""
    pytest.importorskip("textworld")
    from bepo_jax.agent.envs.textworld_env import TextWorldRun, game_structure, generate_games
    from bepo_jax.agent.train import RunConfig

    cfg = RunConfig(env="textworld", task_pool=9, seed=0)
    copy = generate_games(1, tmp_path, seed=17)[0]
    run = lambda kind: TextWorldRun(cfg, tmp_path, eval_seed_offset=17, **({"held_out": kind} if kind else {}))
    assert game_structure(copy) in {game_structure(p) for p in run(None).train_tasks}
    structural = run(None).held_out(2)
    assert str(copy) not in structural and structural == run("structural").held_out(2)
    assert not {game_structure(p) for p in structural} & {game_structure(p) for p in run(None).train_tasks}
    assert run("disjoint").held_out(2)[0] == str(copy) and run("seeded").held_out(2)[0] == str(copy)
    with pytest.raises(ValueError, match="held-out games 'renamed'.*structural, disjoint, seeded"):
        run("renamed")
