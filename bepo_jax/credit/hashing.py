"""64-bit observation keys as two uint32 words (docs/data-model.md).

* ``hash_observations`` — host content digest (BLAKE2b, 8 bytes) of text, bytes, and
  NumPy/JAX arrays. The digest covers a type tag, and for arrays the dtype and the
  shape, so ``"1"``, ``b"1"``, ``int32 [1]`` and ``int64 [1]`` all differ.
* ``hash_tokens`` — a jittable hash of token (or any numeric) arrays under a mask.
  Each valid entry's raw bits become uint32 words (``token_words``: no rounding of
  floats). Two 32-bit lanes l in {0, 1}, each with its own seed c_l:

      h_l = fmix32( sum_j fmix32( w_j * G + fmix32(rank_j XOR c_l) )  XOR  fmix32(n + c_l) )

  where the sum is over the valid words j (wrapping uint32 addition), rank_j is the
  word's position among the valid words, n their number, G = 0x9E3779B9 (odd) and
  fmix32 murmur3's finaliser, a bijection of uint32. The key is (h_0, h_1). Left- and
  right-padding of the same tokens give the same key. Single-token edits can never
  collide (the edited term differs in both lanes, since fmix32 is a bijection and G
  odd); random distinct rows collide with probability ~2^-64 per pair (tested on
  10^6 rows and on every single-token edit of a set of rows).

Keys are 64-bit because 32-bit keys collide with probability ~1e-4 per group of
1000 states (birthday bound n^2 / 2^33); at 64 bits that is ~3e-14.
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, UInt32

_LEAF_TYPES = "str, bytes, NumPy/JAX arrays or scalars"


def _digest(data: bytes) -> tuple[int, int]:
    d = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
    return d >> 32, d & 0xFFFFFFFF


def _leaf_bytes(x: Any) -> Optional[bytes]:
    if isinstance(x, str):
        return b"s\x00" + x.encode("utf-8")
    if isinstance(x, (bytes, bytearray, memoryview)):
        return b"b\x00" + bytes(x)
    if isinstance(x, (np.ndarray, np.generic, numbers.Number)) or hasattr(x, "__jax_array__") or type(x).__module__.startswith("jax"):
        a = np.ascontiguousarray(np.asarray(x))
        if a.dtype == object:
            return None
        header = f"a\x00{a.dtype.str}\x00{a.shape}\x00".encode()
        return header + a.tobytes()
    return None


def hash_observation(obs: Any) -> tuple[int, int]:
    """The (high, low) uint32 words of one observation's digest.

    Equal observations, equal keys; types are part of the content:

    >>> hash_observation("go north") == hash_observation("go north")
    True
    >>> hash_observation("1") == hash_observation(b"1")
    False
    """
    data = _leaf_bytes(obs)
    if data is None:
        raise ValueError(f"cannot hash an observation of type {type(obs).__name__}; use {_LEAF_TYPES}.")
    return _digest(data)


def hash_observations(obs: Any, *, batch_ndim: Optional[int] = None) -> np.ndarray:
    """Digest a batch of observations to uint32 [*batch, 2] on the host.

    ``obs`` is a nested list/tuple (the nesting gives the batch shape; leaves are
    str, bytes or arrays), a NumPy object array (its shape is the batch shape), or a
    numeric array whose first ``batch_ndim`` axes are batch axes and the rest one
    observation (``batch_ndim`` is required then: ``hash_observations(grids,
    batch_ndim=3)`` for grids [B, K, T, H, W]).
    """
    if isinstance(obs, (np.ndarray,)) or hasattr(obs, "__jax_array__") or type(obs).__module__.startswith("jax"):
        arr = np.asarray(obs)
        if arr.dtype == object:
            out = np.empty(arr.shape + (2,), np.uint32)
            for idx in np.ndindex(arr.shape):
                out[idx] = hash_observation(arr[idx])
            return out
        if batch_ndim is None:
            raise ValueError(
                "hash_observations got a numeric array without batch_ndim: say how many leading "
                f"axes of its shape {arr.shape} are batch axes, e.g. batch_ndim=3 for [B, K, T, ...]."
            )
        if not 0 <= batch_ndim <= arr.ndim:
            raise ValueError(f"batch_ndim={batch_ndim} must be between 0 and the array's ndim {arr.ndim}.")
        out = np.empty(arr.shape[:batch_ndim] + (2,), np.uint32)
        for idx in np.ndindex(arr.shape[:batch_ndim]):
            out[idx] = hash_observation(arr[idx])
        return out
    if batch_ndim is not None:
        raise ValueError("batch_ndim applies to numeric arrays only; nested lists give their own batch shape.")
    if not isinstance(obs, (list, tuple)):
        return np.asarray(hash_observation(obs), np.uint32)
    # inside a nested list an array is one observation (a leaf), not a batch
    words = [hash_observations(o) if isinstance(o, (list, tuple)) else np.asarray(hash_observation(o), np.uint32)
             for o in obs]
    shapes = {w.shape for w in words}
    if len(shapes) > 1:
        raise ValueError(
            f"hash_observations got a ragged nested list (item shapes {sorted(shapes)}); pad it to a "
            "rectangular batch (e.g. with empty strings) and mask the padding."
        )
    if not words:
        return np.zeros((0, 2), np.uint32)
    return np.stack(words)


_M1 = np.uint32(0x85EBCA6B)
_M2 = np.uint32(0xC2B2AE35)
_GOLD = np.uint32(0x9E3779B9)
_SEEDS = (np.uint32(0x2545F491), np.uint32(0x68E31DA4))


def _fmix32(h):
    """murmur3's 32-bit finaliser (a bijection on uint32)."""
    h = h ^ (h >> 16)
    h = h * _M1
    h = h ^ (h >> 13)
    h = h * _M2
    return h ^ (h >> 16)


def token_words(x: Array) -> UInt32[Array, "*batch W"]:
    """The raw bits of an array of any numeric dtype as uint32 words along the last axis
    (jittable): integers and bools of <= 32 bits are widened (an injective map), 16-bit
    floats are bit-cast to uint16 then widened, 32-bit floats bit-cast, 64-bit types split
    into two words per element. -0.0 is folded into +0.0 so equal numbers hash equal;
    float values are NEVER rounded to integers (a normalised float grid keeps every
    distinct value distinct)."""
    x = jnp.asarray(x)
    dt = x.dtype
    floating = jnp.issubdtype(dt, jnp.floating)
    if not (floating or dt == jnp.bool_ or jnp.issubdtype(dt, jnp.integer)):
        raise ValueError(f"hash_tokens: unsupported dtype {dt}; pass integer, bool or float arrays.")
    if floating:
        x = x + jnp.zeros((), dt)  # -0.0 + 0.0 = +0.0
    if dt.itemsize == 8:  # two words per element
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(x.shape[:-1] + (2 * x.shape[-1],))
    if floating:  # 16- and 32-bit floats: their bits, widened
        return jax.lax.bitcast_convert_type(x, {2: jnp.uint16, 4: jnp.uint32}[dt.itemsize]).astype(jnp.uint32)
    return x.astype(jnp.uint32)  # bools and <= 32-bit integers: widening is injective


def hash_tokens(tokens: Array, mask: Bool[Array, "*batch L"]) -> UInt32[Array, "*batch 2"]:
    """Jittable 64-bit key of the valid entries of each row (see module docstring).

    ``tokens`` may have any numeric dtype: its raw bits are hashed (``token_words``),
    so float observations are hashed exactly, not rounded.

    Left and right padding of the same tokens give the same key; another token does not:

    >>> import jax.numpy as jnp
    >>> keys = hash_tokens(jnp.array([[0, 7, 8], [7, 8, 0], [7, 9, 0]]),
    ...                    jnp.array([[False, True, True], [True, True, False], [True, True, False]]))
    >>> bool((keys[0] == keys[1]).all()), bool((keys[1] == keys[2]).all())
    (True, False)
    """
    tokens = jnp.asarray(tokens)
    mask = jnp.asarray(mask, bool)
    if tokens.shape != mask.shape:
        raise ValueError(f"hash_tokens: tokens {tokens.shape} and mask {mask.shape} must have one shape.")
    tok = token_words(tokens)
    if tok.shape != mask.shape:  # 64-bit entries: two words each, both under the entry's mask
        mask = jnp.repeat(mask, tok.shape[-1] // mask.shape[-1], axis=-1)
    rank = (jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1).astype(jnp.uint32)
    length = jnp.sum(mask.astype(jnp.uint32), axis=-1)
    lanes = []
    for seed in _SEEDS:
        per_token = _fmix32(tok * _GOLD + _fmix32(rank ^ seed))
        acc = jnp.sum(jnp.where(mask, per_token, jnp.uint32(0)), axis=-1, dtype=jnp.uint32)
        lanes.append(_fmix32(acc ^ _fmix32(length + seed)))
    return jnp.stack(lanes, axis=-1)


# ----------------------------------------------------------------------------------
# Action keys (``StepBatch.action_key``): the canonical action, hashed.


def canonical_action(text: Any) -> Any:
    """The canonical form of an action: text lower-cased with its whitespace runs collapsed to
    one space and stripped ("Go  North " -> "go north"); any other value unchanged."""
    return " ".join(text.lower().split()) if isinstance(text, str) else text


def action_id_keys(ids: Array) -> UInt32[Array, "*batch 2"]:
    """Jittable keys of integer action ids (a fixed action set; -1 for "no valid action" is a key
    of its own): ``hash_tokens`` of each id as a one-word row."""
    ids = jnp.asarray(ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"action_id_keys: ids have dtype {ids.dtype}; pass integer action ids.")
    return hash_tokens(ids[..., None].astype(jnp.int32), jnp.ones(ids.shape + (1,), bool))


def action_keys(actions: Any) -> np.ndarray:
    """Host keys of a batch of actions, uint32 [*batch, 2], for ``StepBatch.action_key``.

    Integers (an array or nested lists): action ids (``action_id_keys``). Otherwise a nested list (or object array) of
    action texts: each is put in canonical form (``canonical_action``) and digested as an observation
    is (``hash_observation``), so "Go North" and "go  north" share a key and "go south" does not.

    >>> k = action_keys([["Go North", "go  north", "go south"]])
    >>> bool((k[0, 0] == k[0, 1]).all()), bool((k[0, 0] == k[0, 2]).all())
    (True, False)
    """
    if isinstance(actions, np.ndarray) or hasattr(actions, "__jax_array__") or type(actions).__module__.startswith("jax"):
        arr = np.asarray(actions)
        if np.issubdtype(arr.dtype, np.integer):
            return np.asarray(action_id_keys(arr))
        if arr.dtype.kind in "US":  # NumPy strings: the texts as Python strings
            arr = arr.astype(object)
        if arr.dtype != object:
            raise ValueError(f"action_keys: a {arr.dtype} array; pass integer action ids or action texts.")
        return hash_observations(np.vectorize(canonical_action, otypes=[object])(arr))

    try:  # a nested list of integers: action ids, as an integer array of them
        ids = np.asarray(actions)
    except ValueError:  # ragged: hash_observations names the problem below
        ids = None
    if ids is not None and ids.size and np.issubdtype(ids.dtype, np.integer):
        return np.asarray(action_id_keys(ids))

    def canon(x):
        return [canon(y) for y in x] if isinstance(x, (list, tuple)) else canonical_action(x)

    return hash_observations(canon(actions))
