"""Load a pretrained checkpoint as a policy: ``load_pretrained(path) -> Pretrained``.

``path`` is a GGUF file (any quantisation type the ``gguf`` package dequantizes; the llama
and qwen2 architectures) or a Hugging Face checkpoint directory (``config.json``, one
``*.safetensors`` file or a sharded ``model.safetensors.index.json``, ``tokenizer.json``,
``tokenizer_config.json``; the Llama, Mistral-style Llama, Qwen2 and SmolLM families). It
returns the model (``LlamaLM``: ``model(tokens, mask) -> logits``, the decode contract, the
scoring shortcut), its tokenizer, its chat template and its config.

The parameters are placed as they are read: the module is built abstractly
(``nnx.eval_shape``: no random initialisation), and each tensor is read (and dequantized)
alone, transformed to the module's layout, cast to the model's dtype and put on its device
(with ``mesh``, sharded by the module's partition annotations), so no second full float32
copy is ever held and a checkpoint larger than one host's memory can go straight to a pod.

Layout notes. Linear weights are stored [out, in] by both formats and [in, out] by Flax.
llama.cpp's converter permutes the rows of the Q and K projections of llama-architecture GGUF
files (from the Hugging Face rotate-half layout to an interleaved one); this loader undoes it,
so the one RoPE (rotate-half) serves both formats. An unknown architecture, tensor, shape or
quantisation type raises ``CheckpointError`` naming it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .llama import LlamaConfig, LlamaLM
from .tokenizer import ChatTemplate, PretrainedTokenizer

ARCHITECTURES = ("llama", "qwen2")  # GGUF general.architecture; HF: LlamaForCausalLM, Qwen2ForCausalLM, ...
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "llama"}


class CheckpointError(ValueError):
    """A checkpoint this loader cannot read as it is: the message names the file, tensor or field."""


@dataclasses.dataclass
class Pretrained:
    """A loaded checkpoint: ``model`` (``LlamaLM``), ``tokenizer`` (``PretrainedTokenizer``),
    ``chat_template`` (``ChatTemplate``: ``chat_template(messages, add_generation_prompt=True) -> str``),
    ``config`` (``LlamaConfig``) and ``source`` (the path it came from)."""

    model: LlamaLM
    tokenizer: PretrainedTokenizer
    chat_template: ChatTemplate
    config: LlamaConfig
    source: str

    def prompt_ids(self, messages, *, add_generation_prompt: bool = True) -> list[int]:
        """The token ids of ``messages`` rendered by the chat template (what generation starts from),
        encoded without adding special tokens, as transformers' ``apply_chat_template`` does: the
        template writes BOS itself where the checkpoint wants one (``{{ bos_token }}``)."""
        text = self.chat_template(messages, add_generation_prompt=add_generation_prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)


# ------------------------------------------------------------------------------------------ layout


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved pairs -> rotate-half halves), rows = heads x D."""
    rows = w.shape[0]
    d = rows // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _targets(cfg: LlamaConfig, arch: str, gguf_names: bool) -> dict[str, tuple[tuple, Callable]]:
    """Checkpoint tensor name -> (the module's parameter path, transform of the [out, in] array)."""
    T = lambda w: w.T
    same = lambda w: w
    perm = arch == "llama" and gguf_names
    q_fix = (lambda w: _unpermute(w, cfg.heads)) if perm else same
    k_fix = (lambda w: _unpermute(w, cfg.kv_heads)) if perm else same
    out = {}
    if gguf_names:
        out["token_embd.weight"] = (("embed", "embedding"), same)
        out["output_norm.weight"] = (("norm", "scale"), same)
        out["output.weight"] = (("lm_head", "kernel"), T)
        for i in range(cfg.layers):
            b = f"blk.{i}."
            L = ("layers", i)
            out.update({
                b + "attn_norm.weight": (L + ("attn_norm", "scale"), same),
                b + "ffn_norm.weight": (L + ("mlp_norm", "scale"), same),
                b + "attn_q.weight": (L + ("q_proj", "kernel"), lambda w, f=q_fix: f(w).T),
                b + "attn_k.weight": (L + ("k_proj", "kernel"), lambda w, f=k_fix: f(w).T),
                b + "attn_v.weight": (L + ("v_proj", "kernel"), T),
                b + "attn_q.bias": (L + ("q_proj", "bias"), q_fix),
                b + "attn_k.bias": (L + ("k_proj", "bias"), k_fix),
                b + "attn_v.bias": (L + ("v_proj", "bias"), same),
                b + "attn_output.weight": (L + ("o_proj", "kernel"), T),
                b + "ffn_gate.weight": (L + ("gate_proj", "kernel"), T),
                b + "ffn_up.weight": (L + ("up_proj", "kernel"), T),
                b + "ffn_down.weight": (L + ("down_proj", "kernel"), T),
            })
    else:
        out["model.embed_tokens.weight"] = (("embed", "embedding"), same)
        out["model.norm.weight"] = (("norm", "scale"), same)
        out["lm_head.weight"] = (("lm_head", "kernel"), T)
        for i in range(cfg.layers):
            b = f"model.layers.{i}."
            L = ("layers", i)
            out.update({
                b + "input_layernorm.weight": (L + ("attn_norm", "scale"), same),
                b + "post_attention_layernorm.weight": (L + ("mlp_norm", "scale"), same),
                **{b + f"self_attn.{p}.weight": (L + (p, "kernel"), T) for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
                **{b + f"self_attn.{p}.bias": (L + (p, "bias"), same) for p in ("q_proj", "k_proj", "v_proj")},
                **{b + f"mlp.{p}.weight": (L + (p, "kernel"), T) for p in ("gate_proj", "up_proj", "down_proj")},
            })
    return out


def _assemble(cfg: LlamaConfig, arch: str, tensors: Iterator[tuple[str, Callable[[], np.ndarray]]], *,
              gguf_names: bool, mesh: Optional[jax.sharding.Mesh], where: str) -> LlamaLM:
    """Fill an abstract ``LlamaLM(cfg)`` tensor by tensor (see the module docstring)."""
    abstract = nnx.eval_shape(lambda: LlamaLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    pure = nnx.to_pure_dict(state)
    specs = nnx.to_pure_dict(nnx.get_partition_spec(state)) if mesh is not None else None
    targets = _targets(cfg, arch, gguf_names)
    tied_skip = {"output.weight", "lm_head.weight"} if cfg.tie_embeddings else set()
    filled = set()
    dtype = cfg.jnp_dtype

    for name, read in tensors:
        if name in tied_skip:
            continue
        if name.endswith("rotary_emb.inv_freq"):
            continue  # some Hugging Face checkpoints store RoPE's frequencies: recomputed from the config
        if name not in targets:
            raise CheckpointError(f"{where}: tensor {name!r} has no place in a {arch} model of this config "
                                  f"({cfg.layers} layers, attention_bias={cfg.attention_bias}); it is not a "
                                  "checkpoint this loader reads.")
        path, transform = targets[name]
        parent, leaf = _node(pure, path[:-1]), path[-1]
        if parent is None or leaf not in parent:
            raise CheckpointError(f"{where}: tensor {name!r} has no parameter {'.'.join(map(str, path))} in this model.")
        expected = tuple(parent[leaf].shape)
        try:
            arr = transform(np.asarray(read(), np.float32))
        except CheckpointError:
            raise
        except Exception as e:  # an unsupported quantisation type, a cut file
            raise CheckpointError(f"{where}: tensor {name!r} could not be read: {type(e).__name__}: {e}") from e
        if tuple(arr.shape) != expected:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {tuple(arr.shape)} after conversion; the model "
                                  f"expects {expected} for {'.'.join(map(str, path))}.")
        value = jnp.asarray(arr, dtype)
        if mesh is not None:
            value = jax.device_put(value, jax.sharding.NamedSharding(mesh, _node(specs, path)))
        parent[leaf] = value
        filled.add(path)
        del arr
    # every target the model has (no biases without attention_bias, no lm_head when tied) must be filled
    missing = [".".join(map(str, p)) for p, _ in targets.values() if p not in filled and _node(pure, p) is not None]
    if missing:
        raise CheckpointError(f"{where}: the checkpoint lacks {len(missing)} parameter(s) of the model, e.g. "
                              f"{', '.join(missing[:4])}.")
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)


def _node(tree, path):
    """The subtree of a pure parameter dict at ``path``, or None where the model has no such entry."""
    for p in path:
        if not isinstance(tree, Mapping) or p not in tree:
            return None
        tree = tree[p]
    return tree


# ------------------------------------------------------------------------------------------ GGUF


def _gguf_fields(reader) -> dict[str, Any]:
    out = {}
    for key, field in reader.fields.items():
        try:
            out[key] = field.contents()
        except Exception:  # noqa: BLE001  (a field type the package cannot decode: not one we read)
            continue
    return out


def _within_window(context: Optional[int], trained: int, window, where: str) -> int:
    """The context to allow: ``context`` (default the checkpoint's), at most the sliding-attention
    window. Within the window, sliding-window attention (Mistral's ``sliding_window``) is full
    causal attention, so every sequence the model accepts is computed exactly; a longer one is
    refused (``LlamaConfig.context``) rather than attended past the window."""
    ctx = int(context or trained)
    if window is None:
        return ctx
    window = int(window)
    if context is not None and context > window:
        raise CheckpointError(f"{where}: context={context} exceeds the checkpoint's sliding attention window of "
                              f"{window} tokens, which this loader does not implement beyond the window; ask for at "
                              f"most context={window}.")
    return min(ctx, window)


def select_chat_template(value, where: str) -> str:
    """A ``chat_template`` field as text: a string, or a list of named templates (some
    tokenizer_config.json files), of which the one named "default" is taken, as transformers
    takes it; a list without one, or a field of another type, is refused naming it."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list) and all(isinstance(t, Mapping) and "name" in t and "template" in t for t in value):
        named = {t["name"]: t["template"] for t in value}
        if "default" in named:
            return str(named["default"])
        raise CheckpointError(f"{where}: chat_template lists templates named {sorted(named)} but none named "
                              "'default'; put the one to use under the name 'default'.")
    raise CheckpointError(f"{where}: chat_template is a {type(value).__name__}; give a string or a list of "
                          "{'name': ..., 'template': ...} entries.")


def _gguf_config(meta: Mapping[str, Any], names: set[str], *, dtype: str, context: Optional[int], where: str):
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{where}: general.architecture={arch!r} is not supported; this loader reads "
                              f"{', '.join(ARCHITECTURES)} (Llama, SmolLM, Qwen2 and kin).")
    g = lambda k, d=None: meta.get(f"{arch}.{k}", d)
    if "rope_freqs.weight" in names:
        raise CheckpointError(f"{where}: tensor 'rope_freqs.weight' (llama.cpp's baked RoPE scaling) is not "
                              "supported; load the Hugging Face directory, whose config.json names the scaling.")
    scaling = g("rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise CheckpointError(f"{where}: {arch}.rope.scaling.type={scaling!r} is not supported (none, linear).")
    n = lambda k, kind=int, default=None: _number(meta, f"{arch}.{k}", kind, where, default, source="GGUF metadata",
                                                  fix="the file is incomplete: convert the checkpoint again")
    heads, hidden = n("attention.head_count"), n("embedding_length")
    layers, intermediate = n("block_count"), n("feed_forward_length")
    if heads < 1:
        raise CheckpointError(f"{where}: GGUF metadata's {arch}.attention.head_count is {heads}; it must be at least 1.")
    context = _within_window(context, n("context_length", int, 2048), n("attention.sliding_window", int, 0) or None, where)
    tokens = meta.get("tokenizer.ggml.tokens")
    if f"{arch}.vocab_size" not in meta and not isinstance(tokens, list):
        raise CheckpointError(f"{where}: GGUF metadata has neither {arch}.vocab_size nor a tokenizer.ggml.tokens list; "
                              "the file is incomplete: convert the checkpoint again.")
    vocab = n("vocab_size") if f"{arch}.vocab_size" in meta else len(tokens)
    try:
        cfg = LlamaConfig(vocab=vocab, hidden=hidden, layers=layers, heads=heads,
                          kv_heads=n("attention.head_count_kv", int, heads),
                          head_dim=n("attention.key_length", int, hidden // heads), intermediate=intermediate,
                          rope_theta=n("rope.freq_base", float, 10000.0),
                          rope_type="linear" if scaling == "linear" else "default",
                          rope_factor=n("rope.scaling.factor", float, 1.0) if scaling == "linear" else 1.0,
                          rms_eps=n("attention.layer_norm_rms_epsilon", float, 1e-5),
                          tie_embeddings="output.weight" not in names, attention_bias="blk.0.attn_q.bias" in names,
                          context=context, dtype=dtype)
    except ValueError as e:  # LlamaConfig's own checks name the field
        keys = {"vocab": "vocab_size", "hidden": "embedding_length", "layers": "block_count",
                "heads": "attention.head_count", "kv_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
                "intermediate": "feed_forward_length", "rope_theta": "rope.freq_base", "rope_factor": "rope.scaling.factor",
                "rms_eps": "attention.layer_norm_rms_epsilon", "context": "context_length"}
        raise _config_error(e, where, "GGUF metadata", {f: f"{arch}.{k}" for f, k in keys.items()}) from e
    return arch, cfg


def _load_gguf(path: Path, *, dtype: str, mesh, context):
    try:
        import gguf
    except ImportError as e:
        raise ImportError("reading GGUF files needs the gguf package: pip install 'bepo-jax[llm]'.") from e
    where = f"GGUF file {path}"
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001  (numpy/mmap errors of a cut or foreign file)
        raise CheckpointError(f"{where} is truncated or not a GGUF file ({type(e).__name__}: {e}).") from e
    meta = _gguf_fields(reader)
    names = {t.name for t in reader.tensors}
    arch, cfg = _gguf_config(meta, names, dtype=dtype, context=context, where=where)

    def tensors():
        for t in reader.tensors:
            def read(t=t):
                try:
                    return gguf.quants.dequantize(t.data, t.tensor_type)
                except NotImplementedError as e:
                    raise CheckpointError(f"{where}: tensor {t.name!r} has quantisation type {t.tensor_type.name}, "
                                          "which the gguf package cannot dequantize.") from e
            yield t.name, read

    tok = PretrainedTokenizer.from_gguf_metadata(meta)  # before the weights, as for a directory
    chat = ChatTemplate(str(meta.get("tokenizer.chat_template", "")), bos_token=tok.bos_token, eos_token=tok.eos_token)
    model = _assemble(cfg, arch, tensors(), gguf_names=True, mesh=mesh, where=where)
    return model, tok, chat, cfg


# ------------------------------------------------------------------------------------------ Hugging Face


def _number(c: Mapping[str, Any], key: str, kind, where: str, default=None, *, source: str = "config.json",
            fix: str = "copy the checkpoint's own config.json"):
    """``source``'s ``key`` as ``kind`` (int or float); absent or null: ``default`` (None: required).
    Anything else (a string, a list, a bool, a fractional int) is refused naming the key."""
    v = c.get(key)
    if v is None:
        if default is None:
            raise CheckpointError(f"{where}: {source} lacks {key!r}, which the model needs; {fix}.")
        return default
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or float(v).is_integer())
    if not ok:
        raise CheckpointError(f"{where}: {source}'s {key!r} is {v!r}; it must be {'an integer' if kind is int else 'a number'}.")
    return kind(v)


def _config_error(e: ValueError, where: str, source: str, keys: Mapping[str, str]) -> CheckpointError:
    """LlamaConfig's refusal ``e`` in the checkpoint's terms: each LlamaConfig field it names is
    given with the ``source`` key it was read from (``keys``: field -> key)."""
    named = [f"{f} is {source}'s {k!r}" for f, k in keys.items() if re.search(rf"\b{f}\b", str(e))]
    return CheckpointError(f"{where}: {source} gives {e}" + (f" ({'; '.join(named)})" if named else ""))


def _hf_config(c: Mapping[str, Any], *, dtype: str, context: Optional[int], where: str):
    archs = c.get("architectures") or []
    arch = next((HF_ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in HF_ARCHITECTURES), None)
    if arch is None:
        raise CheckpointError(f"{where}: architectures={archs!r} is not supported; this loader reads "
                              f"{', '.join(HF_ARCHITECTURES)}.")
    rs = c.get("rope_scaling") or c.get("rope_parameters") or {}
    if not isinstance(rs, Mapping):
        raise CheckpointError(f"{where}: config.json's rope_scaling / rope_parameters is {rs!r}; it must be an object.")
    rope_type = rs.get("rope_type", rs.get("type", "default")) if rs else "default"
    if rope_type not in ("default", "linear", "llama3"):
        raise CheckpointError(f"{where}: rope_scaling type {rope_type!r} is not supported (default, linear, llama3).")
    n = lambda key, kind=int, default=None: _number(c, key, kind, where, default)
    r = lambda key, default: _number(rs, key, float, f"{where} (rope_scaling)", default)
    heads, hidden = n("num_attention_heads"), n("hidden_size")
    layers, intermediate, vocab = n("num_hidden_layers"), n("intermediate_size"), n("vocab_size")
    if heads < 1:
        raise CheckpointError(f"{where}: config.json's 'num_attention_heads' is {heads}; it must be at least 1.")
    theta = n("rope_theta", float, r("rope_theta", 10000.0))
    use_window = c.get("use_sliding_window", True) is not False
    window = n("sliding_window", int, 0) if use_window else 0
    context = _within_window(context, n("max_position_embeddings", int, 2048), window or None, where)
    try:
        cfg = LlamaConfig(vocab=vocab, hidden=hidden, layers=layers, heads=heads,
                          kv_heads=n("num_key_value_heads", int, heads), head_dim=n("head_dim", int, hidden // heads),
                          intermediate=intermediate, rope_theta=theta, rope_type=rope_type,
                          rope_factor=r("factor", 1.0), rope_low_freq_factor=r("low_freq_factor", 1.0),
                          rope_high_freq_factor=r("high_freq_factor", 4.0),
                          rope_original_context=int(r("original_max_position_embeddings", 8192)),
                          rms_eps=n("rms_norm_eps", float, 1e-6), tie_embeddings=bool(c.get("tie_word_embeddings", False)),
                          attention_bias=bool(c.get("attention_bias", arch == "qwen2")), context=context, dtype=dtype)
    except ValueError as e:  # LlamaConfig's own checks name the field
        raise _config_error(e, where, "config.json", {
            "vocab": "vocab_size", "hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
            "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "intermediate": "intermediate_size",
            "rope_theta": "rope_theta", "rms_eps": "rms_norm_eps", "context": "max_position_embeddings"}) from e
    return arch, cfg


def _load_hf(path: Path, *, dtype: str, mesh, context):
    where = f"checkpoint directory {path}"
    if not (path / "config.json").exists():
        raise CheckpointError(f"{where} has no config.json: give a Hugging Face checkpoint directory or a GGUF file.")
    arch, cfg = _hf_config(json.loads((path / "config.json").read_text()), dtype=dtype, context=context, where=where)
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{where} holds no *.safetensors weights (nor model.safetensors.index.json).")
    try:
        from safetensors import safe_open
    except ImportError as e:
        raise ImportError("reading safetensors needs the safetensors package: pip install 'bepo-jax[llm]'.") from e

    def tensors():
        for f in files:
            if not (path / f).exists():
                raise CheckpointError(f"{where}: the index names {f}, which is missing.")
            with safe_open(str(path / f), framework="numpy") as st:
                for name in st.keys():
                    yield name, (lambda st=st, name=name: st.get_tensor(name))

    # the tokenizer and the template first: a checkpoint that cannot talk is refused before its weights load
    tcfg = json.loads((path / "tokenizer_config.json").read_text()) if (path / "tokenizer_config.json").exists() else {}
    if (path / "chat_template.jinja").exists():
        tcfg["chat_template"] = (path / "chat_template.jinja").read_text()
    tcfg["chat_template"] = select_chat_template(tcfg.get("chat_template"), where)
    if not (path / "tokenizer.json").exists():
        raise CheckpointError(f"{where} has no tokenizer.json: copy the checkpoint's tokenizer files beside its weights.")
    gen = json.loads((path / "generation_config.json").read_text()) if (path / "generation_config.json").exists() else {}
    tok = PretrainedTokenizer.from_hf_files(path / "tokenizer.json", tcfg, gen)
    chat = ChatTemplate(tcfg["chat_template"], bos_token=tok.bos_token, eos_token=tok.eos_token)
    model = _assemble(cfg, arch, tensors(), gguf_names=False, mesh=mesh, where=where)
    return model, tok, chat, cfg


# ------------------------------------------------------------------------------------------ entry


def load_pretrained(path, *, dtype: str = "float32", mesh: Optional[jax.sharding.Mesh] = None,
                    context: Optional[int] = None) -> Pretrained:
    """Load a GGUF file or a Hugging Face checkpoint directory (module docstring).

    ``dtype``: "float32" (the default on CPU) or "bfloat16"; ``mesh``: place the parameters sharded
    over its ``"fsdp"`` / ``"model"`` axes as they load; ``context``: the longest sequence to allow
    (default: the checkpoint's). A name of the model registry (``smollm2-135m``) resolves to its
    fetched file (``bepo-jax models fetch``). What is wrong with a checkpoint is said before any weight
    loads, naming the file and the fix:

    >>> import tempfile
    >>> load_pretrained(tempfile.mkdtemp())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bepo_jax.agent.models.pretrained.CheckpointError: checkpoint directory ... has no config.json: give a Hugging Face checkpoint directory or a GGUF file.

    With the model fetched, ``pre = load_pretrained("smollm2-135m")`` gives the model, its tokenizer and
    its chat template, and ``generate.reply(pre, [{"role": "user", "content": "Hi"}])`` its answer
    (docs/models.md runs both)."""
    from .hub import resolve

    p = resolve(str(path))
    if not p.exists():
        raise FileNotFoundError(f"no checkpoint at {p}: give a GGUF file or a Hugging Face directory.")
    if p.is_dir():
        model, tok, chat, cfg = _load_hf(p, dtype=dtype, mesh=mesh, context=context)
    else:
        model, tok, chat, cfg = _load_gguf(p, dtype=dtype, mesh=mesh, context=context)
    special = [i for i in (*tok.end_of_turn_ids, tok.pad_id) if i >= cfg.vocab]
    if special:
        raise CheckpointError(f"{p}: the tokenizer's end-of-turn / pad ids {special} are outside the model's {cfg.vocab}-"
                              "token vocabulary: the tokenizer and the checkpoint do not match.")
    if tok.vocab_size > cfg.vocab:  # a smaller embedding than the tokenizer: text with a token beyond it is refused
        tok.model_vocab = cfg.vocab
    return Pretrained(model, tok, chat, cfg, str(p))
