"""Plain NumPy / Python-loop reference implementations of the estimators (docs/estimators.md).

Deliberately written as the definitions read — dicts keyed by observation, loops
over records, float64 — and independent of the package's kernels: the tests check
every kernel against these, and ``experiments/bench_advantages.py`` times them. Slow
by design; not for training. Each function takes one batch as NumPy arrays
``(obs [B, K, T, 2], reward, mask, outcome, penalty)``.

The references by family: ``outcome`` (GRPO, GiGPO, HGPO and their helpers), ``bepo`` (the state
graph, the fixed point, Gated-BEPO, GraphGPO, GAGPO, PGPO, the confidence returns), ``rivals`` (G2PO,
ProxMO, ECPO and the abstract-based versions), ``similarity`` (leader clustering).
"""

from .outcome import N_OUT, HGPO_RESIDUE, _std, _ddof, lengths, ref_returns, ref_scored_returns, ref_outcome, ref_step_groups, ref_grpo, ref_gigpo, ref_hgpo  # noqa: F401
from .bepo import FP_SCALE_NOISE, TOL_FLOOR, ref_graph, ref_values, ref_gated_bepo, ref_graphgpo, ref_gagpo, ref_pgpo, ref_confidence_returns  # noqa: F401
from .rivals import _verl_rows, ref_g2po, ref_tfidf, ref_proxmo, _anchor_records, ref_ecpo, ref_ecpo_abstract, ref_g2po_abstract  # noqa: F401
from .similarity import ref_leader_clusters  # noqa: F401
