"""A run directory: what a run writes, and how a resumed run finds its place.

    config.json     the RunConfig (``--resume`` checks that only ``iterations`` changed)
    metrics.jsonl   one line per iteration (held-out evaluations as ``eval/...``, training
                    tasks as ``eval_train/...``); appended and fsync'ed line by line
    tb/             TensorBoard events of the same numbers
    checkpoints/    orbax checkpoints (``rl.checkpoint.Checkpointer``)
    curve.png       the success curve;  summary.json  what the finished run reports

A crash loses at most the iteration in flight: every file is written atomically or
appended, a cut last line of metrics.jsonl is ignored, and a resumed run rewrites the
metrics up to its checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .config import RunConfig
from .plots import plot_curve
from .report import run_summary


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of a run's metrics.jsonl (a line cut by a crash and everything after it dropped)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut by a crash: everything before it is intact
    return rows


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
            if k != "iteration" and not isinstance(v, list):
                self.tb.add_scalar(k, v, row["iteration"])
        self.tb.flush()

    def close(self, cfg: RunConfig) -> None:
        self.tb.close()
        if self.rows:
            plot_curve(self.rows, self.out / "curve.png", title=f"{cfg.env} / {cfg.estimator} (seed {cfg.seed})")


def finish(cfg: RunConfig, out: Path, rows: list[dict]) -> dict:
    """Write summary.json; returns the first and last evaluations: ``initial`` / ``final``
    (held-out tasks), ``initial_train`` / ``final_train`` (training tasks)."""
    pick = lambda row, p: {k[len(p):]: v for k, v in row.items() if k.startswith(p)}
    res = {"initial": pick(rows[0], "eval/"), "final": pick(rows[-1], "eval/"),
           "initial_train": pick(rows[0], "eval_train/"), "final_train": pick(rows[-1], "eval_train/"),
           "iterations": cfg.iterations, "out": str(out)}
    atomic_write(out / "summary.json", json.dumps(run_summary(cfg, rows, res), indent=2))
    return res


def progress_bar(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("success {task.fields[success]:.2f}"), TextColumn("{task.fields[step_time]:.2f} s/it"),
                    TimeElapsedColumn(), TimeRemainingColumn(), disable=not enabled)
