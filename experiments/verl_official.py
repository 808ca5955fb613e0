"""The verl drop-in against verl-agent's own GiGPO file, run unchanged, and the cost of a call beside it.

    python -m experiments.verl_official --official PATH/core_gigpo.py      # in an env with torch (make install-verl)

``PATH/core_gigpo.py``: ``gigpo/core_gigpo.py`` of verl-agent (e.g. ``git show HEAD:gigpo/core_gigpo.py`` of a
clone); it is executed as written, with a stand-in module for its one ``from verl import DataProto`` (used
only as a type). Two parts, written to ``experiments/results/verl_official.{json,md}``:

* **Agreement**: random verl-agent-like rows (groups of 1-8 trajectories of 1-12 steps, observations from a
  few texts so states repeat, success pays 10 at the end, rows shuffled, groups of one trajectory and of one
  row included), both modes, exact grouping and similarity grouping (threshold 0.9, near-duplicate texts):
  ``compute_gigpo_outcome_advantage`` against ``bepo_jax.integrations.verl.compute_step_advantage``, torch
  tensors in both, the largest absolute difference over the scale.
* **Cost per call** at verl-agent's ALFWorld shape (16 groups x 8 trajectories x 50 steps = 6,400 rows) and
  64 x 8 x 50, response length 512: verl-agent's function; the drop-in's ``gigpo``; its ``gated_bepo`` (the
  padded StepBatch and the jitted kernel), each the median of repeated calls after one warm-up call, torch
  tensors in and out (the copies included). The first call of ``gated_bepo`` (compilation included) and the
  programs compiled over batches of varying lengths (padded to powers of two) are reported too.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import types

import numpy as np

from .common import RESULTS, command, machine, parser, write_report

NAME = "verl_official"
TEXTS = [f"You are in room {i}. " + "On the table you see a key, a lamp and a book. " * 3 for i in range(6)]


def rows(seed: int, n_groups: int, *, near_duplicates: bool = False, max_k: int = 8, max_len: int = 12,
         exact_shape: bool = False) -> dict:
    """verl-agent-like rows (module docstring); ``exact_shape``: every group max_k trajectories of max_len steps."""
    rng = np.random.default_rng(seed)
    out = {k: [] for k in ("uid", "traj", "step", "obs", "score", "G")}
    for g in range(n_groups):
        k_n = max_k if exact_shape else int(rng.integers(1, max_k + 1))
        for k in range(k_n):
            L = max_len if exact_shape else int(rng.integers(1, max_len + 1))
            won = bool(rng.random() < 0.4)
            for t in range(L):
                text = TEXTS[int(rng.integers(0, len(TEXTS)))]
                if near_duplicates:
                    text += "." * int(rng.integers(0, 3))
                out["uid"].append(f"u{g}")
                out["traj"].append(f"u{g}/t{k}")
                out["step"].append(t)
                out["obs"].append(text)
                out["score"].append(10.0 * won)
                out["G"].append(10.0 * won * 0.95 ** (L - 1 - t))
    perm = rng.permutation(len(out["uid"]))
    return {k: [v[i] for i in perm] for k, v in out.items()}


def _official(path: str):
    sys.modules.setdefault("verl", types.SimpleNamespace(DataProto=object))
    ns: dict = {}
    exec(compile(open(path).read(), path, "exec"), ns)
    return ns["compute_gigpo_outcome_advantage"]


def _tensors(r: dict, L: int):
    import torch

    n = len(r["uid"])
    tlr = torch.zeros(n, L)
    tlr[:, -1] = torch.tensor(r["score"])
    mask = torch.ones(n, L)
    mask[::3, : L // 2] = 0
    return (tlr, torch.tensor(r["G"], dtype=torch.float32), mask, np.array(r["obs"], object),
            np.array(r["uid"], object), np.array(r["traj"], object))


def _quiet(fn, *a, **k):
    with contextlib.redirect_stdout(io.StringIO()):  # the official build_step_group prints a line per call
        return fn(*a, **k)


def agreement(official, seed: int) -> list[dict]:
    from bepo_jax.integrations.verl import compute_step_advantage

    out = []
    for sim in (False, True):
        r = rows(seed, 60 if sim else 480, near_duplicates=sim)
        args = _tensors(r, 8)
        for mode in ("mean_norm", "mean_std_norm"):
            kw = dict(mode=mode, epsilon=1e-6, step_advantage_w=1.0, enable_similarity=sim, similarity_thresh=0.9)
            want, _ = _quiet(official, *args, **kw)
            got, _ = compute_step_advantage(*args, **kw)
            scale = max(1.0, float(want.abs().max()))
            out.append({"rows": len(r["uid"]), "mode": mode, "similarity": 0.9 if sim else None,
                        "max_abs_diff": float((got - want).abs().max()), "scale": scale,
                        "single_row_groups": int(sum(1 for u in set(r["uid"]) if r["uid"].count(u) == 1))})
    return out


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def cost(official, groups: int, repeats: int) -> dict:
    from bepo_jax.integrations.verl import compute_step_advantage

    r = rows(7, groups, max_k=8, max_len=50, exact_shape=True)
    args = _tensors(r, 512)
    res = {"rows": len(r["uid"]), "shape": f"{groups} x 8 x 50"}
    res["verl_agent_s"] = _median(lambda: _quiet(official, *args), max(1, repeats // 3))
    compute_step_advantage(*args)
    res["bepo_gigpo_s"] = _median(lambda: compute_step_advantage(*args), repeats)
    t0 = time.perf_counter()
    step = np.array(r["step"])  # the rows are shuffled: their steps come with them
    compute_step_advantage(*args, estimator="gated_bepo", step_index=step)
    res["bepo_gated_bepo_first_s"] = time.perf_counter() - t0
    res["bepo_gated_bepo_s"] = _median(lambda: compute_step_advantage(*args, estimator="gated_bepo", step_index=step),
                                       repeats)
    res["speedup_gigpo"] = res["verl_agent_s"] / res["bepo_gigpo_s"]
    res["speedup_gated_bepo_vs_verl_agent_gigpo"] = res["verl_agent_s"] / res["bepo_gated_bepo_s"]
    return res


def compiles(batches: int) -> dict:
    """Programs compiled by gated_bepo over batches whose groups hold 5-8 trajectories of 10-50 steps."""
    import jax

    from bepo_jax.integrations.verl import compute_step_advantage

    before = _cache_size()
    for s in range(batches):
        rng = np.random.default_rng(100 + s)
        r = rows(100 + s, 16, max_k=int(rng.integers(5, 9)), max_len=int(rng.integers(10, 51)))
        compute_step_advantage(*_tensors(r, 16), estimator="gated_bepo", step_index=np.array(r["step"]))
    jax.effects_barrier()
    return {"batches": batches, "programs": _cache_size() - before}


def _cache_size() -> int:
    from bepo_jax.credit.estimators.registry import get_estimator

    return sum(getattr(f, "_cache_size", lambda: 0)() for f in _jitted(get_estimator("gated_bepo").fn))


def _jitted(fn):
    """The jitted functions an estimator's entry point calls (its module's ``_*_jit`` globals)."""
    mod = sys.modules[fn.__module__]
    return [v for k, v in vars(mod).items() if k.startswith("_") and k.endswith("_jit")]


def main(argv=None) -> None:
    ap = parser(__doc__, full=True)
    ap.add_argument("--official", required=True, help="verl-agent's gigpo/core_gigpo.py")
    ap.add_argument("--commit", default="", help="the commit the file was read at (recorded)")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    official = _official(args.official)
    info = {"command": command(NAME, argv), "machine": machine(), "official": args.official, "commit": args.commit,
            "agreement": agreement(official, args.seed),
            "cost": [cost(official, g, args.repeats) for g in (16, 64)], "compiles": compiles(6)}
    L = ["# The verl drop-in against verl-agent's own GiGPO", "",
         f"`{info['command']}`; verl-agent `gigpo/core_gigpo.py` {args.commit}, run unchanged (a stand-in for its "
         "`from verl import DataProto`). torch tensors in and out, CPU, 2 cores.", "",
         "## Agreement (`estimator=\"gigpo\"`, shuffled rows)", "",
         "| rows | mode | similarity | groups of one row | max abs diff | scale |", "|---:|---|---|---:|---:|---:|"]
    for a in info["agreement"]:
        L.append(f"| {a['rows']} | {a['mode']} | {a['similarity'] or 'off'} | {a['single_row_groups']} | "
                 f"{a['max_abs_diff']:.2e} | {a['scale']:.1f} |")
    L += ["", "## Cost per call (median after a warm-up call; copies included)", "",
          "| shape | rows | verl-agent gigpo (s) | bepo gigpo (s) | speed-up | bepo gated_bepo (s) | gated_bepo first call (s) |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    for c in info["cost"]:
        L.append(f"| {c['shape']} | {c['rows']} | {c['verl_agent_s']:.3f} | {c['bepo_gigpo_s']:.4f} | "
                 f"{c['speedup_gigpo']:.0f}x | {c['bepo_gated_bepo_s']:.3f} | {c['bepo_gated_bepo_first_s']:.2f} |")
    c = info["compiles"]
    L += ["", f"gated_bepo over {c['batches']} batches of varying lengths (5-8 trajectories of 10-50 steps, padded to "
          f"powers of two): {c['programs']} programs compiled."]
    write_report(RESULTS / f"{NAME}.json", info, "\n".join(L) + "\n")


if __name__ == "__main__":
    main()
