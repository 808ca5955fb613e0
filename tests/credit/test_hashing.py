import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bepo_jax import hash_observation, hash_observations, hash_tokens


def test_content_digest_distinguishes_type_dtype_and_shape():
    keys = {
        hash_observation("1"),
        hash_observation(b"1"),
        hash_observation(np.array([1], np.int32)),
        hash_observation(np.array([1], np.int64)),
        hash_observation(np.array([[1]], np.int32)),
        hash_observation(np.array([1.0], np.float32)),
    }
    assert len(keys) == 6
    assert hash_observation("room 1") == hash_observation("room 1")
    assert hash_observation(np.arange(4).reshape(2, 2)) == hash_observation(np.arange(4).reshape(2, 2).T.T.copy())
    # Non-contiguous views hash by content.
    a = np.arange(16).reshape(4, 4)
    assert hash_observation(a[:, ::2]) == hash_observation(np.ascontiguousarray(a[:, ::2]))


def test_batch_shapes():
    nested = [[["a", "b"], ["a", "c"]]]
    out = hash_observations(nested)
    assert out.shape == (1, 2, 2, 2) and out.dtype == np.uint32
    assert (out[0, 0, 0] == out[0, 1, 0]).all() and not (out[0, 0, 1] == out[0, 1, 1]).all()
    grids = np.zeros((2, 3, 4, 6, 6), np.int8)
    grids[1, 2, 3, 0, 0] = 1
    g = hash_observations(grids, batch_ndim=3)
    assert g.shape == (2, 3, 4, 2)
    assert len({tuple(x) for x in g.reshape(-1, 2)}) == 2
    obj = np.empty((2,), object)
    obj[0], obj[1] = "x", np.ones(3)
    assert hash_observations(obj).shape == (2, 2)


def test_a_nested_list_of_arrays_hashes_each_array_as_one_observation():
    """The docstring's promise (leaves are str, bytes or arrays): each leaf keyed like
    ``hash_observation`` of that array alone, mixed leaves included."""
    grid, other = np.zeros((3, 3), np.int8), np.eye(3, dtype=np.int8)
    nested = [[[grid, other], [grid.copy(), "text"]]]
    out = hash_observations(nested)
    assert out.shape == (1, 2, 2, 2)
    expect = [[[hash_observation(grid), hash_observation(other)], [hash_observation(grid), hash_observation("text")]]]
    assert [[[tuple(int(v) for v in out[0, k, t]) for t in range(2)] for k in range(2)]] == \
        [[[tuple(int(v) for v in e) for e in row] for row in expect[0]]]


def test_bad_observations():
    with pytest.raises(ValueError, match="batch_ndim"):
        hash_observations(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="ragged"):
        hash_observations([["a", "b"], ["c"]])
    with pytest.raises(ValueError, match="cannot hash an observation of type dict"):
        hash_observations([{"a": 1}])


def test_hash_tokens_ignores_padding_and_alignment():
    toks = jnp.array([[5, 6, 7, 0, 0], [0, 0, 5, 6, 7], [5, 6, 7, 9, 9], [6, 5, 7, 0, 0], [5, 6, 0, 0, 0]])
    mask = jnp.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], bool)
    h = np.asarray(jax.jit(hash_tokens)(toks, mask))
    assert h.shape == (5, 2) and h.dtype == np.uint32
    assert (h[0] == h[1]).all() and (h[0] == h[2]).all()  # right/left padding, garbage under the mask
    assert not (h[0] == h[3]).all()  # order matters
    assert not (h[0] == h[4]).all()  # prefix differs


@given(st.lists(st.lists(st.integers(0, 50), min_size=0, max_size=6), min_size=2, max_size=40, unique_by=tuple))
def test_hash_tokens_distinct_sequences_get_distinct_keys(seqs):
    L = 6
    toks = np.zeros((len(seqs), L), np.int32)
    mask = np.zeros((len(seqs), L), bool)
    for i, s in enumerate(seqs):
        toks[i, : len(s)] = s
        mask[i, : len(s)] = True
    h = np.asarray(hash_tokens(toks, mask))
    assert len({tuple(x) for x in h}) == len(seqs)
