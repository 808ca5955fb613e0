"""Similarity merging's leader clustering. (Plain loops, float64: see the package docstring.)"""

from __future__ import annotations


def ref_leader_clusters(n, similar, valid=None):
    """The reference recipes' clustering as a loop (verl-agent ``build_step_group`` with
    ``enable_similarity``): record i joins the first earlier cluster whose leader j has
    ``similar(i, j)``, else it leads a new one; invalid records lead themselves and attract
    nobody. Returns each record's leader index."""
    leaders, out = [], []
    for i in range(n):
        if valid is not None and not valid[i]:
            out.append(i)
            continue
        for j in leaders:
            if similar(i, j):
                out.append(j)
                break
        else:
            leaders.append(i)
            out.append(i)
    return out
