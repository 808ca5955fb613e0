"""Policies: a small Flax NNX decoder and the interface any Flax NNX LLM satisfies."""

from .interface import DecodingModel, PolicyModel, token_logprobs
from .transformer import DecodeCache, DecoderLM, TransformerConfig

__all__ = ["PolicyModel", "DecodingModel", "token_logprobs", "DecoderLM", "DecodeCache", "TransformerConfig"]
