"""Every code block in README.md and docs/ runs, or says in its first line why not.

Python blocks run file by file, in order, in one fresh interpreter per file (a block may
use what an earlier block of its page defined), in a scratch directory with 4 simulated
CPU devices. A block whose first line starts with "# Not run" (by the tests, as written)
or "# Not runnable offline" is compiled only. Shell blocks: every ``bepo-jax`` line parses
with the command's own parser, every ``make`` target exists, every script named exists.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import xla_flags

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SKIP = ("# Not run", "# Not runnable offline")
# pages whose blocks train or enumerate (tens of seconds each): with the slow tests
SLOW = {"docs/scaling.md", "docs/training.md", "docs/credit-lab.md"}


def blocks(page: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of ``page``."""
    return re.findall(r"^```(\w*)\n(.*?)^```", (ROOT / page).read_text(), re.S | re.M)


def test_every_fenced_block_has_a_language_we_check():
    for page in PAGES:
        for lang, _ in blocks(page):
            assert lang in ("python", "bash"), f"{page}: a ```{lang} block; write python or bash (or indent it)"


def _python(page: str) -> list[str]:
    return [body for lang, body in blocks(page) if lang == "python"]


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p
                                  for p in PAGES if _python(p)])
def test_python_blocks_run(page, tmp_path):
    code = _python(page)
    for i, body in enumerate(code):
        compile(body, f"{page} block {i + 1}", "exec")
    runnable = [b for b in code if not b.lstrip().startswith(SKIP)]
    for b in code:
        if b.lstrip().startswith(SKIP):
            assert len(b.lstrip().splitlines()[0]) > len("# Not run by the tests: x"), f"{page}: say why not"
    if not runnable:
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=xla_flags(4),
               MPLBACKEND="Agg")
    script = "\n\n".join(f"# --- {page}, block {i + 1}\n{b}" for i, b in enumerate(runnable))
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"{page}: a code block failed\n{r.stderr[-3000:]}"


def _shell_lines(page: str) -> list[str]:
    lines = []
    for lang, body in blocks(page):
        if lang != "bash":
            continue
        joined = body.replace("\\\n", " ")
        lines += [ln.split(" #", 1)[0].strip() for ln in joined.splitlines() if ln.strip() and not ln.startswith("#")]
    return lines


def test_shell_blocks_name_real_commands():
    from bepo_jax.cli import build_parser

    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    checked = 0
    for page in PAGES:
        for line in _shell_lines(page):
            words = shlex.split(line.replace("$I", "0"))  # a launch loop's process id
            while words and re.match(r"^\w+=", words[0]):  # PYTHONPATH=. and the like
                words = words[1:]
            if words[:1] == ["nice"]:
                words = words[1:]
            if words and words[-1] == "&":
                words = words[:-1]
            if not words:
                continue
            if words[0] == "bepo-jax":
                try:
                    build_parser().parse_args(words[1:])
                except SystemExit:
                    pytest.fail(f"{page}: `{line}` does not parse with bepo-jax's own parser")
            elif words[0] == "make":
                assert set(words[1:]) <= targets, f"{page}: `{line}` names a target the Makefile lacks"
            elif words[0] == "python" and words[1:2] and words[1].endswith(".py"):
                assert (ROOT / words[1]).exists(), f"{page}: `{line}` names a script that does not exist"
            elif words[0] == "python" and words[1:2] == ["-m"] and words[2].startswith("experiments."):
                assert (ROOT / (words[2].replace(".", "/") + ".py")).exists(), \
                    f"{page}: `{line}` names an experiment module that does not exist"
            checked += 1
    assert checked > 20


@pytest.mark.parametrize("page", ["README.md", "docs/estimators.md"])
def test_the_estimator_table_is_the_registry(page):
    """The table of every registered estimator in README.md and docs/estimators.md equals
    ``estimator_table()`` (refresh it with ``bepo-jax estimators --markdown``)."""
    from bepo_jax.credit.estimators.registry import estimator_table

    text = (ROOT / page).read_text()
    found = re.search(r"<!-- registry:estimators -->\n(.*?)<!-- /registry:estimators -->", text, re.S)
    assert found, f"{page} lost its registry table markers"
    assert found.group(1).strip().splitlines() == estimator_table(), \
        f"{page}'s estimator table differs from the registry; paste `bepo-jax estimators --markdown`"


def test_plain_pytest_runs_the_docstring_examples_of_every_room():
    """``pytest`` with no arguments collects the package's docstring examples (pyproject.toml), and each room of
    the package has some: its examples run as tests wherever the suite runs."""
    import doctest
    import tomllib

    opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--doctest-modules" in opts["addopts"].split() and "bepo_jax" in opts["testpaths"]
    parser = doctest.DocTestParser()
    for room in ("credit", "agent", "lab", "integrations"):
        examples = sum(len(parser.get_examples(p.read_text())) for p in (ROOT / "bepo_jax" / room).rglob("*.py"))
        assert examples > 0, f"bepo_jax/{room} has no docstring example"
