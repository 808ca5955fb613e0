"""Benchmark: the jitted advantage kernels against plain-Python loop implementations.

For each estimator, on grid-room random walks (bepo_jax.credit.builders.grid_room_batch) from the
paper's shape (16 groups x 8 trajectories x 50 steps) up to over a million records:
records/s, time per record, compile time, XLA's peak-memory estimate, fixed-point
iterations, and — at the small sizes — the plain-Python reference's time and the
speed-up, measured in the same run. Writes experiments/results/bench_advantages.{md,json}.

    python -m experiments.bench_advantages            # the full CPU run (~10 min on 2 cores)
    python -m experiments.bench_advantages --quick    # small sizes only
    python -m experiments.bench_advantages --rows     # row layout end to end (bench_rows.{json,md}), ~1 min
    python -m experiments.bench_advantages --backend gpu --out experiments/results/gpu   # < 5 min on one GPU
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import jax
import numpy as np

import bepo_jax as bj
from bepo_jax.credit import reference as ref  # the plain-loop implementations the tests check against
from experiments.common import ROOT, command, machine, parser, write_json, write_lines
from experiments.dict_baselines import dict_gated_bepo, dict_gigpo
from bepo_jax.credit.builders import grid_room_batch

K, T = 8, 50
BUCKET = 32  # a 5x5 room has 25 cells: every group fits a 32-state bucket


def _np_batch(batch):
    pen = np.zeros(batch.mask.shape, np.float32) if batch.penalty is None else np.asarray(batch.penalty)
    return (np.asarray(batch.obs_key), np.asarray(batch.reward), np.asarray(batch.mask), np.asarray(batch.outcome), pen)


B_DEF = dict(gamma=0.95, lam=0.5, w=1.0, eta_gated=0.5, norm="mean_std", weighting="step", std="unbiased", eps=1e-6,
             min_successors=2, gate_on="successor", tol=1e-6, max_iters=1000)

# label -> (registry name, config, python reference or None). Labels ending in "(host entry)"
# time the public function (host entry point, check=False); the others time the bare jitted
# kernel. max_states=0 is the automatic bucket (a lax.switch on the largest group) on both.
VARIANTS = {
    "grpo": ("grpo", bj.GRPOConfig(), lambda nb: ref.ref_grpo(nb, norm="mean_std", weighting="step", std="unbiased", eps=1e-6)),
    "gigpo": ("gigpo", bj.GiGPOConfig(), lambda nb: ref.ref_gigpo(nb, gamma=0.95, omega=1.0, norm="mean", weighting="step",
                                                                   std="unbiased", eps=1e-6)),
    "graphgpo": ("graphgpo", bj.GraphGPOConfig(), lambda nb: ref.ref_graphgpo(nb, omega_g=0.1, scale=10.0, beta_g=1.0,
                                                                                beta_e=1.0, norm="mean_std", weighting="step",
                                                                                std="unbiased", eps=1e-6)[0]),
    "hgpo": ("hgpo", bj.HGPOConfig(), lambda nb: ref.ref_hgpo(nb, history_length=2, length_weight_alpha=1.0,
                                                                base_group=False, norm="mean_std", gamma=0.95, eps=1e-6)),
    "gagpo": ("gagpo", bj.GAGPOConfig(), lambda nb: ref.ref_gagpo(nb, gamma=0.95, lam=0.95, w=1.0, norm="mean_std",
                                                                     weighting="step", std="unbiased", eps=1e-6)),
    "gated_bepo default (host entry)": ("gated_bepo", bj.GatedBEPOConfig(),
                                        lambda nb: ref.ref_gated_bepo(nb, **B_DEF)["advantage"]),
    "gated_bepo default (in jit)": ("gated_bepo", bj.GatedBEPOConfig(), None),
    "gated_bepo dense S=N": ("gated_bepo", bj.GatedBEPOConfig(max_states=K * T), None),
    f"gated_bepo dense S={BUCKET}": ("gated_bepo", bj.GatedBEPOConfig(max_states=BUCKET), None),
    "gated_bepo sparse": ("gated_bepo", bj.GatedBEPOConfig(solver="sparse"), None),
    f"gated_bepo solve S={BUCKET}": ("gated_bepo", bj.GatedBEPOConfig(solver="solve", max_states=BUCKET), None),
    f"gated_bepo auto S={BUCKET}": ("gated_bepo", bj.GatedBEPOConfig(solver="auto", max_states=BUCKET), None),
}
HEADLINE = "gated_bepo default (host entry)"
# label -> the efficient dict-based Python implementation of the same numbers
# (experiments/dict_baselines.py): the fair baseline, beside the literal reference.
DICT_BASELINES = {"gigpo": dict_gigpo, "gated_bepo default (host entry)": dict_gated_bepo,
                  "gated_bepo default (in jit)": dict_gated_bepo}


def _time(fn, *, min_reps=5, min_seconds=0.5):
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
        if len(times) >= 200:
            break
    return statistics.median(times)


def bench_one(label, name, cfg, pyref, groups, *, python_max_groups, dense_max_groups):
    est = bj.ESTIMATORS[name]
    jax.clear_caches()  # every variant pays (and reports) its own compile
    batch = bj.check_batch(grid_room_batch(groups, K, T, seed=groups))
    records = int(np.asarray(batch.mask).sum())
    if label.endswith("S=N") and groups > dense_max_groups:
        return dict(variant=label, groups=groups, records=records, skipped=f"S=N dense above {dense_max_groups} groups")
    if label.endswith("(host entry)"):
        # The public function: automatic state bucket, no value checks (a training loop's call).
        t0 = time.perf_counter()
        out = jax.block_until_ready(est.fn(batch, cfg, check=False))
        compile_s = time.perf_counter() - t0
        mem = jax.jit(est.kernel).lower(batch, cfg).compile().memory_analysis()
        run = lambda: est.fn(batch, cfg, check=False)
    else:
        jitted = jax.jit(est.kernel)
        t0 = time.perf_counter()
        compiled = jitted.lower(batch, cfg).compile()
        compile_s = time.perf_counter() - t0
        mem = compiled.memory_analysis()
        out = jax.block_until_ready(jitted(batch, cfg))
        run = lambda: jitted(batch, cfg)
    peak = None
    if mem is not None:
        peak = int(mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)
    sec = _time(run)
    row = dict(variant=label, groups=groups, records=records, jax_ms=sec * 1e3, records_per_s=records / sec,
               us_per_record=sec / records * 1e6, compile_s=compile_s, peak_bytes=peak)
    diag = getattr(out, "diagnostics", None)
    if diag is not None:
        it = np.asarray(diag.iterations)
        row.update(iters_mean=float(it.mean()), iters_max=int(it.max()), states_mean=float(np.asarray(diag.num_states).mean()),
                   overflow=bool(np.asarray(diag.overflow).any()), converged=bool(np.asarray(diag.converged).all()))
    if pyref is not None and groups <= python_max_groups:
        nb = _np_batch(batch)
        t0 = time.perf_counter()
        want = pyref(nb)
        py_s = time.perf_counter() - t0
        got = np.asarray(out.advantage, np.float64)
        err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
        row.update(python_s=py_s, speedup=py_s / sec, max_rel_err_vs_python=err)
    if label in DICT_BASELINES and groups <= python_max_groups:
        nb = _np_batch(batch)
        fn = DICT_BASELINES[label]
        want = fn(nb)
        got = np.asarray(out.advantage, np.float64)
        err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
        if err > 1e-4:
            raise AssertionError(f"{label}: the dict baseline differs from the kernel by {err:.3g} (relative)")
        dict_s = _time(lambda: fn(nb), min_reps=3, min_seconds=0.3)
        row.update(dict_python_s=dict_s, speedup_vs_dict=dict_s / sec, max_rel_err_vs_dict=err)
    return row


def _plain_moments(x, valid, ids, num_segments, *, ddof):
    """The earlier statistics: the same two shifted passes with plain float32 segment sums."""
    import jax.numpy as jnp

    w = valid.astype(x.dtype)
    count = jax.ops.segment_sum(w, ids, num_segments)
    shift = jax.ops.segment_max(jnp.where(valid, x, -jnp.inf), ids, num_segments)
    shift = jnp.where(count > 0, shift, 0.0)
    d = jnp.where(valid, x - shift[ids], 0.0)
    mean_d = jax.ops.segment_sum(d, ids, num_segments) / jnp.maximum(count, 1.0)
    dev = jnp.where(valid, d - mean_d[ids], 0.0)
    ss = jax.ops.segment_sum(dev * dev, ids, num_segments)
    return count, shift + mean_d, jnp.sqrt(ss / jnp.maximum(count - ddof, 1.0))


def precision_rows(groups_list):
    """Group statistics as the kernels take them — per group of K T = 400 records, vmapped
    over groups — on step groups of ~200 nearly equal returns (the review's worst case):
    time, largest relative error of sigma against float64, and whether a permutation of
    each group's rows changes any bit. Exact limb sums (the library) against plain
    float32 segment sums."""
    import jax.numpy as jnp

    from bepo_jax.credit.stats import segment_moments

    rows = []
    rng = np.random.default_rng(0)
    n, segs = K * T, 2
    valid = jnp.ones(n, bool)
    for groups in groups_list:
        x = (150.0 + rng.normal(size=(groups, n)) * 1e-2).astype(np.float32)
        ids = rng.integers(0, segs, (groups, n)).astype(np.int32)
        perm = rng.permutation(n)
        x64 = x.astype(np.float64)
        want = np.array([[x64[g][ids[g] == s].std(ddof=1) for s in range(segs)] for g in range(groups)])
        for label, fn in (("exact limb sums (library)", lambda a, i: segment_moments(a, valid, i, segs, ddof=1)[2]),
                          ("plain float32 segment_sum", lambda a, i: _plain_moments(a, valid, i, segs, ddof=1)[2])):
            jitted = jax.jit(jax.vmap(fn))
            a, i = jnp.asarray(x), jnp.asarray(ids)
            sd = np.asarray(jitted(a, i))
            sd_p = np.asarray(jitted(jnp.asarray(x[:, perm]), jnp.asarray(ids[:, perm])))
            sec = _time(lambda: jitted(a, i))
            rows.append(dict(method=label, groups=groups, records=groups * n, segments=groups * segs, ms=sec * 1e3,
                             max_rel_err_sigma=float(np.max(np.abs(sd - want) / want)),
                             order_independent=bool(np.array_equal(sd, sd_p))))
    return rows


def rows_of(batch, seed):
    """The batch as verl-style rows in shuffled order, observations as strings ("room
    cell 13: a table, a lamp, ..." of ~80 characters, one per cell)."""
    B, K, T = batch.mask.shape
    b, k, t = np.nonzero(np.asarray(batch.mask))
    cell = np.asarray(batch.obs_key)[b, k, t, 1]
    text = {c: f"room cell {c}: " + ", ".join(f"object {c * 7 + j}" for j in range(6)) for c in np.unique(cell)}
    order = np.random.default_rng(seed).permutation(len(b))
    b, k, t, cell = b[order], k[order], t[order], cell[order]
    outcome = np.asarray(batch.outcome)[b, k]
    return dict(uid=(b.astype(np.int64)), traj_uid=b * K + k, step=t, obs=[text[c] for c in cell.tolist()],
                keys=np.asarray(batch.obs_key)[b, k, t], reward=np.asarray(batch.reward)[b, k, t], outcome=outcome)


def rows_rows(groups_list):
    """Row layout end to end at each size: from_rows (string observations, and given
    keys), the GiGPO kernel on the padded batch (compiled), to_rows; the end-to-end time
    over the kernel's."""
    out = []
    kernel = jax.jit(lambda b: bj.ESTIMATORS["gigpo"].kernel(b, bj.GiGPOConfig()).advantage)
    for groups in groups_list:
        rows = rows_of(grid_room_batch(groups, K, T, seed=groups), seed=groups)
        n = len(rows["step"])
        args = (rows["uid"], rows["traj_uid"], rows["step"])
        tail = (rows["reward"], rows["outcome"])
        bj.from_rows(*args, rows["obs"], *tail)  # warm: the hashing program compiles once per width bucket
        batch, index = bj.from_rows(*args, rows["obs"], *tail)
        jax.block_until_ready(kernel(batch))
        t_str = _time(lambda: bj.from_rows(*args, rows["obs"], *tail), min_reps=3, min_seconds=0.2)
        t_key = _time(lambda: bj.from_rows(*args, rows["keys"], *tail), min_reps=3, min_seconds=0.2)
        t_ker = _time(lambda: kernel(batch), min_reps=3, min_seconds=0.2)
        adv = kernel(batch)
        t_back = _time(lambda: bj.to_rows(adv, index), min_reps=3, min_seconds=0.2)
        end = t_str + t_ker + t_back
        out.append(dict(groups=groups, rows=n, from_rows_strings_s=t_str, from_rows_keys_s=t_key, kernel_s=t_ker,
                        to_rows_s=t_back, end_to_end_s=end, end_to_end_over_kernel=end / t_ker,
                        us_per_row=end / n * 1e6))
        print(json.dumps(out[-1]), flush=True)
    return out


def write_rows(rows, out_dir: Path):
    cmd = command("bench_advantages")
    info = dict(command=cmd, machine=machine(), k=K, t=T, rows=rows)
    write_json(out_dir / "bench_rows.json", info, indent=2)
    m = info["machine"]
    lines = ["# Row layout end to end: from_rows -> GiGPO kernel -> to_rows", "",
             f"Command: `{cmd}`  ", f"Machine: {m['platform']}, {m['cpu_count']} CPUs, backend {m['backend']}; "
             f"JAX {m['jax']}, NumPy {m['numpy']}.  ",
             "Rows: grid-room random walks (K = 8, T = 50) in shuffled order, string observations of ~90 "
             "characters; median times. End to end = from_rows (strings) + kernel + to_rows.", "",
             "| groups | rows | from_rows (strings) | from_rows (uint32 keys) | GiGPO kernel | to_rows | end to end | "
             "end to end / kernel | us / row |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['groups']} | {r['rows']:,} | {r['from_rows_strings_s'] * 1e3:.1f} ms | "
                     f"{r['from_rows_keys_s'] * 1e3:.1f} ms | {r['kernel_s'] * 1e3:.1f} ms | {r['to_rows_s'] * 1e3:.1f} ms | "
                     f"{r['end_to_end_s'] * 1e3:.1f} ms | {r['end_to_end_over_kernel']:.1f}x | {r['us_per_row']:.2f} |")
    write_lines(out_dir / "bench_rows.md", lines)
    print("\n".join(lines))


def write(rows, precision, args, out_dir: Path, wall_s: float, quiet: bool = False):
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = command("bench_advantages")
    info = dict(command=cmd, machine=machine(), k=K, t=T, bucket=BUCKET, wall_s=wall_s, rows=rows, precision=precision)
    head = [r for r in rows if r["variant"] == HEADLINE and "us_per_record" in r]
    if head:
        per = [r["us_per_record"] for r in head]
        info["headline"] = dict(variant=HEADLINE, records=[r["records"] for r in head], us_per_record=per,
                                max_over_min_us_per_record=max(per) / min(per),
                                bytes_per_record=[r["peak_bytes"] / r["records"] if r.get("peak_bytes") else None for r in head])
    bepo16 = [r for r in rows if r["variant"] == "gated_bepo default (host entry)" and r["groups"] == 16 and "speedup" in r]
    if bepo16:
        info["gated_bepo_speedup_16x8x50"] = bepo16[0]["speedup"]
    info["speedup_vs_dict_16x8x50"] = {r["variant"]: r["speedup_vs_dict"] for r in rows
                                       if r["groups"] == 16 and "speedup_vs_dict" in r}
    write_json(out_dir / "bench_advantages.json", info, indent=2)
    m = info["machine"]
    lines = [
        "# Advantage kernels vs plain-Python loops",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs, backend {m['backend']} ({m['device']} x{m['device_count']}); "
        f"Python {m['python']}, JAX {m['jax']}, NumPy {m['numpy']}, bepo_jax {m['bepo_jax']}  ",
        f"Batch: grid-room random walks (5x5 room, start corner, +10 at the far corner, wall bumps are self-loops), "
        f"K = {K}, T = {T}; records = valid steps. Wall time {wall_s:.0f} s.",
        "",
        "Python s / speed-up: the literal reference (`bepo_jax/credit/reference.py`, one run); dict ms / vs dict: the "
        "efficient dict-based Python implementation (`experiments/dict_baselines.py`, median of repeats).",
        "",
        "| variant | groups | records | JAX ms | records/s | us/record | compile s | peak MB | iters mean/max | Python s "
        "| speed-up | dict ms | vs dict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['variant']} | {r['groups']} | {r['records']} | skipped: {r['skipped']} | | | | | | | | | |")
            continue
        its = f"{r['iters_mean']:.1f} / {r['iters_max']}" if "iters_mean" in r else ""
        peak = f"{r['peak_bytes'] / 2**20:.1f}" if r.get("peak_bytes") else ""
        py = f"{r['python_s']:.2f}" if "python_s" in r else ""
        sp = f"{r['speedup']:.0f}x" if "speedup" in r else ""
        dm = f"{r['dict_python_s'] * 1e3:.2f}" if "dict_python_s" in r else ""
        dsp = f"{r['speedup_vs_dict']:.1f}x" if "speedup_vs_dict" in r else ""
        lines.append(f"| {r['variant']} | {r['groups']} | {r['records']} | {r['jax_ms']:.2f} | {r['records_per_s']:.3g} | "
                     f"{r['us_per_record']:.3f} | {r['compile_s']:.2f} | {peak} | {its} | {py} | {sp} | {dm} | {dsp} |")
    if head:
        h = info["headline"]
        lines += ["", f"Headline variant `{HEADLINE}`: time per record from {h['records'][0]} to {h['records'][-1]} records "
                  f"varies by a factor {h['max_over_min_us_per_record']:.2f} (max/min); peak bytes per record "
                  + ", ".join(f"{x:.0f}" for x in h["bytes_per_record"] if x) + "."]
    if "gated_bepo_speedup_16x8x50" in info:
        lines.append(f"Gated-BEPO (default config, public function) at 16 x 8 x 50: "
                     f"{info['gated_bepo_speedup_16x8x50']:.0f}x the plain-Python implementation, same run.")
    for v, x in info["speedup_vs_dict_16x8x50"].items():
        lines.append(f"`{v}` at 16 x 8 x 50: {x:.1f}x the efficient dict-based Python implementation, same run.")
    lines += ["", "## Group statistics: exact limb sums vs plain float32 sums", "",
              f"Per group of K T = {K * T} records (vmapped, as the kernels take them), two step groups of ~{K * T // 2} "
              "returns 150 +- 0.01 (the worst case of the verl-agent comparison); sigma against float64; "
              "order-independent = permuting each group's rows leaves every bit of sigma unchanged.", "",
              "| method | groups | records | segments | ms | max rel. error of sigma | order-independent |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for r in precision:
        lines.append(f"| {r['method']} | {r['groups']} | {r['records']} | {r['segments']} | {r['ms']:.2f} | "
                     f"{r['max_rel_err_sigma']:.2g} | {'yes' if r['order_independent'] else 'no'} |")
    write_lines(out_dir / "bench_advantages.md", lines)
    if not quiet:
        print("\n".join(lines))


def main(argv=None):
    p = parser(__doc__, full=True)
    p.add_argument("--quick", action="store_true", help="small sizes only (16 and 64 groups)")
    p.add_argument("--backend", choices=("cpu", "gpu", "tpu"), default=None, help="JAX platform (default: JAX's choice)")
    p.add_argument("--groups", default=None, help="comma-separated group counts (default 16,64,256,1024,3072)")
    p.add_argument("--variants", default=None, help="comma-separated variant labels (default: all)")
    p.add_argument("--python-max-groups", type=int, default=64, help="run the Python reference up to this many groups")
    p.add_argument("--dense-max-groups", type=int, default=256, help="run the S=N dense default up to this many groups")
    p.add_argument("--rows", action="store_true",
                   help="only the row-layout benchmark (from_rows -> kernel -> to_rows at 25/250/2500 groups)")
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    if args.backend:
        jax.config.update("jax_platforms", args.backend)
    if args.rows:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_rows(rows_rows([25, 250, 2500] if not args.groups else [int(g) for g in args.groups.split(",")]), out)
        return
    groups = [16, 64] if args.quick else [16, 64, 256, 1024, 3072]
    if args.groups:
        groups = [int(g) for g in args.groups.split(",")]
    variants = VARIANTS if not args.variants else {k: VARIANTS[k] for k in args.variants.split(",")}
    start = time.perf_counter()
    rows = []
    for g in groups:
        for label, (name, cfg, pyref) in variants.items():
            row = bench_one(label, name, cfg, pyref, g, python_max_groups=args.python_max_groups,
                            dense_max_groups=args.dense_max_groups)
            print(json.dumps(row), flush=True)
            rows.append(row)
            write(rows, [], args, Path(args.out), time.perf_counter() - start, quiet=True)  # a stopped run keeps its rows
    precision = precision_rows(groups[:2] + groups[-1:] if len(groups) > 2 else groups)
    for r in precision:
        print(json.dumps(r), flush=True)
    write(rows, precision, args, Path(args.out), time.perf_counter() - start)


if __name__ == "__main__":
    main()
