"""Install bepo_jax's dependencies into a notebook runtime (Colab, Kaggle, a cloud VM) without
ever changing the runtime's JAX. Standard library only: it runs before bepo_jax can import.

The notebooks' set-up cell installs the package itself with ``pip install --no-deps SOURCE``
and then calls ``install(SOURCE)``, which installs bepo_jax with its extras, pinned to the
JAX and jaxlib the runtime already has (pip refuses rather than downgrade); only a runtime
without JAX gets the accelerator extra (``tpu`` on a TPU host, ``cuda`` where
``nvidia-smi`` exists). ``SOURCE`` is a pip requirement of your copy of the repository
(``git+https://github.com/<you>/bepo_jax``) or a folder holding it.

    python -m bepo_jax_install SOURCE     # the same from a shell
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, Optional, Sequence

SUPPORTED = "JAX 0.10.x on Python 3.11 and JAX 0.11.2-0.12.x on Python 3.12+"


def runtime_pins() -> list[str]:
    """``jax==V`` / ``jaxlib==V`` for the JAX the runtime has (empty when it has none)."""
    pins = []
    for name in ("jax", "jaxlib"):
        try:
            pins.append(f"{name}=={md.version(name)}")
        except md.PackageNotFoundError:
            pass
    return pins


def accelerator_extra(pins: Sequence[str]) -> Optional[str]:
    """The accelerator extra a runtime WITHOUT JAX needs (None where JAX is installed)."""
    if pins:
        return None
    if os.environ.get("COLAB_TPU_ADDR") or os.path.exists("/dev/accel0"):
        return "tpu"
    return "cuda" if shutil.which("nvidia-smi") else None


def requirement(source: str, extras: Sequence[str]) -> str:
    """The pip requirement of ``source`` with ``extras``: a URL as ``bepo-jax[...] @ URL``, a folder
    as ``FOLDER[...]``."""
    if not source:
        raise ValueError("BEPO_JAX_SOURCE is empty: set it to a pip requirement of your copy of bepo_jax "
                         "(git+https://github.com/<you>/bepo_jax) or to the folder that holds it.")
    tag = ",".join(extras)
    return f"bepo-jax[{tag}] @ {source}" if "://" in source else f"{source}[{tag}]"


def install(source: Optional[str] = None, *, extras: Sequence[str] = ("notebooks",),
            run: Callable[[list[str]], object] = subprocess.check_call) -> list[str]:
    """Install bepo_jax from ``source`` (default: the ``BEPO_JAX_SOURCE`` environment variable)
    with ``extras`` beside the runtime's own JAX; returns the pip command it ran."""
    source = os.environ.get("BEPO_JAX_SOURCE", "") if source is None else source
    pins = runtime_pins()
    extra = accelerator_extra(pins)
    spec = requirement(source, [*extras, *([extra] if extra else [])])
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pinned:
        pinned.write("\n".join(pins))
    cmd = [sys.executable, "-m", "pip", "install", "-q", spec, "-c", pinned.name]
    try:
        run(cmd)
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"pip refused to install bepo_jax beside this runtime's {', '.join(pins) or 'packages'}: "
                           f"bepo_jax supports {SUPPORTED}, and this never changes a runtime's JAX.") from err
    finally:
        os.unlink(pinned.name)
    return cmd


if __name__ == "__main__":
    install(sys.argv[1] if len(sys.argv) > 1 else None)
