"""``make record-main-job``: the finished main job's summary as the results file README's table cites.

    python -m experiments.record_main_job [--run runs/main_job]

Copies ``RUN/summary.json`` to ``experiments/results/main_job.json`` with what determines it beside the
numbers (``provenance``): the recipe's name, the commit of this checkout when it is recorded (run
`make train` and this at one commit), and the digests of its training and held-out pools
(``setup.pool_digests``). ``tests/experiments/test_main_job_record.py`` recomputes the config from the
recipe and the digests from the current code and fails when either differs, so the table cannot go
stale without a test saying so. Then the README tables are rendered again.
"""

from __future__ import annotations

import json
from pathlib import Path

from bepo_jax.agent.train.config import RunConfig
from bepo_jax.agent.train.recipes import recipe
from bepo_jax.agent.train.setup import pool_digests

from .common import RESULTS, ROOT, git_commit, parser, write_json

RECIPE = "main_job"


def provenance(summary: dict) -> dict:
    cfg = RunConfig.from_stored(summary["config"])
    if cfg.to_dict() != recipe(RECIPE).to_dict():
        raise ValueError(f"the run's config is not the {RECIPE!r} recipe's; record only a run of `make train`.")
    return {"recipe": RECIPE, "commit": git_commit(), "pools": pool_digests(cfg)}


def main(argv=None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--run", default=str(ROOT / "runs" / "main_job"))
    args = ap.parse_args(argv)
    path = Path(args.run) / "summary.json"
    if not path.exists():
        raise SystemExit(f"no finished main job in {args.run}: run `make train` first")
    summary = json.loads(path.read_text())
    write_json(RESULTS / "main_job.json", {**summary, "provenance": provenance(summary)})
    from . import readme_tables

    readme_tables.main([])


if __name__ == "__main__":
    main()
