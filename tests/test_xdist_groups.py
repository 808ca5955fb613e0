"""The suite's expensive module fixtures (a two-process training run, a Tunix learner, trained runs
to rescore, a built wheel) are built once because ``--dist loadgroup`` keeps an ``xdist_group``
on one worker. Under pytest 9.2 with pytest-xdist 3.8 that grouping silently stops
(pytest-dev/pytest-xdist#1386) and each fixture is built once per worker: this runs the
Makefile's pytest options on a two-module suite and counts the workers that built one fixture."""

import subprocess
import sys

SUITE = {
    "test_grouped.py": '''
import os
import pytest

pytestmark = pytest.mark.xdist_group("g")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    with open(os.environ["BUILT_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")


@pytest.mark.parametrize("i", range(6))
def test_uses_it(built, i):
    pass
''',
    "test_others.py": '''
import pytest


@pytest.mark.parametrize("i", range(12))
def test_other(i):
    pass
''',
}


def test_an_xdist_group_runs_on_one_worker(tmp_path):
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    log = tmp_path / "built.log"
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p",
                        "no:cacheprovider", str(tmp_path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={"BUILT_LOG": str(log), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "18 passed" in r.stdout
    workers = log.read_text().split()
    assert len(workers) == 1, f"the module fixture was built by {len(workers)} workers: xdist_group is not honoured"
