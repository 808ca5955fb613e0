"""The ``bepo-jax`` command."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .estimators import GatedBEPOConfig


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    cfg = GatedBEPOConfig(gamma=args.gamma, lam=args.lam, w=args.w, eta_gated=args.eta_gated,
                          norm=args.norm, solver=args.solver)
    run_demo(bepo=cfg)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bepo-jax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="print every estimator's credit on the paper's four trajectory patterns")
    defaults = GatedBEPOConfig()
    d.add_argument("--gamma", type=float, default=defaults.gamma)
    d.add_argument("--lam", type=float, default=defaults.lam)
    d.add_argument("--w", type=float, default=defaults.w)
    d.add_argument("--eta-gated", type=float, default=defaults.eta_gated)
    d.add_argument("--norm", choices=("mean", "mean_std"), default=defaults.norm)
    d.add_argument("--solver", choices=("dense", "sparse", "solve"), default=defaults.solver)
    d.set_defaults(func=_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        parser.error(str(err))
        return 2


if __name__ == "__main__":
    sys.exit(main())
