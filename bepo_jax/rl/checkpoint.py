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
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """A checkpoint could not be read."""


class Checkpointer:
    """``Checkpointer(directory, max_to_keep=3)``; ``save(step, state, meta)``;
    ``restore(target, step=None)``; ``restore_latest(target)``."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep} must be >= 1.")
        self.directory = Path(directory).absolute()
        # cleanup_tmp_directories: a save cut by a crash leaves a temporary directory; opening removes it
        self._options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                                     cleanup_tmp_directories=True)
        self._mngr = ocp.CheckpointManager(self.directory, options=self._options)

    def steps(self) -> list[int]:
        self._mngr.reload()
        return sorted(self._mngr.all_steps())

    def save(self, step: int, state: Any, meta: Optional[dict] = None) -> None:
        """Write ``state`` (any pytree of arrays) and ``meta`` (a JSON dict: data position,
        config, ...) as checkpoint ``step`` and wait until it is complete on disk."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta or {})))
        try:
            self._mngr.save(int(step), args=args, force=True)
            self._mngr.wait_until_finished()
        except Exception as err:  # orbax re-raises the background writer's error, of any type
            self._recover(int(step))
            full = any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in _chain(err))
            raise CheckpointError(
                f"saving checkpoint {step} under {self.directory} failed ("
                f"{'the disk is full: ' if full else ''}{type(err).__name__}: {str(err)[:200]}); its partial files "
                f"were removed and the earlier checkpoint(s) {self.steps() or 'none'} are intact and restore."
                + (" Free disk space, then resume." if full else "")) from err

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
        self._mngr.close()


def _chain(err: BaseException):
    """``err`` and its causes / contexts."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__
