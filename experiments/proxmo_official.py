"""bepo_jax's ``proxmo`` against the ProxMO authors' own code, run as they wrote it.

    python -m experiments.proxmo_official --official tests/fixtures/official/proxmo/core_proxmo.py \
        --torch-python PATH/bin/python

The file is github.com/GithubX-F/ProxMO-RL's ``proxmo/core_proxmo.py`` at ``496efa7``, vendored unchanged
(tests/fixtures/official/README.md).
The interpreter needs torch, numpy and scikit-learn (the file imports ``verl.DataProto`` only as a type: a
stand-in module is put in its place). Random verl-agent-like rollouts (success pays 10, an invalid action
costs 0.1, observations are short sentences from a few words so their TF-IDF vectors overlap in part, or
bare symbols) go through the official path as the trainer drives it: ``compute_step_discounted_returns``
(gamma 0.95), the invalid-action penalty subtracted from each row's episode score and step return
(``apply_invalid_action_penalty``), PSC's beta derived from the target range as the trainer does, then
``compute_proxmo_outcome_advantage`` in each mode, PSC on (the run scripts: alpha 4, target range 0.05)
and off; and through ``bepo_jax.proxmo`` with the texts. The largest absolute difference per setting lands in
``experiments/results/proxmo_official.{json,md}``.
"""

from __future__ import annotations

import sys

import numpy as np

from .common import parser
from .g2po_official import report, rollouts, run_official

OFFICIAL_SIDE = r'''
import json, sys, types
import numpy as np, torch
sys.modules["verl"] = types.SimpleNamespace(DataProto=object)
ns = {}
exec(open(sys.argv[1]).read(), ns)
rows = json.loads(sys.stdin.read())
n = len(rows["uid"])
batch = types.SimpleNamespace(non_tensor_batch={"rewards": np.array(rows["reward"], float),
                                                "traj_uid": np.array(rows["traj"], object),
                                                "active_masks": np.ones(n)},
                              batch={"input_ids": torch.zeros(n, 1)})
step = ns["compute_step_discounted_returns"](batch, 0.95)
invalid = 1.0 - torch.tensor(rows["valid"], dtype=torch.float32)
step = step - 0.1 * invalid                                          # apply_invalid_action_penalty
scores = torch.tensor(rows["episode_reward"], dtype=torch.float32) - 0.1 * invalid
beta = (0.05 / (torch.sigmoid(torch.tensor(1.0)) - 0.5)).item()      # the trainer's derived beta
out = {}
for mode in ("soft_grouping", "mean_norm", "mean_std_norm"):
    for psc in (True, False):
        adv, _ = ns["compute_proxmo_outcome_advantage"](
            scores[:, None].clone(), step.clone(), torch.ones(n, 1), np.array(rows["obs"], object),
            np.array(rows["uid"], object), np.array(rows["traj"], object), mode=mode, enable_psc=psc,
            psc_alpha=4.0, psc_beta=beta)
        out[f"{mode}/psc={psc}"] = adv[:, 0].tolist()
print(json.dumps(out))
'''
MODES = {"soft_grouping": "soft", "mean_norm": "mean", "mean_std_norm": "mean_std"}
WORDS = ("kitchen", "hall", "key", "door", "red", "box", "table", "chair", "lamp")


def texts_of(rows: dict, batch) -> list:
    """The rows' observations as ``texts[b][k][t]`` (rows are in group, trajectory, step order)."""
    B, K, _ = batch.mask.shape
    lengths = np.asarray(batch.mask).sum(-1)
    it = iter(rows["obs"])
    return [[[next(it) for _ in range(int(lengths[b, k]))] for k in range(K)] for b in range(B)]


def compare(official_path: str, torch_python: str, seeds: int) -> tuple[dict, list]:
    """bepo_jax's proxmo against the official file on ``seeds`` random sets of groups: the largest absolute
    difference per setting (mode, PSC), and one record per (seed, setting)."""
    import bepo_jax as bj

    worst, runs = {}, []
    for seed in range(seeds):
        words = WORDS if seed % 4 else ()  # one set in four: bare symbols "s0", "s1", ...
        batch, rows = rollouts(seed, groups=4, k=4 + seed % 5, t_max=6, symbols=3 + seed % 6, words=words)
        official = run_official(torch_python, OFFICIAL_SIDE, official_path, rows)
        mask = np.asarray(batch.mask)
        texts = texts_of(rows, batch)
        for key, values in official.items():
            mode, psc = key.split("/")
            cfg = bj.ProxMOConfig(mode=MODES[mode], psc=psc == "psc=True")
            ours = np.asarray(bj.proxmo(batch, cfg, texts=texts).advantage)[mask]
            diff = float(np.max(np.abs(ours - np.asarray(values))))
            worst[key] = max(worst.get(key, 0.0), diff)
            runs.append({"seed": seed, "setting": key, "words": bool(words), "rows": int(mask.sum()),
                         "max_abs_diff": diff, "max_abs_advantage": float(np.max(np.abs(ours)))})
    return worst, runs


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--official", required=True, help="the official proxmo/core_proxmo.py")
    p.add_argument("--torch-python", required=True, help="an interpreter with torch, numpy and scikit-learn")
    p.add_argument("--seeds", type=int, default=20)
    args = p.parse_args(argv)
    worst, runs = compare(args.official, args.torch_python, args.seeds)
    report("proxmo_official", args.official, worst, runs, "setting",
           ["# bepo_jax's proxmo against the ProxMO authors' code", f"{args.seeds} random sets of groups (4 groups, "
            "K = 4-8, 1-6 steps, success pays 10, a quarter of the actions invalid at 0.1; observations are sentences "
            "of 1-3 words from 3-8 words, or bare symbols in one set of four); the official functions in float32 "
            "torch (TF-IDF by scikit-learn in both), bepo_jax in float32 JAX."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
