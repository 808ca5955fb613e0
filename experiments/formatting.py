"""How results read, shared by the experiments' reports and the README renderer (``readme_tables``):
intervals in points, where an interval lies against 0 and against the paper's number, p-values, the
paper's claims and the contrasts that test them, and the tables' line builders. Nothing here reads a
results file: each function formats what it is given."""

from __future__ import annotations

import numpy as np


def ci(pair, digits: int = 3) -> str:
    """``mean +- half-width`` (one seed: the mean alone)."""
    mean, half = pair
    return f"{mean:.{digits}f}" + ("" if np.isnan(half) else f" +- {half:.{digits}f}")


# The paper's claims and the E1 arms that test them: (claim, the paper's number as text, the number in points
# (None where the text we hold gives none), where it comes from, arm a, arm b); ours is the paired per-seed
# difference a - b. Every paper number is from another benchmark and model than ours (a small policy trained
# from scratch on generated Sokoban levels): "the paper's size" compares magnitudes across that gap.
PAPER_LADDER = "Gated-BEPO paper, ablation ladder (success rate; the benchmark and model are not named in the text we hold)"


CLAIMS = (
    ("Gated-BEPO beats GiGPO", "higher on WebShop and ALFWorld (no number in the text we have)", None,
     "Gated-BEPO paper, main results (WebShop, ALFWorld; Qwen2.5)", "gated_bepo", "gigpo"),
    ("Gated-BEPO beats HGPO", "+3.5 / +4.2 points (WebShop score / success)", 4.2,
     "Gated-BEPO paper, WebShop success (Qwen2.5)", "gated_bepo", "hgpo"),
    ("ladder: + fixed-point credit everywhere, added", "+3.9 (62.5 -> 66.4)", 3.9, PAPER_LADDER,
     "ladder_fp_added", "grpo"),
    ("ladder: + the gate", "+7.4 (66.4 -> 73.8)", 7.4, PAPER_LADDER, "bepo_additive", "ladder_fp_added"),
    ("ladder: + complementary mixing", "+2.1 (73.8 -> 75.9)", 2.1, PAPER_LADDER, "gated_bepo", "bepo_additive"),
    ("ladder, all four steps", "+13.4 (62.5 -> 75.9)", 13.4, PAPER_LADDER, "gated_bepo", "grpo"),
    ("GiGPO beats GRPO", "+9.8 Sokoban 6x6 (67.1 -> 76.9, Qwen2.5-VL-3B); +13.9 / +13.0 ALFWorld", 9.8,
     "GiGPO paper, visual Sokoban 6x6, Qwen2.5-VL-3B", "gigpo", "grpo"),
    ("GraphGPO beats GiGPO", "+10.1 Sokoban 6x6 (76.9 -> 87.0)", 10.1, "GraphGPO paper, visual Sokoban 6x6",
     "graphgpo", "gigpo"),
)


def size_verdict(mh, paper) -> str:
    """What our interval (mean, half-width in points) says about the paper's number (points, or None),
    in words that follow from the interval alone: "cannot tell" when it holds both 0 and the paper's
    value; "the paper's value inside" when it holds the paper's value and not 0; "the paper's size
    ruled out, interval below it" / "..., interval above it" when it excludes the paper's value (an
    equivalence-style statement at this setting, whatever the sign of ours)."""
    if paper is None:
        return "no paper number"
    m, h = mh
    if np.isnan(h):
        return "one seed"
    lo, hi = m - h, m + h
    if lo <= paper <= hi:
        return "cannot tell (both 0 and the paper's value inside)" if lo <= 0 <= hi else "the paper's value inside"
    return f"the paper's size ruled out, interval {'below' if hi < paper else 'above'} it"


def chance_line(n: int) -> str:
    """What chance alone gives in a table of ``n`` 95% intervals of differences that are all truly 0."""
    if n == 1:
        return ("Chance alone: a 95% interval of a difference that is truly 0 excludes 0 one time in 20; a single "
                "exclusion is not evidence by itself.")
    return (f"Chance alone: of {n} 95% intervals of differences that were all truly 0, about {0.05 * n:.1f} would "
            "exclude 0; a single exclusion among them is not evidence by itself.")


def paired_points(xs: list[dict], ys: list[dict], key: str) -> tuple[float, float]:
    """Mean +- 95% t over seeds of ``x[key] - y[key]``, seed by seed."""
    from bepo_jax.agent.train.report import mean_ci, paired_combination

    return mean_ci(paired_combination([(xs, 1.0), (ys, -1.0)], lambda x: x[key]))


def points(mh) -> str:
    """A (mean, half-width) of success differences in percentage points (one seed: the mean alone)."""
    return f"{100 * mh[0]:+.1f}" + ("" if np.isnan(mh[1]) else f" +- {100 * mh[1]:.1f}")


def verdict(mh) -> str:
    """Where the interval of a - b lies against 0 (every claim in CLAIMS says arm a is higher than arm b):
    "above 0", "below 0" or "not separated from 0"."""
    m, h = mh
    if abs(m) <= h:
        return "not separated from 0"
    return "above 0" if m > 0 else "below 0"


def p_value(p: float) -> str:
    """A p-value as the reports print it: three decimals, "< 0.001" below that, "n/a" for one seed."""
    return "n/a" if np.isnan(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def paired_cell(t: dict | None) -> str:
    """A paired test of the confirmatory report (points: mean +- 95% t half-width, two-sided p, seeds above 0)."""
    if t is None:
        return "not yet"
    return (f"{points((t['mean'] / 100, t['half_width'] / 100))} (p {p_value(t['p'])}, "
            f"{t['seeds_above_0']}/{t['seeds']} seeds > 0)")


def size_of(t: dict | None, r: dict) -> str:
    """``size_verdict`` of a confirmatory paired test ``t`` (points) against its contrast's paper number."""
    return "" if t is None else size_verdict((t["mean"], t["half_width"]), r["paper"][0])


def paper_cell(r: dict) -> str:
    """The paper's number for a confirmatory contrast, with where it comes from."""
    value, source = r["paper"]
    return f"{'none' if value is None else f'{value:+.1f}'} ({source})"


def confirmatory_primary(s: dict) -> str:
    """The confirmatory test's primary family (``confirmatory.json``, or its contents ``s``): each contrast on
    the 512 fresh levels with Holm's adjusted p and decision once every contrast has its numbers."""
    lines = ["| contrast | 512 fresh levels (primary) | Holm-adjusted p | decision | paper (source) | against the "
             "paper's number | 128 held-out levels | training tasks |", "|---|---|---|---|---|---|---|---|"]
    for name in s["primary"]:
        r = s["contrasts"].get(name)
        if r is None:
            lines.append(f"| {name} | arms not run yet | | | | | | |")
            continue
        h = r.get("holm")
        fresh = r.get("fresh_512")
        holm = f"{p_value(h['holm_p'])} | **{h['decision']}**" if h else "family incomplete | "
        lines.append(f"| {name} | {paired_cell(fresh)} | {holm} | {paper_cell(r)} | "
                     f"{size_of(fresh, r)} | {paired_cell(r.get('held_out_128'))} | "
                     f"{paired_cell(r.get('train'))} |")
    if not s["family_complete"]:
        lines += ["", "The family is not complete yet (arms or rescoring missing): no decision is made."]
    return "\n".join(lines)


# A primary contrast of the confirmatory test that CLAIMS has no line for, named for the README.
CONFIRMATORY_LABELS = {("gated_bepo", "ladder_fp_added"): "ladder: the gate and mixing together"}


def contrast_bullet(label: str, t: dict, holm: dict | None, after: str = "") -> str:
    """A confirmatory contrast as a README bullet: its paired interval (points) with the seeds above 0 and
    the plain reading, Holm's p and decision where the family is complete, then ``after``."""
    mh = (t["mean"] / 100, t["half_width"] / 100)
    return (f"- {label}: **{points(mh)}** ({t['seeds_above_0']}/{t['seeds']} seeds > 0), {verdict(mh)}"
            + (f"; Holm p {p_value(holm['holm_p'])}, **{holm['decision']}**" if holm else "") + after)


def arm_cells(s: dict) -> str:
    """An arm's held-out and training-task success after training and their changes (claims.py summary)."""
    return (f"{ci(s['held_out_after'])} | {ci(s['held_out_change'])} | {ci(s['train_after'])} | "
            f"{ci(s['train_change'])}")


def collapsed_seeds(s: dict) -> str:
    """An arm's collapsed seeds (claims.py summary) as 'k/n', or 'n/a' where its runs record
    no action shares (host environments such as TextWorld)."""
    return "n/a" if s["collapsed"] is None else f"{s['collapsed']}/{s['seeds']}"


def pending_rows(name: str, d: dict, columns: int) -> list[str]:
    """One row per arm that the results file ``name``.json lists as pending, ``columns`` cells wide."""
    return [f"| {label} | not finished (`{name}.json` lists it as pending) |" + " |" * (columns - 2)
            for label in d["pending"]]


def collapse_escape(d: dict) -> str:
    """The collapse probe (``experiments/collapse_escape.py``; its own report renders this
    table too): per estimator, the collapse pressure P on the shared batches, the mode's
    share after the update(s), each paired per batch against Gated-BEPO, and the mean
    credit on the mode's steps of failed trajectories and on off-mode steps by outcome."""
    n, ref = d["batches"], d["reference"]
    f = lambda mh, digits=3: f"{mh[0]:+.{digits}f} +- {mh[1]:.{digits}f}"
    lines = [f"| estimator | collapse pressure P | P minus {ref} | mode share after {d['steps']} update(s) | minus "
             f"{ref} | batches that lowered it | credit: mode steps of failed trajectories | off-mode steps of "
             "successful ones | off-mode steps of failed ones |", "|---|---|---|---|---|---|---|---|---|"]
    for label, s in d["summary"].items():
        diff = lambda k, digits=3: "reference" if label == ref else f(s[f"{k}_minus_{ref}"], digits)
        lines.append(f"| {label} | {f(s['pressure'], 4)} | {diff('pressure', 4)} | {ci(s['mode_share_after'])} | "
                     f"{diff('mode_share_after')} | {s['batches_pushed_out']}/{n} | {f(s['credit_mode_lost'])} | "
                     f"{f(s['credit_off_won'])} | {f(s['credit_off_lost'])} |")
    return "\n".join(lines)


def rescore_spans(info: dict) -> dict[str, str]:
    """Each experiment's seed range ("5-9")."""
    return {n: f"{seeds[0]}-{seeds[-1]}" for n, seeds in info["seeds"].items()}


def task_counts(info: dict, key: str) -> str:
    """The runs' scored (``scored_tasks``) or fresh (``fresh_tasks``) task counts, e.g. "8"."""
    return "/".join(map(str, sorted({r[key] for r in info["runs"].values()})))


def rescore_contrasts(info: dict) -> list[str]:
    """``rescore.py``'s table (its results json ``info``): each contrast on each seed group, on the tasks the
    runs were scored on (as recorded) and on the fresh ones, with the per-seed SDs observed and those the
    held-out tasks alone give."""
    span, m, f = rescore_spans(info), task_counts(info, "scored_tasks"), task_counts(info, "fresh_tasks")
    lines = [f"| contrast | seeds | on the {m} scored tasks (as recorded) | on the {f} fresh tasks | verdict | "
             "seeds > 0 | per-seed SD, scored / fresh | SD from the held-out tasks alone, scored / fresh |",
             "|---|---|---|---|---|---|---|---|"]
    for name, groups in info["summary"]["contrasts"].items():
        for label, g in groups.items():
            who = f"{span[label]} ({label})" if label in span else f"all {g['seeds']}"
            lines.append(f"| {name} | {who} | {points(g['recorded'])} | {points(g['fresh'])} | {g['fresh_verdict']} "
                         f"| {g['fresh_seeds_above_0']}/{g['seeds']} | {100 * g['sd_recorded']:.1f} / "
                         f"{100 * g['sd_fresh']:.1f} | {100 * g['sd_tasks_recorded']:.1f} / "
                         f"{100 * g['sd_tasks_fresh']:.1f} |")
    return lines


# the warm start's regime measures (warm_start.regime averages them per iteration)
REGIME = (("gated_share", "records the gate admits"), ("out_degree", "distinct successors per state"),
          ("mixed_share", "groups with mixed outcomes"))


def regime_lines(reg: dict, at=(1, 15, 30)) -> list[str]:
    head = " | ".join(f"{what}, iteration {it}" for key, what in REGIME for it in at)
    lines = ["| arm | " + head + " |", "|---|" + "---|" * (len(REGIME) * len(at))]
    for label, curves in reg.items():
        cells = []
        for key, _ in REGIME:
            by_it = {int(x[0]): x for x in curves.get(key, [])}
            cells += [f"{by_it[it][1]:.3f} ± {by_it[it][2]:.3f}" if it in by_it else "n/a" for it in at]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def warm_start_sentence(w: dict) -> str:
    """The warm start of experiments/warm_start.py in one sentence, from its ``sft.json`` ``w`` (the docs'
    table and the experiment's own report both say it this way)."""
    s, ho = w["sft"], w["held_out_after"]
    where = "states" if s["corruption"] == "state" else "steps"
    return (f"The warm start: the recipe's policy cloned from a shortest-path expert that errs at {s['noise']:.0%} of "
            f"the {where} ({s['corruption']} corruption; the expert itself succeeds on {w['demo_success']:.3f} of its "
            f"{w['demonstrations']} levels, seed {w['config']['seed']}), {s['epochs']} epochs, final loss "
            f"{w['loss'][-1]:.3f} nats per response token; held-out success on its seed's {ho['tasks']} levels "
            f"{w['held_out_before']['success_rate']:.3f} before, {ho['success_rate']:.3f} ± {ho['ci95']:.3f} after "
            "(95% t over levels).")


def contrast_lines(contrasts: dict, waiting: list[str]) -> list[str]:
    """The report's third table: each contrast (``contrast_summary``) at the end, with its verdict and the
    seeds above 0, and held-out at every evaluation; then the contrasts whose arms are not all run yet."""
    if not contrasts:
        return ["", f"Contrasts waiting for arms not run yet: {'; '.join(waiting)}."] if waiting else []
    its = [it for it, *_ in next(iter(contrasts.values()))["held_out_by_eval"]]
    lines = ["", "Contrasts, paired per seed (points, mean +- 95% t over seeds; 'seeds > 0': seeds where the "
             "contrast is above 0):", "", "| contrast | held-out after | verdict | seeds > 0 | training tasks after | "
             "verdict | seeds > 0 | " + " | ".join(f"held-out at {it}" for it in its) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(its)]
    for name, s in contrasts.items():
        cells = [f"{points(s[k])} | {s[k + '_verdict']} | {s[k + '_seeds_above_0']}/{s['seeds']}"
                 for k in ("held_out", "train")]
        lines.append(f"| {name} | " + " | ".join(cells) + " | "
                     + " | ".join(points(mh) for _, *mh in s["held_out_by_eval"]) + " |")
    if waiting:
        lines += ["", f"Contrasts waiting for arms not run yet: {'; '.join(waiting)}."]
    return lines


def credit_mass_lines(info: dict) -> list[str]:
    """``credit_mass.py``'s table: per arm, credit mass and mean |A| at the seeds' shared initial policy (the
    same batches for every arm) and at the arm's final policy, and its final batches' mixed groups."""
    lines = ["| arm | credit mass, initial policy | mean abs A, initial | credit mass, final policy | mean abs A, final "
             "| mixed groups, final |", "|---|---|---|---|---|---|"]
    for a, v in info["summary"].items():
        i, f = v["initial"], v["final"]
        lines.append(f"| {a} | " + " | ".join(ci(x) for x in (i["mass"], i["mean_abs"], f["mass"], f["mean_abs"],
                                                                    f["mixed"])) + " |")
    return lines


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: "1 stopped segment", "2 stopped segments"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def sealed_status(res: dict) -> str:
    """A sealed summary in one sentence: the runs finished and the hours spent, and why no number."""
    w = res["wall"]
    return (f"{res['runs_finished_count']} of {res['runs_total']} runs finished "
            f"({w['finished_segments_hours']:.1f} h of finished run segments, "
            f"{count(w['stopped_segments'], 'stopped segment')}); fixed in advance, the test reads no number before every run has finished.")


def ended_line(ended: dict, seeds: int) -> str:
    """The report's sentence for a test the compute cap ended: when, why, and over which seeds it decides."""
    n = ended["seed_runs_left"]
    return (f"The compute cap ended the test at {ended['time']} ({ended['finished_hours']:.1f} h of finished run "
            f"segments; the next seed's remaining {count(n, 'run')} {'was' if n == 1 else 'were'} expected to take "
            f"{ended['expected_run_hours']:.2f} h{'' if n == 1 else ' each'}, past the {ended['cap_hours']:.0f} h cap; "
            f"{count(ended['runs_left'], 'run')} not run): {ended['text']} "
            f"As the protocol fixes for that case, the decision is made over the {count(seeds, 'complete seed')}.")


def llm_confirmatory_lines(res: dict) -> list[str]:
    """The LLM confirmatory test's tables (``llm_confirmatory.report``'s summary): every contrast with its
    paired difference, p, Holm p and decision (once the family is complete), the paper's and the character
    policy's numbers; per arm its held-out success, invalid-command rate, gated share and hours; per seed
    each arm's held-out success before and after and each contrast's difference (a pilot's endpoint
    "eval_train": the training games' success, so labelled)."""
    games = "training-game" if res.get("endpoint") == "eval_train" else "held-out"
    lines = [f"| contrast | {games} success, paired difference (points), 95% t over seeds | p | Holm p | decision | "
             "the paper | against the paper | the character policy's test |", "|---|---|---|---|---|---|---|---|"]
    for name, c in res["contrasts"].items():
        t, h = c["test"], c.get("holm")
        diff = "not yet" if t is None else (f"{points((t['mean'] / 100, t['half_width'] / 100))} "
                                            f"({t['seeds_above_0']}/{t['seeds']} seeds > 0)")
        p = "" if t is None else f"{t['p']:.3f}"
        holm_p, dec = ("", "") if h is None else (f"{h['holm_p']:.3f}", f"**{h['decision']}**")
        paper = "none" if c["paper"] is None else f"{c['paper']:+.1f}"
        label = name if c["primary"] else f"{name} (secondary)"
        lines.append(f"| {label} | {diff} | {p} | {holm_p} | {dec} | {paper} | {c['against_paper'] or ''} | "
                     f"{c['toy_policy'] or ''} |")
    seen = [(n, c) for n, c in res["contrasts"].items() if c["primary"] and c.get("smallest_effect_at_power")]
    if seen:  # what the seeds could see at the SDs observed (the protocol's power was computed before the runs)
        lines += ["", f"What {len(res['seeds_complete'])} seeds could see: the per-seed differences' SD was "
                  + ", ".join(f"{c['sd']:.1f} points ({n})" for n, c in seen) + "; at those SDs they see "
                  + ", ".join(f"{c['smallest_effect_at_power']:.1f}" for _, c in seen)
                  + f" points with {res['power']:.0%} power (two-sided t at {res['first_level']:.3g}, Holm's first "
                  "step)."
                  + (f" At the SD the protocol planned with ({res['planned_sd']:.1f} points) they see "
                     f"{seen[0][1]['smallest_effect_at_planned_sd']:.1f} points." if res.get("planned_sd") else "")]
    lines += ["", f"| arm | {games} success after (mean over seeds) | before | invalid-command rate (all iterations) | "
              "gated share (records given step credit: gate open; GiGPO: in a step group of 2 or more) | "
              "iteration hours (sum of step times, evaluations excluded) |", "|---|---|---|---|---|---|"]
    for a, s in res["arms_summary"].items():
        f = lambda xs: f"{np.mean(xs):.3f}" if xs and not np.isnan(xs).all() else "-"
        lines.append(f"| {a} | {f(s['final'])} | {f(s['initial'])} | {f(s['invalid_rate'])} | {f(s['gated_share'])} | "
                     f"{s['hours']:.1f} |")
    edge, n_its = res["edge_iterations"], res.get("iterations") or res["overrides"]["iterations"]
    ends = f"iterations 1-{edge} -> {n_its - edge + 1}-{n_its}"
    lines += ["", f"| arm (descriptive, not a tested contrast) | {games} change after - before (points), 95% t over "
              f"seeds | training success, {ends} | invalid-command rate, {ends} |", "|---|---|---|---|"]
    for a, s in res["arms_summary"].items():
        if "held_out_change" not in s:  # no seed complete yet
            continue
        (m, h), tr, inv = s["held_out_change"], s["train_success_first_last"], s["invalid_rate_first_last"]
        lines.append(f"| {a} | {m:+.1f} +- {h:.1f} | {tr[0]:.3f} -> {tr[1]:.3f} | {inv[0]:.3f} -> {inv[1]:.3f} |")
    names = list(res["contrasts"])
    lines += ["", "| seed | " + " | ".join(f"{a}: before -> after" for a in res["arms_summary"]) + " | "
              + " | ".join(f"{n} (points)" for n in names) + " |", "|---" * (1 + len(res["arms_summary"]) + len(names))
              + "|"]
    for i, seed in enumerate(res["seeds_complete"]):
        arms = [f"{s['initial'][i]:.3f} -> {s['final'][i]:.3f}" for s in res["arms_summary"].values()]
        diffs = [f"{res['contrasts'][n]['per_seed'][i]:+.1f}" for n in names]
        lines.append(f"| {seed} | " + " | ".join(arms + diffs) + " |")
    return lines


def claims_table(d: dict) -> str:
    """The claims table of one claims.py experiment (the contents of ``experiments/results/<name>.json``)."""
    ps = d["per_seed"]
    lines = [f"| claim | paper (source) | ours: held-out success, paired difference (points), 95% t over {d['seeds']} "
             "seeds | verdict (exploratory: uncorrected) | against the paper's number | training tasks, same | verdict |",
             "|---|---|---|---|---|---|---|"]
    n = 0
    for claim, paper, value, source, a, b in CLAIMS:
        if a not in ps or b not in ps:
            lines.append(f"| {claim} ({a} - {b}) | {paper} ({source}) | not run yet | | | | |")
            continue
        held, train = (paired_points(ps[a], ps[b], k) for k in ("held_out_after", "train_after"))
        n += 2
        lines.append(f"| {claim} ({a} - {b}) | {paper} ({source}) | {points(held)} | {verdict(held)} | "
                     f"{size_verdict((100 * held[0], 100 * held[1]), value)} | {points(train)} | {verdict(train)} |")
    return "\n".join(lines + ["", chance_line(n)])
