"""Group-local state ids, successors and distinct-successor counts against dict loops."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given

from bepo_jax.credit.graph import build_graph

from tests.strategies import batches


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
        # Same partition as the dict (the numbering order is not part of the contract).
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


def _first_index(words, valid):
    seen, out = {}, []
    for i, (w, v) in enumerate(zip(map(tuple, words), valid)):
        out.append(seen.setdefault(w, i) if v else len(valid))
    return np.array(out)


@given(data=batches())
def test_first_occurrence_and_both_numberings(data):
    """The CPU hash table gives each record the first index of its key; it and the GPU/TPU
    sort path number the same partition."""
    from bepo_jax.credit.graph import _hashed_dense_ids, _sorted_dense_ids, first_occurrence

    _, (obs, _, mask, _, _) = data
    words, valid = obs.reshape(-1, 2), mask.reshape(-1)
    np.testing.assert_array_equal(np.asarray(jax.jit(first_occurrence)(jnp.asarray(words), jnp.asarray(valid))),
                                  _first_index(words, valid))
    keys = (jnp.asarray(words[:, 0]), jnp.asarray(words[:, 1]))
    (a, na), (b, nb) = (jax.jit(f, static_argnums=2)(keys, jnp.asarray(valid), -1)
                        for f in (_hashed_dense_ids, _sorted_dense_ids))
    assert int(na) == int(nb) == len({tuple(w) for w, v in zip(words, valid) if v})
    a, b = np.asarray(a), np.asarray(b)
    assert np.all((a == -1) == ~valid) and np.all((b == -1) == ~valid)
    assert len(set(zip(a[valid], b[valid]))) == int(na)  # a bijection between the two numberings


def test_first_occurrence_survives_long_probe_chains(monkeypatch):
    """With the hash replaced by the identity, keys that are multiples of the table size
    all land in slot 0 and probe one slot further per round: still exact."""
    import bepo_jax.credit.graph as graph

    monkeypatch.setattr(graph, "_mix32", lambda h: h)
    n = 64  # table of 128 slots
    rng = np.random.default_rng(0)
    words = (rng.integers(0, 40, n) * 128).astype(np.uint32)[:, None]  # one word: the slot is the key mod 128
    valid = rng.random(n) < 0.9
    got = np.asarray(graph.first_occurrence(jnp.asarray(words), jnp.asarray(valid)))
    assert len(set(words[valid, 0])) > 20  # a chain of > 20 probes
    np.testing.assert_array_equal(got, _first_index(words, valid))
