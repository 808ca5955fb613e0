"""Every result table in README.md and docs/ equals the results file it cites
(experiments/readme_tables.py), and each renderer's table appears exactly once."""

import re

from experiments import formatting, readme_tables
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


def test_the_rivals_table_shows_numbers_only_when_every_arm_finished(tmp_path, monkeypatch):
    import json

    mod = _renderer()
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    assert mod.rivals_recipe().startswith("Not finished: no arm")
    arm = {"held_out_after": [0.5, 0.1], "held_out_change": [0.2, 0.1], "train_after": [0.6, 0.1],
           "train_change": [0.3, 0.1], "collapsed": 0, "seeds": 8}
    contrast = {"held_out": [0.031, 0.02], "held_out_verdict": "higher", "held_out_seeds_above_0": 7,
                "train": [0.01, 0.03], "train_verdict": "not separated", "train_seeds_above_0": 5, "seeds": 8,
                "held_out_by_eval": [[0, 0.0, 0.0], [60, 0.031, 0.02]]}
    d = {"arms": {"ecpo": {}, "grpo": {}}, "summary": {"ecpo": arm}, "pending": ["grpo"], "contrasts": {},
         "pending_contrasts": ["ecpo - grpo"]}
    (tmp_path / "rivals_recipe.json").write_text(json.dumps(d))
    partial = mod.rivals_recipe()
    assert partial.startswith("Not finished: 1 of 2 arms") and "0.5" not in partial
    d.update(summary={"ecpo": arm, "grpo": arm}, pending=[], contrasts={"ecpo - grpo": contrast}, pending_contrasts=[])
    (tmp_path / "rivals_recipe.json").write_text(json.dumps(d))
    table = mod.rivals_recipe()
    assert "| ecpo - grpo | +3.1 +- 2.0 | higher | 7/8 |" in table and "of 2 95% intervals" in table


def test_the_credit_mass_table_says_when_it_has_not_run(tmp_path, monkeypatch):
    import json

    mod = _renderer()
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    assert mod.credit_mass("rivals_recipe").startswith("Not measured yet: `python -m experiments.credit_mass")
    cell = lambda m: {"mass": [m, 0.01], "mean_abs": [2 * m, float("nan")], "mixed": [0.5, 0.02]}
    info = {"summary": {"grpo": {"initial": cell(0.4), "final": cell(0.3)}}, "optimizer_steps": 960, "batches": 2,
            "seeds": [400, 401]}
    (tmp_path / "rivals_recipe_credit_mass.json").write_text(json.dumps(info))
    table = mod.credit_mass("rivals_recipe")
    assert "| grpo | 0.400 +- 0.010 | 0.800 | 0.300 +- 0.010 | 0.600 | 0.500 +- 0.020 |" in table
    assert "960 optimizer steps per arm" in table and "seeds 400-401" in table


def test_the_llm_confirmatory_tables_wait_for_every_run(tmp_path, monkeypatch):
    import json

    mod = _renderer()
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    assert mod.llm_confirmatory().startswith("Not finished: no report yet")
    t = {"mean": 4.0, "half_width": 3.0, "seeds_above_0": 5, "seeds": 6, "p": 0.02}
    res = {"seeds": [300, 301], "seeds_complete": [300], "family_complete": False, "protocol": "docs/p.md",
           "overrides": {"iterations": 30}, "edge_iterations": 5,
           "contrasts": {"gated_bepo - grpo": {"primary": True, "test": t, "paper": 13.4, "toy_policy": "+7.3",
                                               "against_paper": "smaller", "per_seed": [2.5, -1.0],
                                               "holm": {"holm_p": 0.04, "decision": "confirmed"}}},
           "arms_summary": {"grpo": {"final": [0.2, 0.3], "initial": [0.1, 0.1], "invalid_rate": [0.1, 0.3],
                                     "gated_share": [float("nan")] * 2, "hours": 1.25,
                                     "held_out_change": [15.0, 8.5], "train_success_first_last": [0.25, 0.5],
                                     "invalid_rate_first_last": [0.4, 0.125]}}}
    (tmp_path / "llm_confirmatory").mkdir()
    (tmp_path / "llm_confirmatory" / "summary.json").write_text(json.dumps(res))
    partial = mod.llm_confirmatory()
    assert partial.startswith("Not finished: 1 of 2 seeds") and "+4.0" not in partial
    assert "+4.0" not in "\n".join(mod._llm_confirmatory_headline("llm_confirmatory"))
    res["family_complete"], res["seeds_complete"] = True, [300, 301]
    (tmp_path / "llm_confirmatory" / "summary.json").write_text(json.dumps(res))
    table = mod.llm_confirmatory()
    assert "| gated_bepo - grpo | +4.0 +- 3.0 (5/6 seeds > 0) | 0.020 | 0.040 | **confirmed** | +13.4 | smaller |" in table
    assert "| grpo | 0.250 | 0.100 | 0.200 | - | 1.2 |" in table
    assert "| grpo | +15.0 +- 8.5 | 0.250 -> 0.500 | 0.400 -> 0.125 |" in table
    assert "| 301 | 0.100 -> 0.300 | -1.0 |" in table
    bullets = mod._llm_confirmatory_headline("llm_confirmatory")
    assert bullets[2] == ("- gated_bepo - grpo: **+4.0 +- 3.0** (5/6 seeds > 0), above 0; Holm p 0.040, **confirmed**; "
                          "the paper +13.4: smaller; the character policy's test +7.3")
    # a test fixed in advance writes a sealed summary until its last run: the count and the hours, no number
    sealed = {"seeds": [500, 501], "protocol": "docs/p2.md", "sealed": True, "family_complete": False,
              "runs_finished_count": 3, "runs_total": 8, "evaluation": {"games": 48, "episodes": 4},
              "wall": {"finished_segments_hours": 2.25, "stopped_segments": 1}}
    (tmp_path / "llm_confirmatory_2").mkdir()
    (tmp_path / "llm_confirmatory_2" / "summary.json").write_text(json.dumps(sealed))
    assert mod.llm_confirmatory("llm_confirmatory_2").startswith("Not finished: 3 of 8 runs finished (2.2 h")
    line, = mod._llm_confirmatory_headline("llm_confirmatory_2")
    assert "48 games x 4 episodes" in line and "2 fresh seeds" in line and line.endswith(
        "3 of 8 runs finished (2.2 h of finished run segments, 1 stopped segment); fixed in advance, the test "
        "reads no number before every run has finished.")
    # the compute cap ended the test with one of two seeds complete: decided over that seed, and said so
    ended = {**res, "seeds_complete": [300], "family_complete": False, "decided": True,
             "ended_by_cap": {"time": "2026-12-09 10:00:00", "finished_hours": 29.5, "expected_run_hours": 1.5,
                              "seed_runs_left": 4, "cap_hours": 30.0, "runs_left": 4, "text": "the machine slowed."}}
    (tmp_path / "llm_confirmatory" / "summary.json").write_text(json.dumps(ended))
    table = mod.llm_confirmatory()
    assert table.startswith("The compute cap ended the test at 2026-12-09 10:00:00 (29.5 h of finished run segments; "
                            "the next seed's remaining 4 runs were expected to take 1.50 h each, past the 30 h cap; 4 runs not run): the machine "
                            "slowed. As the protocol fixes for that case, the decision is made over the 1 complete seed.")
    assert "**confirmed**" in table
    one = {**ended["ended_by_cap"], "seed_runs_left": 1, "runs_left": 1}
    assert "the next seed's remaining 1 run was expected to take 1.50 h, past the 30 h cap; 1 run not run)" in (
        formatting.ended_line(one, 1))
    head = mod._llm_confirmatory_headline("llm_confirmatory")
    assert head[0].endswith("the compute cap ended it with 1 of 2 seeds complete (2026-12-09 10:00:00); Holm's "
                            "decisions over those seeds:") and "**+4.0 +- 3.0**" in head[2]
