"""Does step credit beat outcome credit with a pretrained LLM? The test fixed in advance in
docs/llm-confirmatory.md (read it first: the arms, seeds, endpoint, decision rule and budget are
there, and changing them after a run started is a deviation that the report must name).

    nice python -m experiments.llm_confirmatory run      # every (seed, arm) run in the fixed order, each in a fresh process; resumable
    python -m experiments.llm_confirmatory report        # the numbers; the decision once every run finished
    python -m experiments.llm_confirmatory status        # which runs finished, which started
    python -m experiments.llm_confirmatory note --text "..."   # a dated note in the log (a correction)
    nice python -m experiments.llm_confirmatory run --no-start-after "2026-12-05 14:20"   # leave no run half done at a stop

The harness (run directories runs/llm_confirmatory/ARM_sSEED, the log, the kept records in
experiments/results/llm_confirmatory/runs/, the report) is ``experiments/llm_test.py``'s ``LLMTest``;
the constants below are the protocol's.
"""

from __future__ import annotations

from .llm_test import LLMTest

NAME = "llm_confirmatory"
# -- the protocol (docs/llm-confirmatory.md); fixed before the first run -----------------------------
ARMS = ("grpo", "gigpo", "gated_bepo")
SEEDS = tuple(range(300, 306))
PRIMARY = (("gated_bepo", "grpo"), ("gated_bepo", "gigpo"))
SECONDARY = (("gigpo", "grpo"),)
OVERRIDES = dict(iterations=30, eval_tasks=24, eval_every=30, eval_train=False, checkpoint_every=2,
                 keep_checkpoints=1)
# the toy policy's confirmatory result and the paper's number for the primary contrasts (points)
TOY = {("gated_bepo", "grpo"): "+7.3 +- 2.7 (confirmed)", ("gated_bepo", "gigpo"): "+1.0 +- 2.9 (not confirmed)"}
PAPER = {("gated_bepo", "grpo"): 13.4, ("gated_bepo", "gigpo"): None, ("gigpo", "grpo"): 9.8}

TEST = LLMTest(name=NAME, protocol="docs/llm-confirmatory.md", base="llm_textworld", overrides=OVERRIDES, arms=ARMS,
               seeds=SEEDS, primary=PRIMARY, secondary=SECONDARY, toy=TOY, paper=PAPER,
               title="The LLM confirmatory test")
OUT, RESULTS_DIR = TEST.out, TEST.results_dir


def main(argv=None) -> int:
    return TEST.main(argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
