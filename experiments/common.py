"""What every experiment shares: where results go, the machine they ran on, the command that
reproduces them, the argument parser, and how a results file is written.

Every experiment runs as a module from the repository root, ``python -m experiments.NAME``,
and records ``command(NAME)`` beside its numbers. Results recorded before the experiments
became a package name the older form, ``python -m experiments.NAME``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def parser(doc: Optional[str], *, full: bool = False) -> argparse.ArgumentParser:
    """An experiment's argument parser: its description is the module docstring's first
    paragraph, or the whole docstring (``full``, formatted as written: its usage lines)."""
    doc = doc or ""
    if full:
        return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def command(name: str, argv: Optional[Sequence[str]] = None) -> str:
    """The command that reproduces a run: ``python -m experiments.NAME`` and its arguments
    (``argv``, else this process's own)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python -m", f"experiments.{name}", *args])


def machine() -> dict:
    """The machine and library versions a result was measured with."""
    import jax
    import numpy as np

    import bepo_jax

    dev = jax.devices()[0]
    return dict(platform=platform.platform(), python=platform.python_version(), processor=platform.processor(),
                cpu_count=os.cpu_count(), jax=jax.__version__, jaxlib=jax.lib.__version__ if hasattr(jax, "lib") else "",
                numpy=np.__version__, bepo_jax=bepo_jax.__version__, backend=jax.default_backend(),
                device=str(getattr(dev, "device_kind", dev)), device_count=jax.device_count())


def git_commit() -> str:
    """The repository's commit (short), "+changes" when tracked files outside ``experiments/results/``
    differ from it (the results and logs the experiments write themselves change no computation);
    "unknown" outside a git checkout. Runs that take hours log it at every start."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = [line for line in status if not line[3:].strip('"').startswith("experiments/results/")]
    return head + ("+changes" if dirty else "")


@contextlib.contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """A detached git worktree of ``commit`` in a temporary folder, removed afterwards (the worktree
    and its folder): a baseline "before" runs that commit's code in its own process (``PYTHONPATH`` =
    the folder)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all (the package's ``atomic_write``: a temporary file
    renamed over it), creating the folder: a crash mid-write never leaves a cut results file."""
    from bepo_jax.agent.train.rundir import atomic_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)
    return path


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``repeats`` calls of ``fn`` (each waited for with
    ``jax.block_until_ready``)."""
    import jax

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def write_json(path: Path, data: Any, *, indent: int = 2) -> Path:
    """A results file as JSON (``write_text``'s guarantee)."""
    return write_text(path, json.dumps(data, indent=indent))


def write_report(path: Path, info: Any, md: str) -> None:
    """A finished program's results: ``info`` as JSON at ``path``, ``md`` beside it (``.md``), printed."""
    write_json(path, info)
    write_text(path.with_suffix(".md"), md)
    print(md)


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    """A Markdown results page from its lines (``write_text``'s guarantee)."""
    return write_text(path, "\n".join(lines) + "\n")
