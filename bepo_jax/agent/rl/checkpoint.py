"""Orbax checkpoints of a training run: parameters, optimizer state, step, RNG state and
the trainer's data position, keeping the last N.

Orbax writes each checkpoint into a temporary directory and renames it when complete,
so a crash during a save leaves the earlier checkpoints as they were. A save that fails
(the disk filled, a write error) raises ``CheckpointError`` naming the cause and the
intact earlier steps, after removing its partial directory and reopening the manager
(orbax's manager is unusable after a failed background save), so those steps still
restore in the same process. A checkpoint
that cannot be read (truncated, corrupt) raises ``CheckpointError`` naming the step
and the earlier steps; ``restore_latest`` skips such steps and restores the newest
readable one. Restoring into ``Trainer.abstract_state()`` of another trainer places
the arrays on that trainer's mesh (8 devices -> 1 works).
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """A checkpoint could not be read."""


class Checkpointer:
    """``Checkpointer(directory, max_to_keep=3)``; ``save(step, state, meta)``;
    ``restore(target, step=None)``; ``restore_latest(target)``."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3, process: Optional[int] = None):
        """``process``: with several JAX processes, the one process that owns this directory: it
        alone writes and reads it, as host files (``HostFiles``: orbax's saves are collectives of
        every process, which a run owned by one process cannot take part in). Default: orbax."""
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep} must be >= 1.")
        self.directory = Path(directory).absolute()
        self.max_to_keep = max_to_keep
        self._host = HostFiles(self.directory) if process is not None and jax.process_count() > 1 else None
        # cleanup_tmp_directories: a save cut by a crash leaves a temporary directory; opening removes it
        self._options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                                     cleanup_tmp_directories=True)
        self._mngr = None if self._host else ocp.CheckpointManager(self.directory, options=self._options)

    def steps(self) -> list[int]:
        """The complete checkpoints (orbax's and host files', which a run written by a process of
        several leaves and a single process reads)."""
        found = set(HostFiles(self.directory).steps())
        if self._mngr is not None:
            self._mngr.reload()
            found |= {s for s in self._mngr.all_steps() if not HostFiles.holds(self.directory / str(s))}
        return sorted(found)

    def save(self, step: int, state: Any, meta: Optional[dict] = None) -> None:
        """Write ``state`` (any pytree of arrays) and ``meta`` (a JSON dict: data position,
        config, ...) as checkpoint ``step`` and wait until it is complete on disk."""
        if self._host is not None:
            try:
                self._host.save(int(step), state, dict(meta or {}), keep=self.max_to_keep)
            except OSError as err:  # HostFiles.save removed its partial directory
                raise self._save_failed(step, err) from err
            return
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta or {})))
        try:
            self._mngr.save(int(step), args=args, force=True)
            self._mngr.wait_until_finished()
        except Exception as err:  # orbax re-raises the background writer's error, of any type
            self._recover(int(step))
            raise self._save_failed(step, err) from err

    def _save_failed(self, step: int, err: BaseException) -> CheckpointError:
        """The error of a save that failed after its partial files were removed."""
        full = any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in _chain(err))
        return CheckpointError(
            f"saving checkpoint {step} under {self.directory} failed ("
            f"{'the disk is full: ' if full else ''}{type(err).__name__}: {str(err)[:200]}); its partial files "
            f"were removed and the earlier checkpoint(s) {self.steps() or 'none'} are intact and restore."
            + (" Free disk space, then resume." if full else ""))

    def _recover(self, step: int) -> None:
        """After a failed save: drop the step's partial directory and reopen the manager."""
        try:
            self._mngr.close()
        except Exception:  # the manager may re-raise the failed save once more
            pass
        # the failed save's background writers may still be finishing: remove until nothing reappears
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            partial = list(self.directory.glob(f"{step}.orbax-checkpoint-tmp*"))
            if not partial:
                time.sleep(0.2)
                if not list(self.directory.glob(f"{step}.orbax-checkpoint-tmp*")):
                    break
            for path in partial:
                shutil.rmtree(path, ignore_errors=True)
        if (self.directory / str(step)).exists() and step not in self._readable_steps():
            shutil.rmtree(self.directory / str(step), ignore_errors=True)
        self._mngr = ocp.CheckpointManager(self.directory, options=self._options)

    def _readable_steps(self) -> list[int]:
        try:
            return sorted(ocp.CheckpointManager(self.directory, options=self._options).all_steps())
        except Exception:
            return []

    def restore(self, target: Any, step: Optional[int] = None) -> tuple[Any, dict]:
        """Restore checkpoint ``step`` (default: the newest) into the structure, shapes and
        shardings of ``target`` (arrays or ``jax.ShapeDtypeStruct`` with shardings)."""
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no checkpoint under {self.directory}.")
        step = steps[-1] if step is None else int(step)
        if step not in steps:
            raise CheckpointError(f"no checkpoint {step} under {self.directory}; it has steps {steps}.")
        if HostFiles.holds(self.directory / str(step)):
            try:
                return HostFiles(self.directory).restore(step, target)
            except Exception as err:
                raise CheckpointError(f"checkpoint {step} under {self.directory} is unreadable "
                                      f"({type(err).__name__}: {str(err)[:300]}).") from err
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), target)
        try:
            out = self._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                   meta=ocp.args.JsonRestore()))
        except Exception as err:  # orbax/tensorstore raise many types for unreadable files
            earlier = [s for s in steps if s < step]
            hint = (f"the earlier checkpoint(s) {earlier} may restore: Checkpointer.restore_latest(target) "
                    "skips unreadable ones") if earlier else "there is no earlier checkpoint"
            raise CheckpointError(f"checkpoint {step} under {self.directory} is unreadable "
                                  f"({type(err).__name__}: {str(err)[:300]}); {hint}.") from err
        return out["state"], dict(out["meta"] or {})

    def restore_latest(self, target: Any) -> tuple[Any, dict, int]:
        """The newest readable checkpoint as (state, meta, step); unreadable newer ones are skipped
        (with a warning). Raises CheckpointError when none can be read."""
        errors = []
        for step in reversed(self.steps()):
            try:
                state, meta = self.restore(target, step)
                if errors:
                    import warnings

                    warnings.warn(f"skipped unreadable checkpoint(s): {'; '.join(errors)}", RuntimeWarning, stacklevel=2)
                return state, meta, step
            except CheckpointError as err:
                errors.append(str(err))
        raise CheckpointError(f"no readable checkpoint under {self.directory}: " + ("; ".join(errors) or "none saved"))

    def close(self) -> None:
        if self._mngr is not None:
            self._mngr.close()


class HostFiles:
    """Checkpoints as plain host files, for a run that one process of several owns: step ``s`` is
    the directory ``<dir>/<s>`` holding ``state.npz`` (every leaf by its key path), ``meta.json``
    and ``COMMITTED``; it is written under ``<s>.tmp-<pid>`` and renamed when complete, so a crash
    leaves the earlier steps as they were (a step saved again is renamed aside, not deleted, until
    the new copy is in place). ``Checkpointer`` reads these beside orbax's."""

    MARK = "COMMITTED"

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    @staticmethod
    def holds(path: Path) -> bool:
        return (path / HostFiles.MARK).exists()

    def steps(self) -> list[int]:
        """The committed steps; a step whose new copy never arrived (a crash between ``save``'s two
        renames) gets its old copy back first."""
        if not self.directory.exists():
            return []
        for p in self.directory.glob("*.old-*"):
            step = p.name.split(".old-")[0]
            if step.isdigit() and self.holds(p) and not (self.directory / step).exists():
                os.replace(p, self.directory / step)
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and self.holds(p))

    def save(self, step: int, state: Any, meta: dict, *, keep: int) -> None:
        import json

        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f"{step}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            leaves = jax.tree_util.tree_flatten_with_path(state)[0]
            with open(tmp / "state.npz", "wb") as f:
                np.savez(f, **{jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves})
                f.flush()
                os.fsync(f.fileno())
            (tmp / "meta.json").write_text(json.dumps(meta))
            (tmp / self.MARK).write_text(str(step))
            final = self.directory / str(step)
            aside = self.directory / f"{step}.old-{os.getpid()}"
            if final.exists():  # the same step saved again: the old copy stays whole until the new one is in place
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(final, aside)
            os.replace(tmp, final)
            shutil.rmtree(aside, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for old in self.steps()[:-keep]:
            shutil.rmtree(self.directory / str(old), ignore_errors=True)

    def restore(self, step: int, target: Any) -> tuple[Any, dict]:
        """Step ``step`` in ``target``'s structure; a leaf with a sharding is placed with it."""
        import json

        path = self.directory / str(step)
        with np.load(path / "state.npz") as data:
            leaves, tree = jax.tree_util.tree_flatten_with_path(target)
            out = []
            for k, t in leaves:
                v = data[jax.tree_util.keystr(k)]
                if tuple(v.shape) != tuple(t.shape) or v.dtype != np.dtype(t.dtype):
                    raise ValueError(f"{jax.tree_util.keystr(k)}: stored {v.shape} {v.dtype}, wanted {t.shape} "
                                     f"{t.dtype}")
                sharding = getattr(t, "sharding", None)
                out.append(jax.device_put(v, sharding) if sharding is not None else v)
        return jax.tree_util.tree_unflatten(tree, out), json.loads((path / "meta.json").read_text())


def _chain(err: BaseException):
    """``err`` and its causes / contexts."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__
