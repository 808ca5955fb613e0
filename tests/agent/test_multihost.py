"""Seeds in one program across processes: the launch recipe of docs/scaling.md, run as written
(two processes on localhost joined by JAX's distributed runtime, 2 simulated CPU devices each).

Checked against things outside the code under test: the single-process run of the same seeds
on the same 4-device mesh (metrics and parameters), the lock files the operating system's
processes left (who wrote each run directory), and a SIGKILL of one process mid-run (the
other stops within the heartbeat timeout; a relaunch equals the uninterrupted run).
"""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("step_time", "env_steps_per_s")
pytestmark = [pytest.mark.slow, pytest.mark.current_jax,  # CI runs them on 3.12 (current JAX, the pods')
              pytest.mark.xdist_group("multihost")]  # one worker: one uninterrupted run


def recipe() -> tuple[dict, list[str]]:
    """The environment and the ``bepo-jax compare`` arguments of docs/scaling.md's launch block."""
    text = (ROOT / "docs" / "scaling.md").read_text()
    block = next(b for b in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M) if "--coordinator" in b)
    line = next(ln for ln in block.replace("\\\n", " ").splitlines() if "bepo-jax compare" in ln)
    words = shlex.split(line.strip().rstrip("&"))
    env = dict(w.split("=", 1) for w in words[:words.index("bepo-jax")])
    return env, words[words.index("bepo-jax") + 1:]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(out: Path, logs: Path):
    """The recipe's processes, writing to ``out`` on a free port; returns the Popen objects."""
    env, args = recipe()
    port = _port()
    args = [a.replace("runs/pod", str(out)).replace("localhost:12355", f"localhost:{port}") for a in args]
    procs = []
    for i in range(2):
        argv = [sys.executable, "-m", "bepo_jax.cli", *[a.replace("$I", str(i)) for a in args]]
        full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        procs.append(subprocess.Popen(argv, env=full_env, stdout=open(logs / f"p{i}.log", "w"),
                                      stderr=subprocess.STDOUT))
    return procs


def finish(procs, logs: Path, timeout=600):
    for i, p in enumerate(procs):
        p.wait(timeout=timeout)
        assert p.returncode == 0, (logs / f"p{i}.log").read_text()[-3000:]


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def params(run: Path) -> np.ndarray:
    from bepo_jax.agent.train import load_run

    _, state, _ = load_run(run)
    import jax

    return np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(state.params)])


def same_rows(a: list[dict], b: list[dict], tol: float) -> None:
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b]
    for x, y in zip(a, b):
        assert set(x) == set(y)
        for k in x:
            if k not in TIMING and not isinstance(x[k], list):
                assert abs(x[k] - y[k]) <= tol * max(1.0, abs(x[k])), (x["iteration"], k, x[k], y[k])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    base = tmp_path_factory.mktemp("multihost")
    out = base / "pod"
    procs = launch(out, base)
    finish(procs, base)
    return base, out, [p.pid for p in procs]


def test_each_process_writes_only_the_runs_it_owns(uninterrupted):
    base, out, pids = uninterrupted
    for s in range(4):
        run = out / "gated_bepo" / f"seed{s}"
        holder = json.loads((run / ".lock").read_text())
        assert holder["pid"] == pids[s // 2], f"seed {s} was written by pid {holder['pid']}, its owner is {pids[s // 2]}"
        assert rows(run)[-1]["iteration"] == 8 and (run / "summary.json").exists()
        from bepo_jax.agent.rl.checkpoint import HostFiles

        assert HostFiles(run / "checkpoints").steps()[-1] == 8  # the owner's host files, no orbax collective
    assert (out / "compare.md").exists() and "| gated_bepo |" in (out / "compare.md").read_text()


def test_two_processes_equal_one_process_on_the_same_mesh(uninterrupted, tmp_path):
    """The same seeds, config and 4-device mesh in a single process: equal metrics and parameters."""
    base, out, _ = uninterrupted
    env, args = recipe()
    args = [a for a in args if a != "&"]
    ref = tmp_path / "ref"
    code = f"""
import jax
from bepo_jax.cli import _run_config, build_parser
from bepo_jax.credit.sharding import make_mesh
from bepo_jax.agent.train.compare import compare
args = build_parser().parse_args({[a.replace("$I", "0") for a in args]!r})
args.set = None
compare(_run_config(args, estimator="gated_bepo"), args.arms, seeds=args.seeds, out={str(ref)!r}, progress=False,
        mesh=make_mesh((4,), ("runs",)))
"""
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "XLA_FLAGS": env["XLA_FLAGS"].replace("=2", "=4"),
                       "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for s in range(4):
        same_rows(rows(out / "gated_bepo" / f"seed{s}"), rows(ref / "gated_bepo" / f"seed{s}"), 1e-5)
        np.testing.assert_allclose(params(out / "gated_bepo" / f"seed{s}"), params(ref / "gated_bepo" / f"seed{s}"),
                                   atol=1e-5)


def test_a_killed_process_stops_the_other_and_a_relaunch_equals_the_uninterrupted_run(uninterrupted, tmp_path):
    base, whole, _ = uninterrupted
    out = tmp_path / "pod"
    procs = launch(out, tmp_path)
    watched = out / "gated_bepo" / "seed2" / "metrics.jsonl"  # process 1's run
    deadline = time.monotonic() + 600
    while not (watched.exists() and len(watched.read_text().splitlines()) >= 4):
        assert time.monotonic() < deadline and procs[1].poll() is None, (tmp_path / "p1.log").read_text()[-2000:]
        time.sleep(0.02)
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    procs[0].wait(timeout=120)
    waited = time.monotonic() - killed
    log0 = (tmp_path / "p0.log").read_text()
    assert procs[0].returncode != 0, "the survivor finished although its peer died"
    assert waited < 60, f"the survivor took {waited:.0f} s to stop (heartbeat timeout 10 s)"
    assert "another task died" in log0 or "heartbeat timeout" in log0, log0[-2000:]
    assert rows(out / "gated_bepo" / "seed2")[-1]["iteration"] < 8, "killed after the run had finished"

    procs = launch(out, tmp_path)  # the same command again: every run continues from the common checkpoint
    finish(procs, tmp_path)
    for s in range(4):
        same_rows(rows(out / "gated_bepo" / f"seed{s}"), rows(whole / "gated_bepo" / f"seed{s}"), 0.0)
        np.testing.assert_array_equal(params(out / "gated_bepo" / f"seed{s}"), params(whole / "gated_bepo" / f"seed{s}"))
    (tmp_path / "waited.json").write_text(json.dumps({"survivor_stopped_after_s": waited}))
