"""A pretrained checkpoint in Tunix's own model classes, with its tokenizer and chat template.

``to_tunix(pre, family)`` takes what ``bepo_jax.agent.models.load_pretrained`` read (a GGUF file or a
Hugging Face directory: SmolLM2, Llama, Qwen2 ...) and builds Tunix's ``qwen2.Qwen2`` or
``llama3.Llama3`` from it through Tunix's own safetensors loader: the weights are written under
Hugging Face's names in its [out, in] layout (``hf_tensors``, the loader's name table read
backwards) and Tunix's key mapping places them, so the model a Tunix user gets is the one Tunix's
own loading path would give for the same Hugging Face checkpoint.

What each class can hold (checked before any weight moves; ``TunixBridgeError`` names the field):

- ``qwen2``: RMSNorm, SwiGLU, grouped-query attention with q/k/v biases, RoPE with
  ``config.rope_theta``. A Llama checkpoint (no biases) is exact with zero biases. No RoPE
  scaling (Llama 3.1's ``rope_type="llama3"``, linear).
- ``llama3``: no q/k/v biases; Tunix 0.1.7 (and its main branch of 2026-08-21) rotates with
  theta 1e6 whatever ``config.rope_theta`` says (``apply_rope``'s default; the attention never
  passes it). ``llama3_honours_rope_theta()`` probes that on a tiny model; while it does not,
  a checkpoint whose theta is not 1e6 is refused (SmolLM2's is 1e5; Llama 3's own 5e5).
- ``qwen3``: always applies q/k norms, so it cannot hold a Llama or Qwen2 checkpoint: refused.

``TunixTokenizer`` gives Tunix's ``TokenizerAdapter`` the methods it asks of a custom tokenizer
(encode, decode, bos_id, eos_id, pad_id); ``TemplateChatParser`` renders messages with the
checkpoint's own chat template in the incremental way Tunix's agentic collector calls its chat
parser (a continuation is the template's text for the longer conversation minus its text for the
shorter one), so the token stream Tunix trains on is the template's.
"""

from __future__ import annotations

import functools
import importlib
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ...agent.models.pretrained import CheckpointError, Pretrained, _node, _targets

FAMILIES = ("qwen2", "llama3")
LLAMA3_FIXED_THETA = 1_000_000.0  # what Tunix's llama3 class rotates with (apply_rope's default)


class TunixBridgeError(CheckpointError):
    """A checkpoint that a Tunix model class cannot represent as it is: the message names the field."""


def hf_tensors(pre: Pretrained) -> dict[str, np.ndarray]:
    """The model's parameters under Hugging Face's names, float32, [out, in] (the loader's name table
    ``pretrained._targets`` read backwards: its transforms are the identity or a transpose). Tied
    embeddings have no ``lm_head.weight``; a model without q/k/v biases has none."""
    from flax import nnx

    pure = nnx.to_pure_dict(nnx.state(pre.model, nnx.Param))
    out = {}
    for name, (path, transform) in _targets(pre.config, "qwen2" if pre.config.attention_bias else "llama",
                                            gguf_names=False).items():
        value = _node(pure, path)
        if value is None:
            continue
        out[name] = np.ascontiguousarray(transform(np.asarray(value, np.float32)))
    return out


def _check(cfg, family: str) -> None:
    """Refuse, by name, what ``family``'s class cannot represent."""
    if family not in FAMILIES:
        hint = (" (qwen3 always applies q/k norms, so it cannot hold a Llama or Qwen2 checkpoint)"
                if family == "qwen3" else "")
        raise TunixBridgeError(f"to_tunix: family={family!r}{hint}; valid families: {', '.join(FAMILIES)}.")
    if cfg.rope_type != "default":
        raise TunixBridgeError(f"to_tunix: the checkpoint scales RoPE (rope_type={cfg.rope_type!r}, factor "
                               f"{cfg.rope_factor}); Tunix's {family} class has no RoPE scaling, so its positions "
                               "would be wrong. Use bepo_jax's own LlamaLM for this checkpoint.")
    if family == "llama3":
        if cfg.attention_bias:
            raise TunixBridgeError("to_tunix: the checkpoint has q/k/v biases (attention_bias=True); Tunix's llama3 "
                                   "class has none. Use family='qwen2'.")
        if float(cfg.rope_theta) != LLAMA3_FIXED_THETA and not llama3_honours_rope_theta():
            raise TunixBridgeError(f"to_tunix: the checkpoint's rope_theta is {cfg.rope_theta:g}, but this Tunix's "
                                   f"llama3 class rotates with theta {LLAMA3_FIXED_THETA:g} whatever its config says "
                                   "(apply_rope's default is never overridden), so every position after the first "
                                   "would be wrong. Use family='qwen2' (exact for Llama checkpoints, zero biases).")


@functools.lru_cache(maxsize=1)
def llama3_honours_rope_theta() -> bool:
    """Whether this Tunix's llama3 class rotates with ``config.rope_theta``: a 1-layer model with
    the same weights under theta 1e4 and 1e6 gives different logits at position 3 iff it does."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from tunix.models.llama3 import model as llama3

    def logits(theta):
        cfg = llama3.ModelConfig(num_layers=1, vocab_size=8, embed_dim=8, hidden_dim=16, num_heads=2, head_dim=4,
                                 num_kv_heads=1, rope_theta=int(theta), norm_eps=1e-5)
        m = llama3.Llama3(cfg, rngs=nnx.Rngs(0))
        tokens = jnp.array([[1, 2, 3, 4]], jnp.int32)
        mask = jnp.tril(jnp.ones((1, 4, 4), bool))
        return np.asarray(m(tokens, jnp.arange(4)[None], None, mask)[0])

    with jax.default_device(jax.devices("cpu")[0]):
        return not np.allclose(logits(1e4), logits(1e6))


def tunix_config(pre: Pretrained, family: str = "qwen2", **fields):
    """Tunix's ``ModelConfig`` of ``family`` for this checkpoint (``fields``: further ModelConfig
    fields, e.g. ``shd_config``, ``remat_config``, ``param_dtype``)."""
    cfg = pre.config
    _check(cfg, family)
    tied = {"qwen2": "use_tied_embedding", "llama3": "weight_tying"}[family]  # the two classes' names for it
    return _tunix_module(family, "model").ModelConfig(num_layers=cfg.layers, vocab_size=cfg.vocab, embed_dim=cfg.hidden,
                           hidden_dim=cfg.intermediate, num_heads=cfg.heads, head_dim=cfg.head_dim,
                           num_kv_heads=cfg.kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=float(cfg.rms_eps),
                           **{tied: bool(cfg.tie_embeddings)}, **fields)


def _tunix_module(family: str, part: str):
    """Tunix's ``tunix.models.<family>.<part>`` module (``model`` or ``params``)."""
    return importlib.import_module(f"tunix.models.{family}.{part}")


def to_tunix(pre: Pretrained, family: str = "qwen2", *, mesh=None, dtype=None, config_fields: Optional[dict] = None):
    """Tunix's ``family`` model ("qwen2" or "llama3") holding ``pre``'s weights, loaded by Tunix's own
    safetensors loader from a temporary Hugging Face-layout copy (``hf_tensors``; zero q/k/v biases
    for a checkpoint without them in ``qwen2``). ``mesh``/``dtype``: as Tunix's
    ``create_model_from_safe_tensors`` takes them. Refuses (``TunixBridgeError``) what the class
    cannot represent (module docstring)."""
    from safetensors.numpy import save_file

    config = tunix_config(pre, family, **(config_fields or {}))
    tensors = hf_tensors(pre)
    cfg = pre.config
    if family == "qwen2" and not cfg.attention_bias:
        for i in range(cfg.layers):
            for p, n in (("q_proj", cfg.heads), ("k_proj", cfg.kv_heads), ("v_proj", cfg.kv_heads)):
                tensors[f"model.layers.{i}.self_attn.{p}.bias"] = np.zeros(n * cfg.head_dim, np.float32)
    with tempfile.TemporaryDirectory(prefix="bepo_tunix_") as d:
        save_file(tensors, str(Path(d) / "model.safetensors"))
        del tensors
        return _tunix_module(family, "params").create_model_from_safe_tensors(d, config, mesh=mesh, dtype=dtype)


class TunixTokenizer:
    """The checkpoint's tokenizer with the methods Tunix's ``TokenizerAdapter`` asks of a custom one
    (``TokenizerAdapter(TunixTokenizer(pre))``). ``encode`` never adds BOS (Tunix encodes pieces of a
    conversation; the chat template writes BOS where the checkpoint wants one). ``bos_id``: the
    vocabulary's BOS, else the end-of-turn token (SmolLM2 has none; Tunix only uses it to drop
    repeated leading BOS ids); ``eos_id``: the token that ends a reply under the chat template;
    ``pad_id``: the checkpoint's padding id."""

    def __init__(self, pre: Pretrained):
        self._tok = pre.tokenizer
        self._eos = _end_of_turn(pre)
        bos = self._tok.token_id(self._tok.bos_token) if self._tok.bos_token else None
        self._bos = bos if bos is not None else self._eos

    def encode(self, text: str, **kwargs) -> list[int]:
        return list(self._tok.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], **kwargs) -> str:
        return self._tok.decode([int(i) for i in ids])

    def bos_id(self) -> int:
        return self._bos

    def eos_id(self) -> int:
        return self._eos

    def pad_id(self) -> int:
        return int(self._tok.pad_id)


def _end_of_turn(pre: Pretrained) -> int:
    """The token that ends an assistant reply under this chat template: the first special token the
    template writes right after an assistant message's content."""
    probe = "\x01probe\x01"
    text = pre.chat_template([{"role": "user", "content": "u"}, {"role": "assistant", "content": probe}],
                             add_generation_prompt=False)
    after = pre.tokenizer.backend.encode(text[text.index(probe) + len(probe):], add_special_tokens=False).ids
    if not after:
        raise TunixBridgeError("TunixTokenizer: the chat template writes nothing after an assistant reply, so no "
                               "token ends a reply; give Tunix's RolloutConfig eos_tokens yourself.")
    return int(after[0])


class TemplateChatParser:
    """Tunix's chat-parser interface over the checkpoint's own chat template.

    ``parse(messages, add_generation_prompt, is_first_msg)``: the first messages render as the
    template renders them (with its default system message, if it has one); a continuation renders
    as ``T(anchor + messages) - T(anchor)``, the text the template adds for these messages after an
    earlier conversation, so concatenating the pieces gives the template's text for the whole
    conversation. ``assistant_token``: the generation prompt (what opens an assistant reply), which
    Tunix strips from an assistant message's own tokens."""

    ANCHOR = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"},
              {"role": "assistant", "content": "a"})

    def __init__(self, pre: Pretrained):
        self._t = pre.chat_template
        user = [{"role": "user", "content": "u"}]
        with_prompt, without = self._t(user, add_generation_prompt=True), self._t(user, add_generation_prompt=False)
        if not with_prompt.startswith(without):
            raise TunixBridgeError("TemplateChatParser: the template's generation prompt is not appended to the "
                                   "conversation's text; Tunix's incremental rendering needs it to be.")
        self.assistant_token = with_prompt[len(without):]
        self.generation_prompt = self.assistant_token
        self._base = self._t(list(self.ANCHOR), add_generation_prompt=False)

    def parse(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
              is_first_msg: bool = False) -> str:
        messages = [dict(m) for m in messages]
        if is_first_msg:
            return self._t(messages, add_generation_prompt=add_generation_prompt)
        full = self._t(list(self.ANCHOR) + messages, add_generation_prompt=add_generation_prompt)
        if not full.startswith(self._base):
            raise TunixBridgeError("TemplateChatParser: this chat template renders an earlier conversation "
                                   "differently once messages follow it, so a continuation cannot be rendered on "
                                   "its own; use Tunix's DefaultChatTemplateParser with a transformers tokenizer.")
        return full[len(self._base):]
