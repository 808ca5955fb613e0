"""A pretrained checkpoint's tokenizer and chat template, built from what the checkpoint says.

``PretrainedTokenizer`` wraps a ``tokenizers.Tokenizer``: from a Hugging Face directory's
``tokenizer.json`` (+ ``tokenizer_config.json``), or from a GGUF file's metadata (the BPE
vocabulary and merges, the pre-tokenizer named by ``tokenizer.ggml.pre``, the control
tokens as special tokens, BOS only where ``tokenizer.ggml.add_bos_token`` says so).
``encode(text)`` adds only what the checkpoint says (special tokens written in the text are
read as the special tokens, as transformers does); ``decode(ids)`` drops nothing unless asked.

``ChatTemplate`` renders the checkpoint's own jinja template the way transformers'
``apply_chat_template`` does: a sandboxed environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter, ``raise_exception``
and ``strftime_now``, and ``bos_token`` / ``eos_token`` in scope.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence


class TokenizerError(ValueError):
    """A tokenizer or chat template the checkpoint does not describe well enough to build."""


class ChatTemplateError(ValueError):
    """The chat template refused the messages (its ``raise_exception``), with the template's words."""


# GGUF ``tokenizer.ggml.pre`` -> the regex split before the byte-level step (llama.cpp's names). None: the
# GPT-2 byte-level regex alone. "smollm": every digit on its own, then GPT-2's (SmolLM / StarCoder).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = ("default", "gpt2", "smollm", "starcoder", "llama-bpe", "llama3", "qwen2")
_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types
# chat templates' end-of-turn tokens: one ends a reply where the checkpoint's template writes it
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>")


def _template_end_ids(template: str, token_id) -> set[int]:
    """The ids of the end-of-turn tokens (``_END_OF_TURN``) that ``template`` writes and the vocabulary
    has (``token_id(token)``: its id or None)."""
    ids = {token_id(t) for t in _END_OF_TURN if t in template}
    ids.discard(None)
    return ids


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    if pre in ("default", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    split = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}.get(pre)
    if split is None:
        raise TokenizerError(f"GGUF tokenizer.ggml.pre={pre!r} is not one this loader knows ({', '.join(PRE_TOKENIZERS)}); "
                             "load the model from its Hugging Face directory (tokenizer.json) instead.")
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


@dataclasses.dataclass
class PretrainedTokenizer:
    """``encode(text) -> list[int]``, ``decode(ids) -> str``; ``end_of_turn_ids`` (the ids that end a
    reply: EOS, and the chat template's end-of-turn token), ``pad_id``, ``bos_token`` /
    ``eos_token`` (strings, for the chat template), ``add_bos`` (prepended by ``encode``);
    ``model_vocab``: the rows of the model's embedding when the tokenizer has more tokens than that
    (``load_pretrained`` sets it): ``encode`` then refuses text with a token the model cannot embed, where
    the model would read an out-of-range row (NaN on accelerators and CPU alike) without a word."""

    backend: Any  # tokenizers.Tokenizer
    end_of_turn_ids: tuple[int, ...]
    pad_id: int
    bos_token: Optional[str]
    eos_token: Optional[str]
    add_bos: bool = False
    model_vocab: Optional[int] = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``; ``add_special_tokens``: prepend BOS where the checkpoint says so
        (``add_bos``). Chat text is encoded without (its template writes what it wants)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}.")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_token is not None:
            ids = [self.backend.token_to_id(self.bos_token), *ids]
        if self.model_vocab is not None and ids and max(ids) >= self.model_vocab:
            bad = next(i for i in ids if i >= self.model_vocab)
            raise ValueError(f"the text holds token {self.backend.id_to_token(bad)!r} (id {bad}), outside the model's "
                             f"{self.model_vocab}-token vocabulary (its tokenizer has {self.vocab_size}): the tokenizer "
                             "and the checkpoint do not match; load a checkpoint whose embedding covers its tokenizer.")
        return list(ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> Optional[int]:
        return self.backend.token_to_id(token)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> "PretrainedTokenizer":
        """Build from a GGUF file's ``tokenizer.ggml.*`` metadata (a BPE vocabulary: ``model`` gpt2)."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, processors

        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise TokenizerError(f"GGUF tokenizer.ggml.model={kind!r}: only byte-level BPE vocabularies ('gpt2') are "
                                 "built from GGUF metadata; load the model from its Hugging Face directory "
                                 "(tokenizer.json) instead.")
        tokens = list(meta["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        tok.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        special = [t for t, ty in zip(tokens, types) if ty in (_CONTROL, _USER_DEFINED)]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])

        def name(key):
            i = meta.get(key)
            return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

        eos_id = meta.get("tokenizer.ggml.eos_token_id")
        eot = {int(i) for i in (eos_id, meta.get("tokenizer.ggml.eot_token_id")) if i is not None}
        template = str(meta.get("tokenizer.chat_template", ""))
        eot |= _template_end_ids(template, vocab.get)
        pad = meta.get("tokenizer.ggml.padding_token_id", eos_id)
        return cls(tok, tuple(sorted(eot)), int(pad if pad is not None else 0), name("tokenizer.ggml.bos_token_id"),
                   name("tokenizer.ggml.eos_token_id"), bool(meta.get("tokenizer.ggml.add_bos_token", False)))

    @classmethod
    def from_hf_files(cls, tokenizer_json: str, config: Mapping[str, Any],
                      generation_config: Optional[Mapping[str, Any]] = None) -> "PretrainedTokenizer":
        """Build from ``tokenizer.json`` and the ``tokenizer_config.json`` dict (its ``bos_token``,
        ``eos_token``, ``pad_token``, ``add_bos_token``); ``generation_config`` adds its eos ids."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_json))

        def text(v):
            return v.get("content") if isinstance(v, Mapping) else v

        bos, eos, pad = text(config.get("bos_token")), text(config.get("eos_token")), text(config.get("pad_token"))
        eot = {tok.token_to_id(t) for t in (eos,) if t is not None}
        gen = (generation_config or {}).get("eos_token_id")
        eot |= set(gen if isinstance(gen, list) else [gen] if gen is not None else [])
        template = str(config.get("chat_template") or "")
        eot |= _template_end_ids(template, tok.token_to_id)
        eot.discard(None)
        if not eot:
            raise TokenizerError("tokenizer_config.json names no eos_token (and generation_config.json no "
                                 "eos_token_id): a reply would never end; add one.")
        pad_id = tok.token_to_id(pad) if pad is not None else None
        return cls(tok, tuple(sorted(int(i) for i in eot)), int(pad_id if pad_id is not None else min(eot)), bos, eos,
                   bool(config.get("add_bos_token", False)))


class ChatTemplate:
    """The checkpoint's jinja chat template: ``template(messages, add_generation_prompt=True) -> str``
    (messages: a list of {"role": ..., "content": ...}), rendered as transformers renders it."""

    def __init__(self, source: str, *, bos_token: Optional[str], eos_token: Optional[str]):
        if not source:
            raise TokenizerError("the checkpoint has no chat template (GGUF tokenizer.chat_template, or "
                                 "tokenizer_config.json's chat_template / chat_template.jinja); give one.")
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ChatTemplateError(f"the chat template refused the messages: {message}")

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.source = source
        self._template = env.from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token

    def __call__(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True, **kwargs) -> str:
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}.")
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)
