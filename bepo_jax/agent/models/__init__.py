"""Policies: the interface any Flax NNX LLM satisfies, a small NNX decoder trained from scratch, and
pretrained Llama-family checkpoints (GGUF files or Hugging Face directories) as first-class policies.

    pre = load_pretrained("smollm2-135m")        # or a GGUF file / a Hugging Face directory
    pre.model(tokens, mask)                      # logits; prefill / decode_step / score as every policy
    reply(pre, [{"role": "user", "content": "What is the capital of France?"}])
"""

from .generate import generate, reply
from .interface import DecodingModel, PolicyModel, score_logits, token_logprobs
from .llama import LlamaCache, LlamaConfig, LlamaLM
from .pretrained import CheckpointError, Pretrained, load_pretrained
from .tokenizer import ChatTemplate, PretrainedTokenizer, TokenizerError
from .transformer import DecodeCache, DecoderLM, TransformerConfig

__all__ = ["PolicyModel", "DecodingModel", "token_logprobs", "score_logits", "DecoderLM", "DecodeCache",
           "TransformerConfig", "LlamaConfig", "LlamaLM", "LlamaCache", "load_pretrained", "Pretrained",
           "CheckpointError", "PretrainedTokenizer", "ChatTemplate", "TokenizerError", "generate", "reply"]
