"""The verl / verl-agent drop-in (bepo_jax.integrations.verl): GiGPO against verl-agent's
gigpo/core_gigpo.py functions rewritten as plain loops over rows (float64, dicts; the file itself is
run unchanged by experiments/verl_official.py), every other estimator against the same rows built
trajectory by trajectory (batch_from_trajectories), the step-order refusals, torch in and out, JAX
kept on the CPU in a torch process, and verl's registry through a stand-in of its two functions."""

import difflib
import math
import os
import subprocess
import sys
import types
from collections import defaultdict

import numpy as np
import pytest

import bepo_jax as bj
from bepo_jax import FAILURE, SUCCESS
from bepo_jax.integrations.verl import compute_step_advantage


def verl_agent_gigpo(scores, step_returns, anchor_obs, uid, *, mean_std, eps=1e-6, w=1.0, similarity=None):
    """verl-agent's episode_norm_reward (compute_mean_std_cross_steps=True), build_step_group and
    step_norm_reward, as loops over rows."""
    def norm(keys, vals, singleton_mean):
        by = defaultdict(list)
        for k, v in zip(keys, vals):
            by[k].append(v)
        out = []
        for k, v in zip(keys, vals):
            xs = by[k]
            if len(xs) == 1:
                mu, sd = (0.0 if singleton_mean == "zero" else xs[0]), 1.0
            else:
                mu = sum(xs) / len(xs)
                sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))
            out.append((v - mu) / (sd + eps) if mean_std else v - mu)
        return np.array(out)

    if similarity is None:
        groups = [(u, o) for u, o in zip(uid, anchor_obs)]
    else:
        groups, clusters = [None] * len(uid), defaultdict(list)
        for i, (u, o) in enumerate(zip(uid, anchor_obs)):
            for j, rep in enumerate(clusters[u]):
                if difflib.SequenceMatcher(None, o, rep).ratio() >= similarity:
                    groups[i] = (u, j)
                    break
            else:
                clusters[u].append(o)
                groups[i] = (u, len(clusters[u]) - 1)
    return norm(list(uid), list(scores), "zero") + w * norm(groups, list(step_returns), "self")


def random_rows(seed, n_groups=40, texts=False):
    """verl-agent-like rows: groups of 1-8 trajectories of 1-12 steps, observations from a few symbols
    (states repeat), success pays 10 at the end, shuffled."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(n_groups):
        for k in range(int(rng.integers(1, 9))):
            L = int(rng.integers(1, 13))
            won = bool(rng.random() < 0.4)
            for t in range(L):
                obs = f"room {rng.integers(0, 4)}" + (" with a long shared description" * 3 + "x" * int(rng.integers(0, 3))
                                                      if texts else "")
                rows.append(dict(uid=f"u{g}", traj=f"u{g}/t{k}", step=t, obs=obs, reward=10.0 * won if t == L - 1 else 0.0,
                                 won=won, L=L))
    return rows


def returns_of(rows, gamma):
    G = np.zeros(len(rows))
    by = defaultdict(list)
    for i, r in enumerate(rows):
        by[r["traj"]].append(i)
    for ids in by.values():
        acc = 0.0
        for i in sorted(ids, key=lambda i: rows[i]["step"], reverse=True):
            acc = rows[i]["reward"] + gamma * acc
            G[i] = acc
    return G


def columns(rows, L=3):
    n = len(rows)
    score = np.array([10.0 * r["won"] for r in rows], np.float32)
    tlr = np.zeros((n, L), np.float32)
    tlr[:, -1] = score
    mask = np.ones((n, L), np.float32)
    mask[::3, 0] = 0  # responses of unequal length
    return tlr, mask, score


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_gigpo_equals_verl_agent_on_10k_shuffled_rows(mode):
    rows = random_rows(0, n_groups=340)
    trajs = defaultdict(set)
    for r in rows:
        trajs[r["uid"]].add(r["traj"])
    assert len(rows) >= 10_000 and min(len(t) for t in trajs.values()) == 1  # groups of one trajectory too
    perm = np.random.default_rng(1).permutation(len(rows))
    rows = [rows[i] for i in perm]
    tlr, mask, score = columns(rows)
    G = returns_of(rows, 0.95).astype(np.float32)
    adv, ret = compute_step_advantage(tlr, G, mask, np.array([r["obs"] for r in rows], object),
                                      np.array([r["uid"] for r in rows], object), np.array([r["traj"] for r in rows], object),
                                      mode=mode, step_advantage_w=0.7)
    want = verl_agent_gigpo(score, G, [r["obs"] for r in rows], [r["uid"] for r in rows], mean_std=mode == "mean_std_norm",
                            w=0.7)[:, None] * mask
    assert adv is ret and adv.dtype == np.float32
    assert np.abs(adv - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_gigpo_similarity_and_a_group_of_one_row():
    rows = random_rows(3, n_groups=12, texts=True) + [dict(uid="alone", traj="alone/0", step=0, obs="x", reward=10.0,
                                                             won=True, L=1)]
    tlr, mask, score = columns(rows)
    G = returns_of(rows, 0.9)
    obs = [r["obs"] for r in rows]
    uid = [r["uid"] for r in rows]
    for thresh in (0.9, 0.99):
        adv, _ = compute_step_advantage(tlr, G, mask, np.array(obs, object), np.array(uid, object),
                                        np.array([r["traj"] for r in rows], object), mode="mean_std_norm",
                                        enable_similarity=True, similarity_thresh=thresh)
        want = verl_agent_gigpo(score, G, obs, uid, mean_std=True, similarity=thresh)[:, None] * mask
        np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
    assert adv[-1, -1] == pytest.approx(10.0 / (1 + 1e-6) + 0.0)  # a one-row group: mean 0, std 1; its step term 0


def by_trajectories(rows, estimator, **cfg):
    """The rows built trajectory by trajectory (batch_from_trajectories), the estimator, one number per row."""
    groups = defaultdict(lambda: defaultdict(list))
    for i, r in enumerate(rows):
        groups[r["uid"]][r["traj"]].append(i)
    trajs, where = [], {}
    for b, ts in enumerate(groups.values()):
        trajs.append([])
        for k, ids in enumerate(ts.values()):
            ids = sorted(ids, key=lambda i: rows[i]["step"])
            trajs[-1].append(bj.Trajectory([rows[i]["obs"] for i in ids], [rows[i]["reward"] for i in ids],
                                           SUCCESS if rows[ids[0]]["won"] else FAILURE))
            for t, i in enumerate(ids):
                where[i] = (b, k, t)
    out = np.asarray(bj.compute_advantages(estimator, bj.batch_from_trajectories(trajs), **cfg).advantage)
    return np.array([out[where[i]] for i in range(len(rows))])


def several_trajectory_rows(seed, n_groups=10):
    rows = random_rows(seed, n_groups=n_groups)
    trajs = defaultdict(set)
    for r in rows:
        trajs[r["uid"]].add(r["traj"])
    return [r for r in rows if len(trajs[r["uid"]]) >= 2]


def _args(rows, gamma=0.95):
    tlr, mask, _ = columns(rows)
    return (tlr, returns_of(rows, gamma), mask, np.array([r["obs"] for r in rows], object),
            np.array([r["uid"] for r in rows], object), np.array([r["traj"] for r in rows], object)), mask


@pytest.mark.parametrize("estimator,cfg", [("gated_bepo", {}), ("grpo", {}), ("hgpo", {}), ("pgpo", {}),
                                           ("gated_bepo", {"lam": 0.3, "norm": "mean", "gamma": 0.9})])
def test_any_estimator_equals_the_trajectories_built_by_hand(estimator, cfg):
    rows = several_trajectory_rows(5)
    args, mask = _args(rows, cfg.get("gamma", 0.95))
    adv, _ = compute_step_advantage(*args, estimator=estimator, **cfg)
    want = by_trajectories(rows, estimator, **cfg)
    np.testing.assert_allclose(adv, want[:, None] * mask, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(want).max()))


def test_step_order_from_step_index_or_refused():
    rows = several_trajectory_rows(7)
    args, mask = _args(rows)
    want, _ = compute_step_advantage(*args, estimator="gated_bepo")
    perm = np.random.default_rng(0).permutation(len(rows))  # balance_batch-like reordering
    shuffled = tuple(a[perm] for a in args)
    with pytest.raises(ValueError, match="step_index"):
        compute_step_advantage(*shuffled, estimator="gated_bepo")
    step = np.array([r["step"] for r in rows])[perm]
    got, _ = compute_step_advantage(*shuffled, estimator="gated_bepo", step_index=step)
    np.testing.assert_allclose(got, want[perm], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="step_index"):
        compute_step_advantage(*shuffled, estimator="gated_bepo", step_index=np.zeros(len(rows), int))
    # per-step rewards that do not discount to the returns in the order given are refused
    reward = np.array([r["reward"] for r in rows])
    compute_step_advantage(*args, estimator="gated_bepo", step_reward=reward)  # consistent: accepted
    with pytest.raises(ValueError, match="step_reward"):
        compute_step_advantage(*args, estimator="gated_bepo", step_reward=reward, gamma=0.5)


def test_a_group_of_one_trajectory_is_scored():
    rows = several_trajectory_rows(9) + [dict(uid="solo", traj="solo/0", step=t, obs=f"s{t}", reward=10.0 * (t == 2),
                                              won=True, L=3) for t in range(3)]
    args, mask = _args(rows)
    adv, _ = compute_step_advantage(*args, estimator="gated_bepo")
    np.testing.assert_allclose(adv[-3:], 10.0 / (1 + 1e-6) * mask[-3:], rtol=1e-6)  # mean 0, std 1, no step term
    np.testing.assert_allclose(adv[:-3], compute_step_advantage(*(a[:-3] for a in args), estimator="gated_bepo")[0])


@pytest.mark.parametrize("change,match", [
    (lambda a: (a[0][:, :2],) + a[1:], "response_mask"),
    (lambda a: (a[0], a[1][:-1]) + a[2:], "step_rewards"),
    (lambda a: a[:3] + (a[3][:-1],) + a[4:], "anchor_obs"),
    (lambda a: a[:5] + (a[5][:-1],), "traj_index"),
    (lambda a: (a[0], np.full(len(a[1]), np.nan)) + a[2:], "finite"),
])
def test_bad_input_is_named(change, match):
    args, _ = _args(several_trajectory_rows(11, n_groups=3))
    with pytest.raises(ValueError, match=match):
        compute_step_advantage(*change(args))
    with pytest.raises(ValueError, match="mode"):
        compute_step_advantage(*args, mode="mean")
    with pytest.raises(ValueError, match="gated_bepo|estimator"):
        compute_step_advantage(*args, estimator="no_such")
    with pytest.raises(ValueError, match="step_advantage_w"):
        compute_step_advantage(*args, estimator="gated_bepo", step_advantage_w=2.0)


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    rows = several_trajectory_rows(13, n_groups=4)
    args, mask = _args(rows)
    want, _ = compute_step_advantage(*args, estimator="gated_bepo")
    t_args = (torch.tensor(args[0], dtype=torch.bfloat16), torch.tensor(args[1]), torch.tensor(args[2])) + args[3:]
    got, ret = compute_step_advantage(*t_args, estimator="gated_bepo")
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and got is ret
    np.testing.assert_allclose(got.float().numpy(), want, rtol=1e-2, atol=1e-2)


JAX_IN_TORCH = r"""
import os, sys
import numpy as np
from bepo_jax.integrations.verl import compute_step_advantage
import jax
n = 4
out, _ = compute_step_advantage(np.ones((n, 2), np.float32), np.array([1.0, 0.5, 0.0, 0.0]), np.ones((n, 2)),
                                np.array(["a", "b", "a", "c"], object), np.array(["u"] * 4, object),
                                np.array([0, 0, 1, 1], object), estimator="gated_bepo")
print(jax.config.jax_platforms, {d.platform for d in jax.devices()})
"""


@pytest.mark.parametrize("env,want", [({}, "cpu {'cpu'}"), ({"JAX_PLATFORMS": "cpu"}, "cpu {'cpu'}")])
def test_jax_stays_on_the_cpu_unless_asked(env, want):
    base = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", JAX_IN_TORCH], env={**base, **env}, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out.splitlines()[-1] == want


def test_verl_registry_through_a_stand_in(monkeypatch):
    """register() adds the names to verl's registry and routes verl's compute_advantage for them to the
    rows' fields of the DataProto (a stand-in with verl's two functions; the real verl: test_verl_installed)."""
    registry = {}

    def register_adv_est(name):
        def deco(fn):
            registry[name] = fn
            return fn
        return deco

    def original(data, adv_estimator, *a, **k):
        data.batch["advantages"] = "verl's own"
        return data

    core_algos = types.SimpleNamespace(register_adv_est=register_adv_est, ADV_ESTIMATOR_REGISTRY=registry)
    ray_trainer = types.SimpleNamespace(compute_advantage=original)
    ppo = types.SimpleNamespace(core_algos=core_algos, ray_trainer=ray_trainer)
    for name, mod in (("verl", types.SimpleNamespace()), ("verl.trainer", types.SimpleNamespace()),
                      ("verl.trainer.ppo", ppo), ("verl.trainer.ppo.core_algos", core_algos),
                      ("verl.trainer.ppo.ray_trainer", ray_trainer)):
        monkeypatch.setitem(sys.modules, name, mod)
    from bepo_jax.integrations.verl import register

    names = register()
    assert {"gated_bepo", "gigpo", "bepo_grpo"} <= set(names) <= set(registry)
    rows = several_trajectory_rows(15, n_groups=3)
    args, _ = _args(rows)
    data = types.SimpleNamespace(batch={"token_level_rewards": args[0], "step_rewards": args[1], "response_mask": args[2]},
                                 non_tensor_batch={"anchor_obs": args[3], "uid": args[4], "traj_uid": args[5]})
    out = ray_trainer.compute_advantage(data, "gated_bepo", gamma=0.95)
    np.testing.assert_array_equal(out.batch["advantages"], compute_step_advantage(*args, estimator="gated_bepo")[0])
    assert ray_trainer.compute_advantage(data, "gae").batch["advantages"] == "verl's own"
    del data.non_tensor_batch["traj_uid"]
    with pytest.raises(ValueError, match="traj_uid"):
        ray_trainer.compute_advantage(data, "gated_bepo")


def test_verl_installed_compute_advantage_through_the_registry_equals_the_direct_call():
    """With verl installed (not in CI's environments: docs/verl.md), its own compute_advantage."""
    pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="verl is not installed")
    torch = pytest.importorskip("torch")
    from verl import DataProto
    from verl.trainer.ppo import core_algos, ray_trainer

    from bepo_jax.integrations.verl import register

    register(["gated_bepo", "gigpo"])
    rows = several_trajectory_rows(17, n_groups=3)
    args, _ = _args(rows, 0.9)
    data = DataProto.from_dict(tensors={"token_level_rewards": torch.tensor(args[0]), "step_rewards": torch.tensor(args[1]),
                                        "response_mask": torch.tensor(args[2])},
                               non_tensors={"anchor_obs": args[3], "uid": args[4], "traj_uid": args[5]})
    assert "gated_bepo" in core_algos.ADV_ESTIMATOR_REGISTRY
    out = ray_trainer.compute_advantage(data, "gated_bepo", gamma=0.9)
    want, _ = compute_step_advantage(*(torch.tensor(a) if isinstance(a, np.ndarray) and a.dtype != object else a
                                       for a in args), estimator="gated_bepo", gamma=0.9)
    torch.testing.assert_close(out.batch["advantages"], want)
