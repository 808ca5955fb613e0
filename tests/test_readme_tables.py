"""Every README result table equals the results file it cites (experiments/readme_tables.py)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _renderer():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "experiments" / "readme_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_tables_equal_their_results_files():
    mod = _renderer()
    text = (ROOT / "README.md").read_text()
    assert text.count("<!-- table:") == len(mod.TABLES), "every renderer has its table in the README"
    assert mod.render(text) == text, "README tables drifted: run python experiments/readme_tables.py"


def test_a_changed_number_is_caught():
    mod = _renderer()
    text = (ROOT / "README.md").read_text()
    start = text.index("<!-- table:kernel_speed -->")
    end = text.index("<!-- /table:kernel_speed -->")
    body = text[start:end]
    tampered = text[:start] + body.replace(" ms", " ms ", 1) + text[end:]
    assert mod.render(tampered) != tampered
