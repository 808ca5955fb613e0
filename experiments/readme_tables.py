"""Render the result tables of README.md and docs/ from the results files they cite.

Every table in the files of ``DOCS`` between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``
is generated here from a file under experiments/results/, so a README figure always
equals its file. ``tests/experiments/test_readme_tables.py`` fails when they drift.

    python -m experiments.readme_tables          # rewrite the tables in README.md and docs/
    python -m experiments.readme_tables --check  # exit 1 if one of them differs
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np

from experiments.common import ROOT, parser
from experiments.formatting import (ci, CLAIMS, ended_line, chance_line, paired_points, points, verdict, size_of,
                                    confirmatory_primary, CONFIRMATORY_LABELS, contrast_bullet, arm_cells,
                                    collapsed_seeds, pending_rows, collapse_escape, rescore_contrasts, regime_lines,
                                    warm_start_sentence, contrast_lines, credit_mass_lines, llm_confirmatory_lines,
                                    sealed_status, claims_table)


RESULTS = ROOT / "experiments" / "results"


def _load(rel: str) -> dict:
    return json.loads((RESULTS / rel).read_text())


def main_job() -> str:
    s = _load("main_job.json")
    lines = ["| tasks | before | after | paired change, 95% t-interval over tasks | interval includes 0 |",
             "|---|---:|---:|---:|---|"]
    for key, label in (("held_out", "held-out"), ("train", "training")):
        r = s[key]
        lines.append(f"| {r['tasks']} {label} tasks | {r['before']:.3f} | {r['after']:.3f} | "
                     f"{r['paired_change']:+.3f} +- {r['paired_ci95']:.3f} | {'yes' if r['interval_includes_zero'] else 'no'} |")
    lines.append("")
    lines.append(f"{s['iterations']} iterations, {s['seconds_per_iteration']:.1f} s per iteration (median); trailing "
                 f"mean ({s['window']} iterations) of the training success {s['trailing_success_first']:.2f} after the "
                 f"first {s['window']} iterations, {s['trailing_success_last']:.2f} at the end "
                 "(`experiments/results/main_job.json`).")
    return "\n".join(lines)


LLM_JOB = "llm_textworld_wide"  # the recipe make train-llm runs (experiments/llm_learning.py)


def llm_job() -> str:
    """The second job: the LLM recipe's run (``make train-llm`` = ``python -m experiments.llm_learning``)."""
    s = _load(f"{LLM_JOB}/summary.json")
    h, t, sp = s["held_out"], s["training_games"], s["time_split_s"]
    p = s["provenance"]
    lines = ["| games | before | after | paired change, 95% t-interval over games |", "|---|---:|---:|---:|",
             f"| {h['games']} held-out games new in structure ({h['episodes_per_game']} episodes each) | "
             f"{h['initial']:.3f} | {h['final']:.3f} | {h['paired_change']:+.3f} +- {h['paired_change_ci95']:.3f} |",
             f"| {t['games']} training games ({h['episodes_per_game']} episodes each) | {t['initial']:.3f} | "
             f"{t['final']:.3f} | {t['paired_change']:+.3f} +- {t['paired_change_ci95']:.3f} |", "",
             f"{s['iterations']} iterations, {sp['per_iteration']:.0f} s per iteration on average: "
             f"{sp['decode'] / sp['iterations_total']:.0%} decoding replies, {sp['env'] / sp['iterations_total']:.0%} "
             f"stepping games, {sp['update_and_rest'] / sp['iterations_total']:.0%} the update and the rest; "
             f"{s['wall_s'] / 60:.0f} minutes from start to finish, evaluations included (recorded at "
             f"{p['commit']}; pools {p['pools']['train'][:12]} / {p['pools']['held_out'][:12]}: "
             f"`experiments/results/{LLM_JOB}/summary.json`)."]
    return "\n".join(lines)


def llm_run(name: str = LLM_JOB) -> str:
    """An LLM recipe's run in detail (docs/llm.md): every evaluation, the first and last ten iterations,
    where the time went, the compiled sampling programs, every start of the run."""
    s = _load(f"{name}/summary.json")
    h, curve = s["held_out"], [r for r in s["curve"] if r["iteration"] > 0]
    lines = [f"| iteration | held-out success ({h['games']} games x {h['episodes_per_game']} episodes) |", "|---:|---:|"]
    lines += [f"| {i} | {v:.3f} |" for i, v in zip(h["evaluated_at"], h["success_at"])]
    mean = lambda rows, k: sum(r[k] for r in rows if k in r) / max(1, sum(k in r for r in rows))
    first, last = curve[:10], curve[-10:]
    lines += ["", "| iterations (means) | training success (sampled) | invalid-command rate | reply tokens | "
              "turns per episode | seconds per iteration |", "|---|---:|---:|---:|---:|---:|"]
    for label, rows in ((f"{first[0]['iteration']}-{first[-1]['iteration']}", first),
                        (f"{last[0]['iteration']}-{last[-1]['iteration']}", last)):
        lines.append(f"| {label} | {mean(rows, 'success_rate'):.3f} | {mean(rows, 'invalid_rate'):.3f} | "
                     f"{mean(rows, 'reply_tokens'):.1f} | {mean(rows, 'episode_length'):.2f} | "
                     f"{mean(rows, 'step_time'):.1f} |")
    compiles = [r["rollout/compiles"] for r in curve if "rollout/compiles" in r]
    lines += ["", f"Sampling programs compiled by the last process: {compiles[-1]:.0f} (one per prompt bucket and "
              "power of two of distinct prompts met). Starts of the run: " + "; ".join(s["starts"]) + ".",
              "", f"![the run's curve](../experiments/results/{name}/curve.png)"]
    return "\n".join(lines)


def results_md(name: str) -> str:
    """A benchmark's own markdown (``experiments/results/NAME.md``) below its title."""
    return "\n".join((RESULTS / f"{name}.md").read_text().splitlines()[2:]).strip()


def llm_profile() -> str:
    """What an LLM iteration costs and what the untrained model does (``python -m experiments.profile_llm``)."""
    return results_md("llm_profile")


def compare_sokoban() -> str:
    c = _load("compare_sokoban/compare.json")
    thr = c["threshold"]
    lines = ["| estimator | training-level success before | after | held-out before | after | "
             f"iterations to {thr} (trailing mean), mean over the seeds that reached it | seeds that reached it |",
             "|---|---|---|---|---|---|---|"]
    for name, r in c["summary"].items():
        reached = f"{r['reached']}/{r['runs']}"
        it = ci(r["iterations_to_threshold"], 1) if r["reached"] else "never reached"
        lines.append(f"| {name} | {ci(r['initial_train_success'])} | {ci(r['final_train_success'])} | "
                     f"{ci(r['initial_success'])} | {ci(r['final_success'])} | {it} | {reached} |")
    return "\n".join(lines)


def env_loop() -> str:
    d = _load("bench_env_loop.json")
    cell = {(r["env"], r["policy"], r["groups"], r["decode"], r["loop"]): r["steps_per_s"] for r in d["rows"]}
    keys = list(dict.fromkeys((r["env"], r["policy"], r["groups"]) for r in d["rows"]))
    fmt = lambda x: "" if x is None else f"{x:,.0f}"
    lines = ["| setting | policy | groups x K | full, jitted | cached, jitted | full, host | cached, host |",
             "|---|---|---|---|---|---|---|"]
    for env, pol, g in keys:
        vals = [cell.get((env, pol, g, dec, loop)) for loop in ("jitted", "host") for dec in ("full", "cached")]
        lines.append(f"| {env} | {pol} | {g} x 8 | " + " | ".join(fmt(v) for v in vals) + " |")
    return "\n".join(lines)


def kernel_speed() -> str:
    d = _load("bench_advantages.json")
    rows = [r for r in d["rows"] if "jax_ms" in r]
    sizes = sorted({r["groups"] for r in rows})
    lo, hi = sizes[0], sizes[-1]

    def get(variant, groups):
        return next(r for r in rows if r["variant"] == variant and r["groups"] == groups)

    head = "gated_bepo default (host entry)"
    a, b = get(head, lo), get(head, hi)
    lines = [f"| | {lo} groups ({a['records'] / 1e3:.1f}k records) | {hi} groups ({b['records'] / 1e6:.2f}M records) |",
             "|---|---:|---:|"]
    sp = f" ({a['speedup']:.0f}x the literal Python loops" if "speedup" in a else ""
    if "speedup_vs_dict" in a:
        sp += f"{', ' if sp else ' ('}{a['speedup_vs_dict']:.0f}x an efficient dict-based Python"
    sp += ", same run)" if sp else ""
    lines.append(f"| Gated-BEPO, public function, default config | {a['jax_ms']:.2f} ms{sp} | "
                 f"{b['jax_ms']:.0f} ms, {b['records_per_s'] / 1e6:.1f}M records/s |")
    lines.append(f"| time per record | {a['us_per_record']:.2f} us | {b['us_per_record']:.2f} us |")
    h = d["headline"]
    lines.append(f"| max/min time per record over {len(h['us_per_record'])} sizes | | {h['max_over_min_us_per_record']:.2f} |")
    lines.append(f"| XLA peak-memory estimate | {a['peak_bytes'] / 2**20:.1f} MB | {b['peak_bytes'] / 2**20:.0f} MB |")
    for v in ("grpo", "gigpo", "graphgpo", "gagpo"):
        x, y = get(v, lo), get(v, hi)
        vs = f" ({x['speedup_vs_dict']:.1f}x an efficient dict-based Python)" if "speedup_vs_dict" in x else ""
        lines.append(f"| {v} | {x['jax_ms']:.2f} ms{vs} | {y['jax_ms']:.0f} ms |")
    dense = [r for r in rows if r["variant"] == "gated_bepo dense S=N"]
    if dense:
        per = [r["us_per_record"] for r in dense]
        lines.append("")
        lines.append(f"Without a bucket (dense on all K T = {d['k'] * d['t']} slots) Gated-BEPO costs "
                     f"{min(per):.1f}-{max(per):.1f} us/record up to {max(r['groups'] for r in dense)} groups; "
                     f"the automatic bucket is what keeps it linear.")
    return "\n".join(lines)


def precision() -> str:
    d = _load("bench_advantages.json")
    lines = ["| sums | records | segments | ms | max rel. error of sigma vs float64 | same bits after a row permutation |",
             "|---|---:|---:|---:|---:|---|"]
    for r in d.get("precision", []):
        lines.append(f"| {r['method']} | {r['records']} | {r['segments']} | {r['ms']:.2f} | "
                     f"{r['max_rel_err_sigma']:.1e} | {'yes' if r['order_independent'] else 'no'} |")
    return "\n".join(lines)


def credit_lab() -> str:
    d = _load("credit_lab/summary.json")
    labs = ("grpo", "gigpo", "graphgpo", "hgpo", "gagpo", "g2po", "gated_bepo", "bepo_nogate", "bepo_mc")
    lines = ["| environment (K = 8, uniform policy) | " + " | ".join(labs) + " |", "|---|" + "---|" * len(labs)]
    for env in d["envs"]:
        tags = [t for t in d["suite"] if t.startswith(env + " ") and t.endswith(" T=inf K=8")]
        for tag in tags[-1:]:  # the environment's own time limit (the longest horizon swept)
            row = d["suite"][tag]
            best = max(row[lab]["pearson"]["mean"] for lab in labs)
            cells = []
            for lab in labs:
                p, g = row[lab]["pearson"], row[lab]["grad_cos"]
                txt = f"{p['mean']:.2f} ± {p['ci95']:.2f} / {g['mean']:.2f}"
                cells.append(f"**{txt}**" if p["mean"] == best else txt)
            lines.append(f"| {tag.rsplit(' T=', 1)[0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _claims(name: str) -> str:
    """The claims table of one claims.py experiment (``experiments/results/<name>.json``)."""
    return claims_table(_load(f"{name}.json"))


def _confirmatory_headline(c: dict) -> list[str]:
    """The confirmatory test's primary contrasts as README bullets: the interval, and Holm's decision once the
    family is complete (before that, the plain reading and "no decision yet")."""
    done = c["family_complete"]
    lines = [f"The confirmatory test, fixed in advance (docs/confirmatory.md: {len(c['seeds'])} fresh seeds, "
             "paired, success on 512 fresh held-out levels in points, 95% t over seeds; Holm over its four primary "
             f"contrasts; `experiments/results/confirmatory.json`): {len(c['arms_done'])} of {len(c['arms'])} arms "
             "complete, " + ("Holm's decisions:" if done else "no decision yet:"), ""]
    for name in c["primary"]:
        a, b = name.split(" - ")
        label = next((claim for claim, *_, x, y in CLAIMS if (x, y) == (a, b)), CONFIRMATORY_LABELS.get((a, b), name))
        t = c["contrasts"].get(name, {}).get("fresh_512")
        if t is None:
            lines.append(f"- {label} ({name}): not run yet")
            continue
        r = c["contrasts"][name]
        value = r["paper"][0]
        lines.append(contrast_bullet(f"{label} ({name})", t, r.get("holm"),
                                      "" if value is None else f"; the paper {value:+.1f}: {size_of(t, r)}"))
    return lines


LLM_TESTS = {"llm_confirmatory": "The LLM confirmatory test", "llm_confirmatory_2": "The second LLM confirmatory test"}


def _llm_test_intro(name: str, res: dict) -> str:
    """What an LLM test fixed, from its summary (the first test's summary predates ``evaluation``: its
    protocol's 96 held-out episodes)."""
    ev = res.get("evaluation")
    held_out = f"{ev['games']} games x {ev['episodes']} episodes" if ev else "96 episodes"
    return (f"{LLM_TESTS[name]}, fixed in advance ({res['protocol']}: SmolLM2-135M-Instruct in TextWorld, "
            f"{len(res['seeds'])} fresh seeds, paired, held-out success on {held_out} in points, 95% t over seeds; "
            f"Holm over its two primary contrasts; `experiments/results/{name}/summary.json`)")


def _llm_confirmatory_headline(name: str) -> list[str]:
    """An LLM test's contrasts as README bullets (its ``report``'s summary): the interval and Holm's decision
    for the primary ones once every run has finished; before, only how many runs finished."""
    res = _llm_confirmatory_summary(name)
    if res is None:
        return [f"{LLM_TESTS[name]}: not finished, no report yet."]
    intro = _llm_test_intro(name, res)
    if res.get("sealed"):
        return [f"{intro}: {sealed_status(res)}"]
    if not res.get("decided", res["family_complete"]):
        return [f"{intro}: {len(res['seeds_complete'])} of {len(res['seeds'])} seeds complete, no decision yet."]
    how = (f"the compute cap ended it with {len(res['seeds_complete'])} of {len(res['seeds'])} seeds complete "
           f"({res['ended_by_cap']['time']}); Holm's decisions over those seeds" if res.get("ended_by_cap")
           else "every run finished, Holm's decisions")
    lines = [f"{intro}: {how}:", ""]
    for contrast, c in res["contrasts"].items():
        paper = "" if c["paper"] is None else f"; the paper {c['paper']:+.1f}: {c['against_paper']}"
        toy = f"; the character policy's test {c['toy_policy']}" if c["toy_policy"] else ""
        lines.append(contrast_bullet(contrast if c["primary"] else f"{contrast} (secondary)", c["test"],
                                      c.get("holm"), paper + toy))
    return lines


def headline() -> str:
    """README's findings: the confirmatory test's primary contrasts (confirmatory.json), then each LLM
    test's contrasts (its summary.json). The exploratory claims at the main job's recipe (e1_recipe) are
    docs/results.md's ``claims_e1_recipe`` table."""
    lines = _confirmatory_headline(_load("confirmatory.json"))
    for name in LLM_TESTS:
        lines += ["", *_llm_confirmatory_headline(name)]
    return "\n".join(lines)


def _arms(name: str) -> str:
    """The arms table of one claims.py experiment; arms not finished are listed as such."""
    d = _load(f"{name}.json")
    lines = ["| arm | held-out after | change from start | training tasks after | change from start | "
             "collapsed seeds |", "|---|---|---|---|---|---|"]
    for label, s in d["summary"].items():
        lines.append(f"| {label} | {arm_cells(s)} | {collapsed_seeds(s)} |")
    lines += pending_rows(name, d, 6)
    return "\n".join(lines)


def start_effect(name: str, base: str) -> str:
    """The arms of ``name`` (a claims.py experiment that changes only the initial policy of
    ``base``: same seeds, same tasks) beside the same arms of ``base``: held-out success,
    the paired per-seed difference between the two starts, collapses and the action
    entropy the seeds end at; then the reference arm (Gated-BEPO) minus each other arm
    under each start."""
    d, b = _load(f"{name}.json"), _load(f"{base}.json")
    lines = ["| arm | initial policy | held-out after | change from start | training tasks after | change from start | "
             "held-out minus the default start (points) | collapsed seeds | action entropy at the end, min to max "
             "over seeds (nats) |", "|---|---|---|---|---|---|---|---|---|"]
    for label in (x for x in d["summary"] if x in b["per_seed"]):
        diff = points(paired_points(d["per_seed"][label], b["per_seed"][label], "held_out_after"))
        for which, src, shown in (("default", b, ""), ("near-uniform", d, diff)):
            sm, ends = src["summary"][label], [abs(x["action_entropy"][-1]) for x in src["per_seed"][label]]
            lines.append(f"| {label} | {which} | {arm_cells(sm)} | {shown} | "
                         f"{collapsed_seeds(sm)} | {min(ends):.2f} to {max(ends):.2f} |")
    ref = d["reference"]
    others = [o for o in d["per_seed"] if o != ref] if ref in d["per_seed"] else []
    if others:
        lines += ["", "| paired difference (points, 95% t over seeds) | default start | near-uniform start |",
                  "|---|---|---|"]
        for o in others:
            for key, what in (("held_out_after", "held-out"), ("train_after", "training tasks")):
                cells = [points(paired_points(src["per_seed"][ref], src["per_seed"][o], key)) for src in (b, d)]
                lines.append(f"| {what}, {ref} - {o} | {cells[0]} | {cells[1]} |")
    if d["pending"]:
        lines += ["", f"Not run from the near-uniform start (`{name}.json` lists them as pending): "
                  f"{', '.join(d['pending'])}."]
    return "\n".join(lines)


def _lab_knob(d: dict, label: str) -> str:
    """The credit lab's name of a sweep arm's setting (``lam_0.0``, ``history_2``; no config: ``default``)."""
    return "_".join(f"{k}_{v}" for k, v in d["arms"][label]["config"].items()) or "default"


def knob_sweep() -> str:
    """The knob sweep on E1 (``claims.py --experiment sweep``) beside the credit lab's
    prediction for each setting: Pearson correlation of Gated-BEPO's credit with the exact
    advantage on Sokoban at K = 8, minus the default's (mean +- 95% t over the lab's
    batches), then held-out and training-task success after training and the paired
    per-seed difference from the default (points), with a verdict."""
    d, lab = _load("sweep.json"), _load("credit_lab/summary.json")["knobs"]["8"]
    ref = d["reference"]
    lines = [f"| setting | credit lab: Pearson minus {ref} (Sokoban, K = 8) | held-out after | minus {ref} (points) | "
             f"verdict | training tasks after | minus {ref} (points) | verdict | collapsed seeds |",
             "|---|---|---|---|---|---|---|---|---|"]
    pairs = []  # (the lab's Pearson difference, the held-out difference) per setting
    for label, s in d["summary"].items():
        pv = lab.get(_lab_knob(d, label), {}).get("pearson_vs_default", {}).get("sokoban")
        if pv and f"held_out_after_minus_{ref}" in s:
            pairs.append((pv["mean"], s[f"held_out_after_minus_{ref}"][0]))
        lab_cell = "reference" if label == ref else (f"{pv['mean']:+.3f} +- {pv['ci95']:.3f}" if pv else "not in the lab")
        cells = []
        for key in ("held_out_after", "train_after"):
            diff = s.get(f"{key}_minus_{ref}")  # claims.summarize: paired per seed, with its verdict
            cells += [ci(s[key]), "reference" if label == ref else points(diff) if diff else "n/a",
                      s.get(f"{key}_verdict", "")]
        lines.append(f"| {label} | {lab_cell} | " + " | ".join(cells) + f" | {collapsed_seeds(s)} |")
    lines += pending_rows("sweep", d, 9)
    if len(pairs) >= 3:
        rank = lambda xs: np.argsort(np.argsort(xs))
        rho = np.corrcoef(rank([a for a, _ in pairs]), rank([b for _, b in pairs]))[0, 1]
        lines += ["", f"Spearman rank correlation over the {len(pairs)} settings between the credit lab's "
                  f"Pearson difference and the held-out difference: {rho:+.2f} (descriptive: no interval)."]
    return "\n".join(lines)


def main_job_pool() -> str:
    d = _load("pool.json")
    lines = ["| arm | training levels, recipe | held-out after | change from start | training tasks after | "
             "change from start | held-out minus pool_32 |", "|---|---|---|---|---|---|---|"]
    for label, s in d["summary"].items():
        run = dict(d["arms"][label]["run"])
        levels = run.pop("task_pool")
        recipe = ", ".join(f"{k}={v}" for k, v in run.items()) or "the earlier main job's"
        diff = s.get("held_out_after_minus_pool_32")
        lines.append(f"| {label} | {levels}; {recipe} | {arm_cells(s)} | {ci(diff) if diff else 'reference'} |")
    lines += pending_rows("pool", d, 7)
    return "\n".join(lines)


def main_recipe() -> str:
    """The main job's recipe (``main_recipe``: the recipe and the earlier main job on the same 128
    held-out levels per seed) and the recipe with one update per batch (``main_recipe_1epoch``)."""
    lines = ["| arm | experiment, iterations | held-out after | change from start | training tasks after | "
             "change from start | held-out minus recipe | collapsed seeds |", "|---|---|---|---|---|---|---|---|"]
    for name in ("main_recipe", "main_recipe_1epoch"):
        d = _load(f"{name}.json")
        for label, s in d["summary"].items():
            diff = s.get("held_out_after_minus_recipe")
            ref = "reference" if label == "recipe" else (ci(diff) if diff else "not paired")
            lines.append(f"| {label} | {name}, {d['config']['iterations']} | {arm_cells(s)} | {ref} | "
                         f"{collapsed_seeds(s)} |")
        lines += pending_rows(name, d, 8)
    return "\n".join(lines)


def recipe_ablation() -> str:
    """``claims.py --experiment recipe_ablation``: GRPO and Gated-BEPO at the main job's recipe and under
    each change reverted alone; per setting their held-out success, the gap between them (paired per seed)
    and that gap's change from the recipe's (claims.py's contrasts), then the training-task gap."""
    d = _load("recipe_ablation.json")
    cs, ss = d["contrasts"], d["summary"]
    settings = ["recipe"] + [label[len("grpo_"):] for label in d["arms"] if label.startswith("grpo_")]
    lines = ["| setting | reverted to | GRPO held-out after | Gated-BEPO held-out after | gap: Gated-BEPO - GRPO, "
             "held-out (points) | verdict | seeds > 0 | gap's change from the recipe's (points) | verdict | gap, "
             "training tasks (points) | verdict | collapsed seeds (GRPO, Gated-BEPO) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in settings:
        g, b = ("grpo", "gated_bepo") if name == "recipe" else (f"grpo_{name}", f"gated_bepo_{name}")
        run = d["arms"][g]["run"]
        what = ", ".join(f"{k}={v}" for k, v in run.items()) or "nothing (the recipe)"
        gap, change = cs.get(f"{b} - {g}"), cs.get(f"gap change, {name}")
        if g not in ss or b not in ss:
            lines.append(f"| {name} | {what} | {ci(ss[g]['held_out_after']) if g in ss else 'not run yet'} | "
                         f"{ci(ss[b]['held_out_after']) if b in ss else 'not run yet'} |" + " |" * 8)
            continue
        change_cells = "reference | " if name == "recipe" else f"{points(change['held_out'])} | {change['held_out_verdict']}"
        lines.append(f"| {name} | {what} | {ci(ss[g]['held_out_after'])} | {ci(ss[b]['held_out_after'])} | "
                     f"{points(gap['held_out'])} | {gap['held_out_verdict']} | {gap['held_out_seeds_above_0']}/"
                     f"{gap['seeds']} | {change_cells} | {points(gap['train'])} | {gap['train_verdict']} | "
                     f"{collapsed_seeds(ss[g])}, {collapsed_seeds(ss[b])} |")
    return "\n".join(lines)


def e2_confirm() -> str:
    """``claims.py --experiment e2_confirm``: E2's two claims whose intervals excluded 0, on E2's seeds (where
    they were picked), on fresh seeds (the test: e2_confirm's contrasts) and on all of them pooled; each claim
    on held-out and training games, paired per seed, with the claims table's verdicts."""
    first, fresh = _load("e2.json"), _load("e2_confirm.json")
    span = lambda d: f"seeds {d.get('first_seed', 0)}-{d.get('first_seed', 0) + d['seeds'] - 1}"
    paper = {(a, b): (claim, text) for claim, text, _, _, a, b in CLAIMS}
    lines = [f"| claim | paper | measure | E2, {span(first)} (where the claims were picked) | fresh {span(fresh)} | "
             f"verdict | seeds > 0 | pooled, {first['seeds'] + fresh['seeds']} seeds | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in [*fresh["contrasts"], *fresh["pending_contrasts"]]:
        a, b = name.split(" - ")
        claim, text = paper[(a, b)]
        for measure, key, k in (("held-out games", "held_out_after", "held_out"),
                                ("training games", "train_after", "train")):
            picked = paired_points(first["per_seed"][a], first["per_seed"][b], key)
            head = f"| {claim} ({a} - {b}) | {text} | {measure} | {points(picked)} ({verdict(picked)}) |"
            c = fresh["contrasts"].get(name)
            if c is None:
                lines.append(head + " not run yet |" + " |" * 4)
                continue
            both = lambda arm: first["per_seed"][arm] + fresh["per_seed"][arm]
            pooled = paired_points(both(a), both(b), key)
            lines.append(head + f" {points(c[k])} | {verdict(c[k])} | {c[k + '_seeds_above_0']}/{c['seeds']} | "
                         f"{points(pooled)} | {verdict(pooled)} |")
    return "\n".join(lines)


def _rescore(name: str) -> str:
    """A ``rescore.py`` result (``experiments/results/<name>.json``; E2's: every run's final policy scored
    again, on the held-out games the runs were scored on and on fresh ones after them)."""
    return "\n".join(rescore_contrasts(_load(f"{name}.json")))


def warm_start() -> str:
    """RL after a supervised warm start (experiments/warm_start.py): the warm start kept in
    ``warm_start/sft.json``, then the arms and claims of ``warm_start.json`` when any arm has finished."""
    lines = [warm_start_sentence(_load("warm_start/sft.json")), ""]
    if not (RESULTS / "warm_start.json").exists():
        return "\n".join(lines + ["No arm has finished yet (`experiments/results/warm_start.json` does not exist)."])
    regime = _load("warm_start.json").get("regime", {})
    return "\n".join(lines + [_arms("warm_start"), "", _claims("warm_start"), "",
                              "The regime per iteration (mean ± 95% t over seeds):", "", *regime_lines(regime)])


def rivals_recipe() -> str:
    """``claims.py --experiment rivals_recipe``: the arms and the contrasts (claims.py's third table), with the
    chance line, once every arm has finished; before, which arms have (their numbers wait for the rest)."""
    if not (RESULTS / "rivals_recipe.json").exists():
        return "Not finished: no arm has finished yet (`experiments/results/rivals_recipe.json` does not exist)."
    d = _load("rivals_recipe.json")
    if d["pending"]:
        return (f"Not finished: {len(d['summary'])} of {len(d['arms'])} arms have finished ({', '.join(d['summary'])}; "
                f"pending: {', '.join(d['pending'])}); the numbers come here when every arm has.")
    return "\n".join([_arms("rivals_recipe"), *contrast_lines(d["contrasts"], d["pending_contrasts"]), "",
                      chance_line(2 * len(d["contrasts"]))])


def credit_mass(experiment: str) -> str:
    """``python -m experiments.credit_mass --experiment <experiment>``'s table, or that it has not run yet."""
    path = RESULTS / f"{experiment}_credit_mass.json"
    if not path.exists():
        return (f"Not measured yet: `python -m experiments.credit_mass --experiment {experiment}` runs when every arm "
                "has finished.")
    info = json.loads(path.read_text())
    return "\n".join([*credit_mass_lines(info), "", f"{info['optimizer_steps']} optimizer steps per arm; "
                      f"{info['batches']} batches per seed and policy; mean +- 95% t over seeds {info['seeds'][0]}-"
                      f"{info['seeds'][-1]}."])


def _llm_confirmatory_summary(name: str) -> dict | None:
    """An LLM test's summary (``python -m experiments.NAME report``), or None before its first report."""
    path = RESULTS / name / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def llm_confirmatory(name: str = "llm_confirmatory") -> str:
    """``python -m experiments.NAME report``'s tables once every run has finished; before, how many runs
    finished (a test fixed in advance writes no number before that)."""
    res = _llm_confirmatory_summary(name)
    if res is None:
        return (f"Not finished: no report yet (`python -m experiments.{name} status` shows each run); "
                "the numbers come here when every run has finished.")
    if res.get("sealed"):
        return f"Not finished: {sealed_status(res)} The numbers come here when every run has."
    if not res.get("decided", res["family_complete"]):
        return (f"Not finished: {len(res['seeds_complete'])} of {len(res['seeds'])} seeds have every arm finished; "
                "the numbers come here when every run has.")
    ended = res.get("ended_by_cap")
    return "\n".join(([ended_line(ended, len(res["seeds_complete"])), ""] if ended else []) + llm_confirmatory_lines(res))


TABLES = {"main_job": main_job, "main_recipe": main_recipe, "compare_sokoban": compare_sokoban,
          "env_loop": env_loop, "kernel_speed": kernel_speed, "precision": precision, "credit_lab": credit_lab,
          "claims_e1": lambda: _claims("e1"), "arms_e1": lambda: _arms("e1"), "pool": main_job_pool,
          "claims_e1_hard": lambda: _claims("e1_hard"), "arms_e1_hard": lambda: _arms("e1_hard"),
          "start_e1_hard": lambda: start_effect("e1_hard_uniform", "e1_hard"), "collapse_escape": lambda: collapse_escape(_load("collapse_escape.json")),
          "sweep": knob_sweep, "claims_e2": lambda: _claims("e2"), "arms_e2": lambda: _arms("e2"),
          "claims_e1_recipe": lambda: _claims("e1_recipe"), "arms_e1_recipe": lambda: _arms("e1_recipe"),
          "recipe_ablation": recipe_ablation, "e2_confirm": e2_confirm,
          "e2_rescore": lambda: _rescore("e2_rescore"), "e2_claims_rescore": lambda: _rescore("e2_claims_rescore"),
          "e1_recipe_rescore": lambda: _rescore("e1_recipe_rescore"), "headline": headline,
          "warm_start": warm_start, "confirmatory": lambda: confirmatory_primary(_load("confirmatory.json")), "llm_job": llm_job,
          "llm_run": llm_run, "llm_run_first": lambda: llm_run("llm_textworld"), "llm_profile": llm_profile, "chat_cache": lambda: results_md("bench_chat_cache"),
          "llm_memory_recipe_batch": lambda: results_md("bench_llm_memory_g4_e16_i2"),
          "rivals_recipe": rivals_recipe,
          "rivals_credit_mass": lambda: credit_mass("rivals_recipe"), "llm_confirmatory": llm_confirmatory,
          "llm_confirmatory_2": lambda: llm_confirmatory("llm_confirmatory_2")}


def render(text: str) -> str:
    """``text`` with every marked table regenerated; unknown or unclosed markers raise."""
    def sub(m):
        name = m.group(1)
        if name not in TABLES:
            raise ValueError(f"README names an unknown table {name!r}; known: {', '.join(TABLES)}")
        return f"<!-- table:{name} -->\n{TABLES[name]()}\n<!-- /table:{name} -->"

    out, n = re.subn(r"<!-- table:(\w+) -->\n.*?<!-- /table:\1 -->", sub, text, flags=re.S)
    if text.count("<!-- table:") != n:
        raise ValueError("README has a table marker without its closing <!-- /table:NAME -->")
    return out


# The files whose tables are rendered here: README (the headline and the main job) and the manual.
DOCS = ("README.md", "docs/results.md", "docs/benchmarks.md", "docs/llm.md")


def main(argv=None) -> int:
    p = parser(__doc__, full=True)
    p.add_argument("--check", action="store_true", help="exit 1 if a file of DOCS differs from the rendered tables")
    args = p.parse_args(argv)
    stale = []
    for name in DOCS:
        path = ROOT / name
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(name)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"{', '.join(stale)}: tables differ from experiments/results; run python -m experiments.readme_tables")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
