"""Every result table in README.md and docs/ equals the results file it cites
(experiments/readme_tables.py), and each renderer's table appears exactly once."""

import re

from experiments import readme_tables
from experiments.common import ROOT


def _renderer():
    return readme_tables


def test_tables_equal_their_results_files():
    mod = _renderer()
    seen = []
    for name in mod.DOCS:
        text = (ROOT / name).read_text()
        seen += re.findall(r"<!-- table:(\w+) -->", text)
        assert mod.render(text) == text, f"{name}: tables drifted; run python -m experiments.readme_tables"
    assert sorted(seen) == sorted(mod.TABLES), "every renderer has its table, once, in one of the files"
    others = [p for p in (ROOT / "docs").glob("*.md") if f"docs/{p.name}" not in mod.DOCS]
    assert not [p.name for p in others if "<!-- table:" in p.read_text()], "a rendered table outside DOCS"


def test_a_changed_number_is_caught():
    mod = _renderer()
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    start = text.index("<!-- table:kernel_speed -->")
    end = text.index("<!-- /table:kernel_speed -->")
    body = text[start:end]
    tampered = text[:start] + body.replace(" ms", " ms ", 1) + text[end:]
    assert mod.render(tampered) != tampered
