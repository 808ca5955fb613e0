"""experiments/confirmatory.py: the protocol's fixed pieces, its statistics, and the run -> rescore -> report chain."""

import json
import math

import numpy as np
import pytest

from experiments import claims, confirmatory as cf
from experiments.formatting import size_verdict


def test_the_protocol_is_fixed_in_code():
    exp = claims.EXPERIMENTS["confirmatory_runs"]
    assert [a.label for a in exp.arms] == ["gated_bepo", "grpo", "gigpo", "ladder_fp_added", "hgpo", "bepo_additive"]
    assert (exp.seeds, exp.first_seed, exp.iterations, exp.eval_every) == (16, 100, 60, 30)
    assert exp.base == claims.MAIN_JOB  # the recipe as it is
    # fresh seeds: no other experiment uses any of them (the earlier ones stop below 100, later ones start above 115)
    others = [e for n, e in claims.EXPERIMENTS.items() if not n.startswith("confirmatory_runs")]
    assert not set(exp.seed_ids(exp.seeds)) & {s for e in others for s in e.seed_ids(e.seeds)}
    # four chunks of four seeds cover the sixteen, each the protocol's experiment otherwise
    chunks = [claims.EXPERIMENTS[cf.chunk_name(c)] for c in range(cf.CHUNKS)]
    assert [s for e in chunks for s in e.seed_ids(e.seeds)] == list(range(100, 116))
    assert all((e.base, e.arms, e.contrasts, e.iterations) == (exp.base, exp.arms, exp.contrasts, exp.iterations)
               for e in chunks)
    assert [c.name for c in claims.CONFIRMATORY_PRIMARY] == [
        "gated_bepo - gigpo", "gated_bepo - ladder_fp_added", "gated_bepo - grpo", "gated_bepo - hgpo"]
    ladder = {a.label: a for a in claims.ESTIMATOR_ARMS}["ladder_fp_added"]
    assert (ladder.estimator, ladder.config) == ("bepo_nogate", {"eta_gated": 1.0})


def test_holm_matches_the_textbook_procedure():
    # sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2: the first two rejected, then stop
    p = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005}
    h = cf.holm(p)
    assert {k: v["rejected"] for k, v in h.items()} == {"d": True, "a": True, "c": False, "b": False}
    assert {k: round(v["holm_p"], 6) for k, v in h.items()} == {"d": 0.02, "a": 0.03, "c": 0.06, "b": 0.06}
    # step-down stops at the first acceptance even if a later p would pass its own threshold
    assert not cf.holm({"x": 0.2, "y": 0.011, "z": 0.012})["x"]["rejected"]
    # a NaN p-value (an untestable contrast) is last whatever its place in the dict, and never rejected;
    # m still counts it: the others are tested at alpha / 3 and alpha / 2, as the textbook's with p = 1 there
    for p in ({"n": float("nan"), "a": 0.01, "b": 0.02}, {"a": 0.01, "n": float("nan"), "b": 0.02}):
        h = cf.holm(p)
        assert [h[k]["rejected"] for k in ("a", "b", "n")] == [True, True, False] and math.isnan(h["n"]["holm_p"])
        assert h["a"]["holm_p"] == pytest.approx(0.03) and h["b"]["holm_p"] == pytest.approx(0.04)
    assert cf.decision({"mean": -2.0}, {"rejected": True}) == "contradicted"
    assert cf.decision({"mean": 2.0}, {"rejected": False}) == "not confirmed"


def test_paired_test_is_the_t_interval_and_the_t_test():
    x = np.array([3.0, -1.0, 4.0, 2.5, 0.5, 6.0])
    t = cf.paired_test(x)
    n, m, sd = len(x), x.mean(), x.std(ddof=1)
    half = 2.570581835636314 * sd / math.sqrt(n)  # t_{0.975, 5}
    tstat = m / (sd / math.sqrt(n))
    assert t["mean"] == pytest.approx(m) and t["half_width"] == pytest.approx(half)
    # the two-sided p of Student's t by the regularised incomplete beta: I_{df / (df + t^2)}(df / 2, 1 / 2)
    from scipy.special import betainc

    df = n - 1
    assert t["p"] == pytest.approx(betainc(df / 2, 0.5, df / (df + tstat ** 2)), rel=1e-9)
    assert 0.05 < t["p"] < 0.1 and t["seeds_above_0"] == 5


def test_size_verdicts():
    # words that follow from the interval alone (docs/results.md, How to read a table)
    assert size_verdict((6.2, 2.1), 13.4) == "the paper's size ruled out, interval below it"
    assert size_verdict((6.2, 2.1), 7.0) == "the paper's value inside"
    assert size_verdict((2.0, 3.1), 4.2) == "cannot tell (both 0 and the paper's value inside)"
    assert size_verdict((-4.0, 2.0), 7.4) == "the paper's size ruled out, interval below it"
    assert size_verdict((-1.0, 2.0), 7.4) == "the paper's size ruled out, interval below it"
    assert size_verdict((7.0, 2.4), 3.9) == "the paper's size ruled out, interval above it"
    assert size_verdict((1.0, float("nan")), 3.9) == "one seed"
    assert size_verdict((1.0, 3.2), None) == "no paper number"


@pytest.mark.slow
def test_run_and_report_chain(tmp_path):
    out, res = tmp_path / "runs", tmp_path / "res"
    common = ["--smoke", "--out", str(out), "--results", str(res)]
    with pytest.raises(SystemExit, match="--smoke writes elsewhere"):
        cf.main(["run", "--smoke", "--arms", "grpo"])
    cf.main(["run", "--arms", "gated_bepo,grpo", *common])
    chunk = res / "confirmatory"
    assert cf.chunk_done(chunk, 0, "gated_bepo") and cf.chunk_done(chunk, 0, "grpo")
    cf.main(["run", "--arms", "gated_bepo,grpo", *common])  # done chunks are not trained again
    cf.main(["report", *common])
    summary = json.loads((res / "confirmatory.json").read_text())
    rescored = json.loads((chunk / "confirmatory_runs_0_rescore.json").read_text())["runs"]
    d = [100 * (rescored[f"confirmatory_runs_0/gated_bepo/seed{s}"]["fresh"] -
                rescored[f"confirmatory_runs_0/grpo/seed{s}"]["fresh"]) for s in (100, 101)]
    got = summary["contrasts"]["gated_bepo - grpo"]["fresh_512"]
    assert got["mean"] == pytest.approx(np.mean(d)) and got["seeds"] == 2
    recorded = json.loads((chunk / "confirmatory_runs_0.json").read_text())["per_seed"]
    held = [100 * (a["held_out_after"] - b["held_out_after"]) for a, b in zip(recorded["gated_bepo"], recorded["grpo"])]
    assert summary["contrasts"]["gated_bepo - grpo"]["held_out_128"]["mean"] == pytest.approx(np.mean(held))
    assert not summary["family_complete"] and "holm" not in summary["contrasts"]["gated_bepo - grpo"]
    events = [json.loads(x) for x in (chunk / "log.jsonl").read_text().splitlines()]
    assert [(e["event"], e["arm"], e["chunk"]) for e in events] == [("start", "gated_bepo", 0), ("finish", "gated_bepo", 0),
                                                                    ("start", "grpo", 0), ("finish", "grpo", 0)]
    md = (res / "confirmatory.md").read_text()
    assert "The family is not complete yet" in md and "start gated_bepo" in md
    assert set(summary["gated_share"]) == {"gated_bepo"}  # GRPO builds no graph
    assert (res / "confirmatory.png").exists()
    # replay: the same commit on the same machine trains the chunk's first iterations again bit for bit ...
    cf.main(["replay", "--arms", "gated_bepo,grpo", "--iterations", "2", *common])
    rep = json.loads((chunk / "replay_0.json").read_text())["arms"]
    assert set(rep["gated_bepo"]["max_abs_difference"]) == {"held_out_before", "train_before", *cf.REPLAYED}
    assert "gated_share" not in rep["grpo"]["max_abs_difference"]  # GRPO records none
    assert all(v == 0 for r in rep.values() for v in r["max_abs_difference"].values())
    assert {r["stored_commit"] for r in rep.values()} == {events[0]["commit"]}
    # ... and a record that differs from the computation is seen, by as much as it differs
    f = chunk / "confirmatory_runs_0.json"
    info = json.loads(f.read_text())
    info["per_seed"]["gated_bepo"][1]["action_entropy"][1] += 0.01
    info["per_seed"]["gated_bepo"][0]["held_out_before"] -= 0.5
    f.write_text(json.dumps(info))
    cf.main(["replay", "--arms", "gated_bepo", "--iterations", "2", *common])
    d = json.loads((chunk / "replay_0.json").read_text())["arms"]["gated_bepo"]["max_abs_difference"]
    assert d["action_entropy"] == pytest.approx(0.01) and d["held_out_before"] == pytest.approx(0.5)
    assert d["top_action_share"] == 0 and d["gated_share"] == 0
    cf.main(["report", *common])
    assert "| 0 | gated_bepo |" in (res / "confirmatory.md").read_text()
    with pytest.raises(SystemExit, match="not trained yet"):
        cf.main(["replay", "--arms", "gigpo", *common])
    with pytest.raises(SystemExit, match="recorded fewer than 3 iterations"):
        cf.main(["replay", "--arms", "grpo", "--iterations", "3", *common])


def test_unit_commits_are_those_of_the_starts_that_finished():
    ev = [{"event": "start", "arm": "a", "chunk": 0, "commit": "c1"},
          {"event": "stopped", "arm": "a", "chunk": 0},
          {"event": "start", "arm": "a", "chunk": 0, "commit": "c2"},
          {"event": "finish", "arm": "a", "chunk": 0},
          {"event": "start", "arm": "a", "chunk": 1, "commit": "c3"},
          {"event": "finish", "arm": "a", "chunk": 1},
          {"event": "start", "arm": "b", "chunk": 0, "commit": "c4"}]  # still running: not a unit yet
    assert cf.unit_commits(ev) == {("a", 0): "c2", ("a", 1): "c3"}


def test_a_complete_family_is_decided_in_the_readme_and_the_results_page():
    """The README's bullets and docs/results.md's table once every primary contrast has its numbers: Holm's
    adjusted p and decision beside each (the p-values chosen so that Holm by hand gives 0.0004, 0.06, 0.4, 0.4)."""
    from experiments.formatting import confirmatory_primary
    from experiments.readme_tables import _confirmatory_headline

    primary = [c.name for c in claims.CONFIRMATORY_PRIMARY]
    p = dict(zip(primary, (0.2, 0.3, 0.0001, 0.02)))
    mean = dict(zip(primary, (1.0, -1.5, 7.0, 3.0)))

    def test(name):
        return {"mean": mean[name], "half_width": 2.0, "p": p[name], "seeds_above_0": 9, "seeds": 16,
                "size_verdict": "the paper's size"}

    contrasts = {n: {"terms": n.split(" - "), "paper": cf.PAPER.get(tuple(n.split(" - ")), (None, "none")),
                     "fresh_512": test(n), "held_out_128": test(n), "train": test(n)} for n in primary}
    for n, h in cf.holm(p).items():
        contrasts[n]["holm"] = {**h, "decision": cf.decision(contrasts[n]["fresh_512"], h)}
    s = {"primary": primary, "contrasts": contrasts, "family_complete": True, "seeds": list(range(100, 116)),
         "arms": ["a"] * 6, "arms_done": ["a"] * 6}
    bullets = {line.split("(")[1].split(")")[0]: line for line in _confirmatory_headline(s) if line.startswith("- ")}
    assert "Holm p < 0.001, **confirmed**" in bullets["gated_bepo - grpo"]
    assert "Holm p 0.060, **not confirmed**" in bullets["gated_bepo - hgpo"]
    assert "Holm p 0.400, **not confirmed**" in bullets["gated_bepo - gigpo"]
    assert "Holm p 0.400, **not confirmed**" in bullets["gated_bepo - ladder_fp_added"]
    table = confirmatory_primary(s)
    assert "| 0.060 | **not confirmed** |" in table and "| < 0.001 | **confirmed** |" in table
    assert "not complete" not in table and "family incomplete" not in table
    # before the last contrast has its numbers: no decision anywhere
    del s["contrasts"]["gated_bepo - hgpo"]
    s["family_complete"] = False
    for n in primary:
        s["contrasts"].get(n, {}).pop("holm", None)
    assert "no decision yet" in _confirmatory_headline(s)[0] and "Holm p" not in "\n".join(_confirmatory_headline(s))
    assert "The family is not complete yet" in confirmatory_primary(s)
