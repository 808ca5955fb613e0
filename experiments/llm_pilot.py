"""The pilot of the second LLM test (docs/llm-confirmatory-2.md): GRPO and Gated-BEPO on the recipe
``llm_textworld_wide`` as it is, seeds 0 and 1, read on the **training games only** until that protocol
is committed. It sizes the second test (the paired SD over seeds of Gated-BEPO - GRPO on the training
games, the gate's share per iteration, the wall time of a run) and is, once the protocol is fixed, the
exploratory comparison of the recipe's estimator with GRPO at the same budget (held-out games:
``report --endpoint eval``; labelled exploratory: two seeds, chosen before any held-out number was read).

    nice python -m experiments.llm_pilot run       # every (seed, arm) run, each in a fresh process; resumable
    python -m experiments.llm_pilot report         # the training games' numbers (summary_eval_train.json)
    python -m experiments.llm_pilot report --endpoint eval   # held-out: only after the protocol's commit
    python -m experiments.llm_pilot status

Gated-BEPO's seed-0 run is ``make train-llm``'s (the recipe itself, the same config): its run directory
is copied to runs/llm_pilot/gated_bepo_s0 instead of running it again (``adopt``, logged). The harness is
``experiments/llm_test.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .common import ROOT
from .llm_test import LLMTest

TEST = LLMTest(name="llm_pilot", protocol="docs/llm-confirmatory-2.md (its pilot)", base="llm_textworld_wide",
               overrides={}, arms=("grpo", "gated_bepo"), seeds=(0, 1), primary=(("gated_bepo", "grpo"),),
               endpoint="eval_train", title="The second LLM test's pilot", exploratory=True)


def adopt(src: Path, arm: str = "gated_bepo", seed: int = 0) -> Path:
    """Take a finished run of the pilot's (arm, seed) config from ``src`` (``make train-llm``'s run
    directory) as the pilot's own: copied into its run directory, its record kept, the copy logged."""
    dst = TEST.run_dir(arm, seed)
    from bepo_jax.agent.train.rundir import is_finished_run_of

    try:
        finished = is_finished_run_of(src, TEST.config(arm, seed))
    except ValueError as err:  # a finished run of another config
        raise SystemExit(f"{src} is not the pilot's ({arm}, {seed}) run: {err}") from None
    if not finished:
        raise SystemExit(f"{src} holds no finished run of the pilot's ({arm}, {seed}) config; finish make train-llm.")
    if not dst.exists():
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    TEST.keep_record(arm, seed)
    TEST.log(event="note", text=f"{arm} s{seed} is the run of make train-llm ({src}), copied, not run again "
             "(the same config: the recipe llm_textworld_wide, seed 0).")
    return dst


def main(argv=None) -> int:
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["adopt"]:
        adopt(Path(args[1]) if len(args) > 1 else ROOT / "runs" / "llm_textworld_wide")
        return 0
    return TEST.main(args, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
