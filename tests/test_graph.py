"""Group-local state ids, successors and distinct-successor counts against dict loops."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given

from bepo_jax.graph import build_graph

from .strategies import batches


@given(data=batches())
def test_graph_matches_dicts(data):
    _, (obs, reward, mask, outcome, pen) = data
    build = jax.jit(jax.vmap(build_graph))
    g = build(jnp.asarray(obs), jnp.asarray(mask), jnp.asarray(outcome), jnp.asarray(reward + pen))
    B, K, T = mask.shape
    N = K * T
    for b in range(B):
        keys = {}
        for k in range(K):
            for t in range(int(mask[b, k].sum())):
                keys.setdefault(tuple(obs[b, k, t]), len(keys))
        assert int(g.num_states[b]) == len(keys)
        state = np.asarray(g.state[b])
        succ = np.asarray(g.succ[b])
        # Same partition as the dict (ids are in key order, not first-seen order).
        seen = {}
        pairs = {}
        for k in range(K):
            L = int(mask[b, k].sum())
            for t in range(T):
                if t >= L:
                    assert state[k, t] == N + 3 and succ[k, t] == N + 3
                    continue
                s = tuple(obs[b, k, t])
                assert seen.setdefault(s, state[k, t]) == state[k, t]
                assert 0 <= state[k, t] < len(keys)
                if t + 1 < L:
                    assert succ[k, t] == state[k, t + 1]
                    nxt = tuple(obs[b, k, t + 1])
                else:
                    assert succ[k, t] == N + outcome[b, k]
                    nxt = ("END", int(outcome[b, k]))
                pairs.setdefault(s, set()).add((float(reward[b, k, t] + pen[b, k, t]), nxt))
        assert len(set(seen.values())) == len(seen)
        counts = np.asarray(g.num_successors[b])
        out_count = np.asarray(g.out_count[b])
        for s, sid in seen.items():
            assert counts[sid] == len(pairs[s])  # (r, s') pairs: edge_reward was given
            assert out_count[sid] == sum(1 for k in range(K) for t in range(int(mask[b, k].sum()))
                                         if tuple(obs[b, k, t]) == s)
        assert counts[len(keys):].sum() == 0


def test_successor_count_without_rewards_counts_nodes():
    obs = jnp.array([[[1, 1], [2, 2]], [[1, 1], [2, 2]]], jnp.uint32)  # a->b twice, then END[S] / END[F]
    mask = jnp.ones((2, 2), bool)
    g = build_graph(obs, mask, jnp.array([0, 1]), None)
    a = int(g.state[0, 0])
    b = int(g.state[0, 1])
    assert int(g.num_successors[a]) == 1  # a -> b only
    assert int(g.num_successors[b]) == 2  # b -> END[SUCCESS], END[FAILURE]
    g2 = build_graph(obs, mask, jnp.array([0, 1]), jnp.array([[0.0, 1.0], [5.0, 1.0]]))
    assert int(g2.num_successors[a]) == 2  # (0, b) and (5, b)
