"""A run directory: what a run writes, and how a resumed run finds its place.

    config.json     the RunConfig (``--resume`` checks that only ``iterations`` changed)
    metrics.jsonl   one line per iteration (held-out evaluations as ``eval/...``, training
                    tasks as ``eval_train/...``); appended and fsync'ed line by line
    tb/             TensorBoard events of the same numbers
    checkpoints/    orbax checkpoints (``rl.checkpoint.Checkpointer``)
    curve.png       the success curve;  summary.json  what the finished run reports

    .lock           held (``fcntl.flock``) by the process writing the run: a second writer
                    is refused (``RunLock``); the operating system releases it when that
                    process ends, so a crashed run never leaves it stuck

A crash loses at most the iteration in flight: every file is written atomically or
appended, a cut last line of metrics.jsonl is dropped with a warning naming it, and a
resumed run rewrites the metrics up to its checkpoint.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

from .config import RunConfig
from .plots import plot_curve
from .report import run_summary


def atomic_write(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole or keeps what it held: a temporary file of its own in the same
    folder (two writers never share one), flushed to disk, then renamed over ``path``."""
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of a run's metrics.jsonl. A line cut by a crash and everything after it are
    dropped, with a warning that names the line and the last iteration kept."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            # a line cut by a crash: everything before it is intact
            kept = rows[-1]["iteration"] if rows else None
            warnings.warn(f"{path}: line {i + 1} of {len(lines)} is cut ({line[:60]!r}...); it and the "
                          f"{len(lines) - i - 1} line(s) after it are dropped, the rows up to iteration {kept} are "
                          "kept.", RuntimeWarning, stacklevel=2)
            break
    return rows


class RunLock:
    """``with RunLock(out):`` -- the one process writing run directory ``out`` (an exclusive,
    non-blocking ``fcntl.flock`` on ``out/.lock``, which also records the holder). A second
    writer raises ``ValueError`` naming the holder; the lock dies with its process, so a
    crashed run never leaves it stuck. (flock is per machine: two hosts writing one run
    directory over a network file system are not told apart.)"""

    def __init__(self, out: str | Path):
        self.path = Path(out) / ".lock"
        self._fd = None

    def __enter__(self):
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ValueError(f"{self.path.parent} is being written by another run ({holder}); wait for it to "
                             "finish or stop it, or choose another --out. (A crashed run releases the lock with "
                             "its process.)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                                  "command": " ".join(sys.argv)[:300]}).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc):
        import fcntl

        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        return False


def is_finished(run_dir: str | Path, iterations: int) -> bool:
    """The run reached ``iterations`` and evaluated its last one."""
    done = read_metrics(run_dir)
    return bool(done) and done[-1]["iteration"] >= iterations and "eval/success_rate" in done[-1]


def is_finished_run_of(run_dir: str | Path, cfg: RunConfig) -> bool:
    """``run_dir`` holds ``cfg``'s run, finished (``is_finished``). A finished run of another config
    raises: reading it in place of ``cfg``'s would report something else (another eval_tasks, groups,
    estimator config, ...) under ``cfg``'s name."""
    if not is_finished(run_dir, cfg.iterations):
        return False
    stored = RunConfig.from_stored(json.loads((Path(run_dir) / "config.json").read_text()))
    if stored != cfg:
        diff = sorted(k for k, v in cfg.to_dict().items() if stored.to_dict()[k] != v)
        raise ValueError(f"{run_dir} holds a finished run whose config differs from the one asked for in {diff}; "
                         "choose another --out, or move that run directory away.")
    return True


HELD_OUT_FILE = "held_out.json"  # which held-out pools the run is scored on (envs.pools.HELD_OUT_POOLS)


def held_out_pools(run_dir: str | Path) -> str:
    """The held-out pools of a run directory, as recorded in ``HELD_OUT_FILE``: "structural" (new in
    structure, every run since 2026-12-06), "disjoint" (new in content, runs of 2026-12-04 to 12-06), or
    "seeded" for a run written before (a config.json without that file: its pools were the plain seeded
    sequence). A resume, an evaluation or a rescoring keeps the run's own, so its numbers stay comparable."""
    run_dir = Path(run_dir)
    marker = run_dir / HELD_OUT_FILE
    if marker.exists():
        return json.loads(marker.read_text())["held_out"]
    return "seeded" if (run_dir / "config.json").exists() else "structural"


def prepare(cfg: RunConfig, out: Path, *, resume: bool) -> RunConfig:
    """Check ``out`` against ``cfg`` and write config.json; returns the config to run
    (on resume: the stored one, with the new ``iterations``)."""
    cfg_path = out / "config.json"
    if cfg_path.exists() and not resume:
        raise ValueError(f"{out} already holds a run (config.json); pass resume=True (--resume) to continue it, "
                         "or choose another --out.")
    if resume and cfg_path.exists():
        stored = RunConfig.from_stored(json.loads(cfg_path.read_text()))
        if stored.replace(iterations=cfg.iterations) != cfg:
            diff = sorted(k for k, v in cfg.to_dict().items() if stored.to_dict()[k] != v and k != "iterations")
            raise ValueError(f"resume: the config differs from {cfg_path} in {diff}; resume with the stored config "
                             "(only iterations may change).")
        cfg = stored.replace(iterations=cfg.iterations)
    out.mkdir(parents=True, exist_ok=True)
    pools = held_out_pools(out)  # before config.json: a new run's is "structural", an older run's its own
    if not (out / HELD_OUT_FILE).exists():
        atomic_write(out / HELD_OUT_FILE, json.dumps({"held_out": pools}))
    atomic_write(cfg_path, json.dumps(cfg.to_dict(), indent=2))
    return cfg


class MetricsLog:
    """metrics.jsonl and TensorBoard of one run, continuing after iteration ``start``
    with ``rows`` (the earlier rows, rewritten so that nothing after the checkpoint stays)."""

    def __init__(self, out: Path, rows: list[dict], start: int):
        from tensorboardX import SummaryWriter

        self.out, self.rows = out, list(rows)
        atomic_write(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in self.rows))
        self.tb = SummaryWriter(str(out / "tb"), purge_step=start + 1 if start else None)

    def append(self, row: dict) -> None:
        self.rows.append(row)
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        for k, v in row.items():
            if k != "iteration" and isinstance(v, (int, float)):  # not lists, nor a None (no interval)
                self.tb.add_scalar(k, v, row["iteration"])
        self.tb.flush()

    def close(self, cfg: RunConfig) -> None:
        self.tb.close()
        if self.rows:
            plot_curve(self.rows, self.out / "curve.png", title=f"{cfg.env} / {cfg.estimator} (seed {cfg.seed})")


def finish(cfg: RunConfig, out: Path, rows: list[dict], *, write: bool = True) -> dict:
    """Write summary.json (unless ``write`` is False: another process owns ``out``); returns the
    first and last evaluations: ``initial`` / ``final`` (held-out tasks), ``initial_train`` /
    ``final_train`` (training tasks)."""
    pick = lambda row, p: {k[len(p):]: v for k, v in row.items() if k.startswith(p)}
    res = {"initial": pick(rows[0], "eval/"), "final": pick(rows[-1], "eval/"),
           "initial_train": pick(rows[0], "eval_train/"), "final_train": pick(rows[-1], "eval_train/"),
           "iterations": cfg.iterations, "out": str(out)}
    if write:
        atomic_write(out / "summary.json", json.dumps(run_summary(cfg, rows, res), indent=2))
    return res


def progress_bar(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("success {task.fields[success]:.2f}"), TextColumn("{task.fields[step_time]:.2f} s/it"),
                    TimeElapsedColumn(), TimeRemainingColumn(), disable=not enabled)
