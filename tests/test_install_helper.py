"""bepo_jax_install (the notebooks' set-up): the pip command it builds, checked against the runtime's
own JAX version, without running pip."""

import importlib.metadata as md
import subprocess

import pytest

import bepo_jax_install as bi


def _capture():
    seen = []
    return seen, lambda cmd: seen.append(list(cmd))


def test_it_pins_the_runtimes_jax_and_installs_the_extras_from_a_url():
    seen, run = _capture()
    bi.install("git+https://example.org/me/bepo_jax", run=run)
    cmd = seen[0]
    assert cmd[1:4] == ["-m", "pip", "install"] and "bepo-jax[notebooks] @ git+https://example.org/me/bepo_jax" in cmd
    constraints = cmd[cmd.index("-c") + 1]
    assert not __import__("os").path.exists(constraints), "the constraints file is removed afterwards"
    assert bi.runtime_pins() == [f"jax=={md.version('jax')}", f"jaxlib=={md.version('jaxlib')}"]


def test_a_folder_source_and_the_environment_variable(monkeypatch, tmp_path):
    seen, run = _capture()
    monkeypatch.setenv("BEPO_JAX_SOURCE", str(tmp_path))
    bi.install(run=run)
    assert f"{tmp_path}[notebooks]" in seen[0]


def test_a_runtime_without_jax_gets_the_accelerator_extra(monkeypatch):
    seen, run = _capture()
    monkeypatch.setattr(bi, "runtime_pins", lambda: [])
    monkeypatch.setattr(bi.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
    monkeypatch.setattr(bi.os.path, "exists", lambda p: False)
    bi.install("/src", run=run)
    assert "/src[notebooks,cuda]" in seen[0]
    monkeypatch.setenv("COLAB_TPU_ADDR", "10.0.0.1")
    assert bi.accelerator_extra([]) == "tpu"
    assert bi.accelerator_extra(["jax==0.10.2"]) is None


def test_errors_name_the_fix(monkeypatch):
    monkeypatch.delenv("BEPO_JAX_SOURCE", raising=False)
    with pytest.raises(ValueError, match="BEPO_JAX_SOURCE is empty"):
        bi.install(run=lambda cmd: None)

    def refuse(cmd):
        raise subprocess.CalledProcessError(1, cmd)

    with pytest.raises(RuntimeError, match="never changes a runtime's JAX"):
        bi.install("/src", run=refuse)
