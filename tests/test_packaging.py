"""The package as a user installs it: a light kernel import, and the wheel and sdist built
from the repository's own files (their contents read back from the archives)."""

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("flax", "optax", "orbax", "tensorboardX", "matplotlib", "rich", "scipy", "jumanji", "textworld", "tunix")


def test_the_kernels_load_nothing_but_jax_and_numpy():
    """``import bepo_jax`` and a jitted kernel call load no training-stack module (a fresh
    interpreter's sys.modules); ``bepo_jax.ConfidenceHead`` brings Flax on first use."""
    code = """
import sys, numpy as np, jax
import bepo_jax as bj
batch = bj.StepBatch(obs_key=bj.hash_observations([[["a", "b"], ["a", "c"]]]), reward=np.ones((1, 2, 2), np.float32),
                     mask=np.ones((1, 2, 2), bool), outcome=np.array([[bj.SUCCESS, bj.FAILURE]]))
jax.block_until_ready(jax.jit(bj.gated_bepo_kernel)(batch, bj.GatedBEPOConfig()).advantage)
bj.from_rows(np.zeros(2, int), np.arange(2), np.zeros(2, int), ["x", "y"], np.ones(2), np.array([0, 1]))
print(sorted({m.split(".")[0] for m in sys.modules}))
bj.ConfidenceHead
print("flax" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    loaded = set(eval(out[0]))
    assert not loaded & set(HEAVY), f"a kernel import loads {sorted(loaded & set(HEAVY))}"
    assert out[1] == "True"


def _tracked_copy(dst: Path) -> Path:
    """The files a clean checkout has (git's list when this is a git checkout)."""
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in files.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    for n in names:
        if (ROOT / n).is_file():
            (dst / n).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / n, dst / n)
    return dst


# One worker runs this module (--dist loadgroup), so its module fixture is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("packaging")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import setuptools

    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (77, 0):
        pytest.fail(f"setuptools {setuptools.__version__} < 77 cannot build this package (the license expression); "
                    "requirements.lock pins 84.2.1: reinstall the environment (make .venv/.installed).")
    src = _tracked_copy(tmp_path_factory.mktemp("src"))
    dist = src / "dist"
    subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; b.build_sdist('dist'); "
                    "b.build_wheel('dist')"], cwd=src, check=True, capture_output=True)
    return next(dist.glob("*.whl")), next(dist.glob("*.tar.gz"))


def test_the_wheel_holds_the_package_its_licence_and_one_version(built):
    import bepo_jax

    wheel, _ = built
    names = zipfile.ZipFile(wheel).namelist()
    assert "bepo_jax/__init__.py" in names and "bepo_jax/credit/estimators/bepo.py" in names
    assert "bepo_jax/integrations/tunix/learner.py" in names and "bepo_jax/lab/learning.py" in names
    assert "bepo_jax/agent/train/loop.py" in names and "bepo_jax_install.py" in names  # the notebooks' installer
    assert not [n for n in names if n.startswith(("tests/", "experiments/", "examples/", "notebooks/"))]
    info = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    meta = Parser().parsestr(zipfile.ZipFile(wheel).read(info).decode())
    assert meta["Version"] == bepo_jax.__version__ == wheel.name.split("-")[1]
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.11"
    assert any(u.startswith("Homepage, https://") for u in meta.get_all("Project-URL"))
    assert "Programming Language :: Python :: 3.12" in meta.get_all("Classifier")
    extras = meta.get_all("Requires-Dist")
    assert any(d.startswith("google-tunix==0.1.7") and "3.12" in d for d in extras)
    body = meta.get_payload()
    assert "Gated-BEPO" in body
    relative = re.findall(r"\]\((?!https?://|#)([^)]+)\)", body)
    assert not relative, f"the package index's description has relative links {relative} (they break there)"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "bepo-jax = bepo_jax.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_sdist_ships_no_tests_without_their_helpers(built):
    _, sdist = built
    names = [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "docs/pypi.md", "bepo_jax/_version.py"} <= set(names)
    assert not [n for n in names if n.startswith("tests/") or n == "conftest.py"], \
        "tests need conftest.py, helpers and examples/"
