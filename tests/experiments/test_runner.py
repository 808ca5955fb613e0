"""``python -m experiments``: it lists every program of experiments/ (a module with ``main`` and a ``__main__``
guard, compared with the folder's files read here independently) and runs one by name with its arguments."""

import re

import pytest

from experiments import __main__ as runner
from experiments.common import ROOT


def test_the_runner_lists_every_program_and_only_programs():
    files = sorted(p for p in (ROOT / "experiments").glob("*.py") if not p.name.startswith("_"))
    expected = {p.stem for p in files
                if re.search(r"^def main\(", p.read_text(), re.M) and 'if __name__ == "__main__"' in p.read_text()}
    assert set(runner.programs()) == expected
    assert {"llm_learning", "llm_pilot", "readme_tables"} <= expected and "common" not in expected
    # every program has one purpose in the listing, and the purposes name no program that is not there
    grouped = [n for names in runner.PURPOSES.values() for n in names]
    assert sorted(grouped) == sorted(expected)


def test_the_runner_runs_a_program_by_name_and_refuses_an_unknown_one(capsys):
    with pytest.raises(SystemExit) as done:
        runner.main(["record_main_job", "--help"])  # argparse's help: the program's own parser ran
    assert done.value.code == 0 and "record-main-job" in capsys.readouterr().out
    assert runner.main(["llm_pilots"]) == 2 and "did you mean llm_pilot" in capsys.readouterr().err
    assert runner.main([]) == 0 and "llm_confirmatory_2" in capsys.readouterr().out
