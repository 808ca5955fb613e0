"""Policies: a small Flax NNX decoder and the interface any Flax NNX LLM satisfies."""

from .interface import DecodingModel, PolicyModel, score_logits, token_logprobs
from .transformer import DecodeCache, DecoderLM, TransformerConfig

__all__ = ["PolicyModel", "DecodingModel", "token_logprobs", "score_logits", "DecoderLM", "DecodeCache", "TransformerConfig"]
