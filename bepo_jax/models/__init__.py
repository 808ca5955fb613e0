"""Policies: a small Flax NNX decoder and the interface any Flax NNX LLM satisfies."""

from .interface import PolicyModel, token_logprobs
from .transformer import DecoderLM, TransformerConfig

__all__ = ["PolicyModel", "token_logprobs", "DecoderLM", "TransformerConfig"]
