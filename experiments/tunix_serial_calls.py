"""Does Tunix's vanilla engine crash JAX when its model calls run at once? With and without the lock.

``StepCreditGRPOLearner`` puts a lock around the vanilla engine's ``generate``
(``serial_generate=True``, ``bepo_jax.integrations.tunix.serial_model_calls``): JAX 0.12's jit
is not safe when several threads make the first call of one jitted function at once, which
Tunix's sampler does under ``max_concurrency`` > 1 whenever a new sampler meets a new shape.
This program measures it. Each process trains ``--learners`` fresh learners one after another
(the toy Qwen3 of ``examples/tunix_agent.py``, one training step each: 2 groups x 4
trajectories), alternating 1 and 4 threads, then exits; ``--processes`` processes per variant,
a process of each variant side by side (2 at a time), all loading their programs from one
persistent compilation cache that a first serial process (2 learners, not counted) filled. Per process: how far it got and how it
ended -- finished, crashed during training (a signal), crashed at exit, or hung (no exit within
the time limit, killed) -- and its wall time. Writes experiments/results/tunix_serial_calls.{json,md}.

    python -m experiments.tunix_serial_calls                 # 3 processes x 24 learners per variant:
                                                             # ~8 min, ~20 when a process hangs (540 s limit)
    python -m experiments.tunix_serial_calls --processes 1 --learners 4   # a quick look

Python 3.12 with the tunix extra (``make install-py312``) only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from experiments.common import RESULTS, command, machine, parser, write_report

VARIANTS = {"lock (serial_generate=True)": True, "no lock (serial_generate=False)": False}
DONE = "learner done"


def child(learners: int, serial: bool) -> None:
    """Train ``learners`` fresh learners (1 and 4 threads in turn), printing a line after each."""
    from examples import tunix_agent as ta

    for i in range(learners):
        cluster = ta.make_cluster(micro_batch=2, steps=1)
        learner = ta.make_learner(cluster, "gated_bepo", max_concurrency=4 if i % 2 else 1,
                                  learner={"serial_generate": serial})
        learner.train(ta.prompts(2, 2))
        print(DONE, i, flush=True)


def ending(returncode: int | None, done: int, learners: int) -> str:
    """How a process ended, from its return code (None: killed at the time limit; negative, or 128 +
    the signal through a shell: a signal) and the learners it finished."""
    when = "at exit" if done == learners else "during training"
    if returncode is None:
        return f"hung {when}"
    if returncode < 0 or returncode >= 128:
        return f"crashed {when}"
    if returncode != 0:
        return f"failed {when} (exit code {returncode})"
    return "finished" if done == learners else f"stopped early ({done} of {learners} learners)"


def one_process(serial: bool, learners: int, limit: float, cache: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    argv = [sys.executable, "-X", "faulthandler", "-m", "experiments.tunix_serial_calls", "--child",
            "--learners", str(learners), "--serial", str(int(serial))]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=limit)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        code = None
    done = sum(line.startswith(DONE) for line in out.splitlines())
    fatal = [line for line in err.splitlines() if line.startswith("Fatal Python error")]
    return dict(returncode=code, learners_done=done, ending=ending(code, done, learners),
                seconds=round(time.perf_counter() - t0, 1), fatal=fatal[:1])


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--processes", type=int, default=3, help="processes per variant (default 3)")
    p.add_argument("--learners", type=int, default=24, help="learners per process (default 24)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serial", type=int, choices=(0, 1), default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.learners < 2 or args.processes < 1:
        p.error("--learners must be at least 2 (a 4-thread learner is every second one) and --processes at least 1")
    try:
        import tunix  # noqa: F401
    except ImportError:
        p.error("Tunix is not installed here: run this with Python 3.12's environment (make install-py312; "
                ".venv312/bin/python -m experiments.tunix_serial_calls)")
    if args.child:
        child(args.learners, bool(args.serial))
        return 0
    limit = 60.0 + 20.0 * args.learners
    jobs = [(name, serial) for _ in range(args.processes) for name, serial in VARIANTS.items()]
    with tempfile.TemporaryDirectory(prefix="tunix_serial_calls_cache_") as cache:
        # one serial process fills the compilation cache first (not counted): every learner after it
        # loads its programs, as the tests' workers do, instead of compiling for a minute
        warm_up = one_process(True, 2, 600.0, cache)
        with ThreadPoolExecutor(max_workers=2) as pool:
            runs = list(pool.map(lambda job: (job[0], one_process(job[1], args.learners, limit, cache)), jobs))
    results = {name: [r for n, r in runs if n == name] for name in VARIANTS}
    info = dict(command=command("tunix_serial_calls", argv), machine=machine(), learners=args.learners,
                processes=args.processes, time_limit_s=limit, warm_up=warm_up, results=results)
    lines = [f"# {__doc__.splitlines()[0]}", "", f"`{info['command']}`: {args.processes} processes per variant, "
             f"{args.learners} learners each (1 and 4 threads in turn), a time limit of {limit:.0f} s.", "",
             "| variant | process | learners done | ending | seconds |", "|---|---|---|---|---|"]
    for name, rows in results.items():
        for i, r in enumerate(rows):
            lines.append(f"| {name} | {i + 1} | {r['learners_done']} / {args.learners} | {r['ending']} | "
                         f"{r['seconds']} |")
    write_report(RESULTS / "tunix_serial_calls.json", info, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
