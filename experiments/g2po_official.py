"""bepo_jax's ``g2po`` against the G2PO authors' own code, run as they wrote it.

    python -m experiments.g2po_official --official PATH/core_g2po.py --torch-python PATH/bin/python

``PATH/core_g2po.py``: the file ``g2po/core_g2po.py`` of github.com/Nala-YN/G2PO (read with
``git show b8ffaf5:g2po/core_g2po.py``; vendored unchanged as ``tests/fixtures/official/g2po/core_g2po.py``); the interpreter needs torch and numpy (the file imports
``verl.DataProto`` only as a type: a stand-in module is put in its place). Random verl-agent-like
rollouts (success pays 10, an invalid action costs 0.1, observations drawn from a few symbols so
states repeat) go through the official functions in that interpreter (``compute_group_aggregation_values``,
then ``compute_g2po_outcome_advantage``) and through ``bepo_jax.g2po``; the largest absolute
difference per mode lands in ``experiments/results/g2po_official.{json,md}``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from .common import RESULTS, command, machine, parser, write_json, write_lines

OFFICIAL_SIDE = r'''
import json, sys, types
import numpy as np, torch
sys.modules["verl"] = types.SimpleNamespace(DataProto=object)
ns = {}
exec(open(sys.argv[1]).read(), ns)
rows = json.loads(sys.stdin.read())
out = {}
for mode in ("mean_norm", "mean_std_norm"):
    n = len(rows["uid"])
    batch = types.SimpleNamespace(
        non_tensor_batch={"episode_rewards": np.array(rows["episode_reward"], float), "anchor_obs": np.array(rows["obs"], object),
                          "traj_uid": np.array(rows["traj"], object), "uid": np.array(rows["uid"], object)},
        batch={"responses": torch.zeros(n, 1)})
    step_rewards, group_idx, next_group_idx = ns["compute_group_aggregation_values"](batch)
    scores = torch.tensor(rows["score"], dtype=torch.float32)[:, None]
    adv, _ = ns["compute_g2po_outcome_advantage"](scores, step_rewards, torch.ones(n, 1), np.array(rows["uid"], object),
                                                  np.array(rows["traj"], object), group_idx, next_group_idx,
                                                  np.array(rows["valid"], float), mode=mode)
    out[mode] = adv[:, 0].tolist()
print(json.dumps(out))
'''


def rollouts(seed: int, groups: int, k: int, t_max: int, symbols: int, words: tuple = ()):
    """Random groups: per trajectory a length, observations, success (pays 10 on its last step)
    and invalid actions; as bepo_jax records and as verl-agent rows (in trajectory order). ``words``:
    observations are then sentences of 1-3 of the first ``symbols`` of them (texts that overlap in part),
    else the symbols "s0", "s1", ...; rows also carry each step's own reward ("reward")."""
    from bepo_jax import FAILURE, SUCCESS, TRUNCATED
    from bepo_jax.credit.builders import Trajectory, batch_from_trajectories

    rng = np.random.default_rng(seed)
    groups_ = []
    rows = {k_: [] for k_ in ("uid", "traj", "obs", "episode_reward", "score", "valid", "reward")}
    for g in range(groups):
        trajs = []
        for j in range(k):
            L = int(rng.integers(1, t_max + 1))
            obs = ([" ".join(rng.choice(words[:symbols], size=int(rng.integers(1, 4)))) for _ in range(L)] if words
                   else [f"s{int(x)}" for x in rng.integers(0, symbols, L)])
            outcome = [SUCCESS, FAILURE, TRUNCATED][int(rng.integers(0, 3))]
            R = 10.0 if outcome == SUCCESS else 0.0
            invalid = rng.random(L) < 0.25
            trajs.append(Trajectory(obs, [R if i == L - 1 else 0.0 for i in range(L)], outcome,
                                    penalties=[-0.1 if v else 0.0 for v in invalid]))
            for i in range(L):
                rows["uid"].append(f"g{g}")
                rows["traj"].append(f"g{g}t{j}")
                rows["obs"].append(obs[i])
                rows["episode_reward"].append(R)
                rows["score"].append(R - 0.1 * float(invalid[i]))
                rows["valid"].append(0.0 if invalid[i] else 1.0)
                rows["reward"].append(R if i == L - 1 else 0.0)
        groups_.append(trajs)
    return batch_from_trajectories(groups_), rows


def run_official(torch_python: str, side: str, official: str, rows: dict) -> dict:
    """Run the official side script ``side`` on ``rows`` in ``torch_python``; its last stdout line as JSON."""
    r = subprocess.run([torch_python, "-c", side, official], input=json.dumps(rows), capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"the official side failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(name: str, official: str, worst: dict, runs: list, column: str, head: list) -> None:
    """``experiments/results/<name>.{json,md}``: per setting (``column`` of each run) the rows compared, the
    largest absolute difference and the largest advantage; ``head``: the title and a sentence on the data."""
    res = {"command": command(name), "machine": machine(), "official": official, "worst": worst, "runs": runs}
    write_json(RESULTS / f"{name}.json", res)
    lines = [head[0], "", f"`{res['command']}`", "", *head[1:], "",
             f"| {column} | rows compared | largest absolute difference | largest advantage |", "|---|---|---|---|"]
    for key in worst:
        rs = [r for r in runs if r[column] == key]
        lines.append(f"| {key} | {sum(r['rows'] for r in rs)} | {worst[key]:.2e} | "
                     f"{max(r['max_abs_advantage'] for r in rs):.2f} |")
    write_lines(RESULTS / f"{name}.md", lines)
    print("\n".join(lines))


def compare(official_path: str, torch_python: str, seeds: int) -> tuple[dict, list]:
    """bepo_jax's g2po against the official file on ``seeds`` random sets of groups: the largest absolute
    difference per mode, and one record per (seed, mode)."""
    import bepo_jax as bj

    worst = {"mean_norm": 0.0, "mean_std_norm": 0.0}
    runs = []
    for seed in range(seeds):
        batch, rows = rollouts(seed, groups=4, k=4 + seed % 5, t_max=6, symbols=3 + seed % 4)
        official = run_official(torch_python, OFFICIAL_SIDE, official_path, rows)
        mask = np.asarray(batch.mask)
        for mode, norm in (("mean_norm", "mean"), ("mean_std_norm", "mean_std")):
            ours = np.asarray(bj.g2po(batch, bj.G2POConfig(norm=norm)).advantage)[mask]  # rows in trajectory order
            diff = float(np.max(np.abs(ours - np.asarray(official[mode]))))
            worst[mode] = max(worst[mode], diff)
            runs.append({"seed": seed, "mode": mode, "rows": int(mask.sum()), "max_abs_diff": diff,
                         "max_abs_advantage": float(np.max(np.abs(ours)))})
    return worst, runs


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--official", required=True, help="the official g2po/core_g2po.py")
    p.add_argument("--torch-python", required=True, help="an interpreter with torch and numpy")
    p.add_argument("--seeds", type=int, default=20)
    args = p.parse_args(argv)
    worst, runs = compare(args.official, args.torch_python, args.seeds)
    report("g2po_official", args.official, worst, runs, "mode",
           ["# bepo_jax's g2po against the G2PO authors' code", f"{args.seeds} random sets of groups (4 groups, K = 4-8, "
            "1-6 steps, 3-6 observation symbols, success pays 10, a quarter of the actions invalid at 0.1); the "
            "official functions in float32 torch, bepo_jax in float32 JAX."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
