"""The notebooks' jupytext pairs are in sync (the .py:percent file is the source; the
.ipynb must hold the same cells), and each opens with a Colab badge and a set-up cell.
Running them top to bottom is ``make test-notebooks`` (and CI's ``make test-py312``)."""

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("*.py"))


def _cells(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_there_are_four_notebooks():
    assert [p.stem for p in SOURCES] == ["01_estimator_explorer", "02_knobs", "03_scale", "04_credit_lab"]


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_pair_in_sync(src):
    ipynb = src.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: run `jupytext --sync notebooks/{src.name}`"
    from_py = jupytext.read(src)
    from_nb = jupytext.read(ipynb)
    assert _cells(from_py) == _cells(from_nb), (
        f"{src.name} and {ipynb.name} differ: run `jupytext --sync notebooks/{src.name}` and commit both")


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_badge_and_setup_cell(src):
    nb = jupytext.read(src)
    first, setup = nb.cells[0], nb.cells[1]
    assert first.cell_type == "markdown" and "colab.research.google.com/github/" in first.source
    assert f"notebooks/{src.stem}.ipynb" in first.source
    assert setup.cell_type == "code" and "Set-up" in setup.source and "pip" in setup.source
