"""A character tokenizer for text observations and short action responses.

Ids: 0 PAD, 1 BOS, 2 EOS, 3 SEP (between prompt parts), then one id per character of
``ALPHABET``. Small enough for the tiny default policy; an LLM port brings its own
tokenizer and keeps the rest of the pipeline.
"""

from __future__ import annotations

import numpy as np

PAD, BOS, EOS, SEP = 0, 1, 2, 3
ALPHABET = "abcdefghijklmnopqrstuvwxyz_#OX√PS\n :0123456789.,'-!?"
VOCAB = 4 + len(ALPHABET)
_INDEX = {c: 4 + i for i, c in enumerate(ALPHABET)}


def encode(text: str) -> np.ndarray:
    """Character ids of ``text``; characters outside the alphabet raise."""
    try:
        return np.array([_INDEX[c] for c in text], np.int32)
    except KeyError as err:
        raise ValueError(f"character {err.args[0]!r} is not in the tokenizer's alphabet {ALPHABET!r}.") from None


def normalize(text: str) -> str:
    """Free text (e.g. a TextWorld description) in the alphabet: lower case, characters
    outside it as spaces, runs of whitespace as one space."""
    low = "".join(c if c in _INDEX and c not in "OXPS√#_" else " " for c in text.lower())
    return " ".join(low.split())


def decode(ids) -> str:
    """Text of ``ids`` up to the first EOS (PAD/BOS/SEP skipped)."""
    out = []
    for i in np.asarray(ids).tolist():
        if i == EOS:
            break
        if i >= 4:
            out.append(ALPHABET[i - 4])
    return "".join(out)
