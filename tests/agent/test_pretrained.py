"""A pretrained model loaded by bepo_jax against transformers loading the same checkpoint.

The reference is transformers 5.23 with torch 2.13 (CPU, float32), recorded once by
tests/fixtures/make_llm_reference.py into tests/fixtures/llm/ (token ids, chat templates, the top-16
logits and the logsumexp at every position of three chat prompts, four greedy generations; a tiny
random Qwen2 written with save_pretrained and its logits). The GGUF file is SmolLM2-135M-Instruct
(``bepo-jax models fetch smollm2-135m``; `make test` and CI fetch it first).

Tolerances: both sides dequantize the same Q4_1 / Q8_0 blocks to float32 and run float32, but sum in
different orders over 30 layers; logits are O(10-30), so 2e-3 absolute (about 1e-4 relative) bounds
rounding, while any layout error (the Q/K permutation, RoPE's layout, a norm's eps) moves logits by
O(1) (measured: up to 28).
"""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bepo_jax.agent.models import hub
from bepo_jax.agent.models.generate import generate, reply
from bepo_jax.agent.models.pretrained import CheckpointError, load_pretrained

from .conftest import copy_tiny_qwen2

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llm"
REF = json.loads((FIXTURES / "smollm2_reference.json").read_text())
GGUF = hub.path_of("smollm2-135m")
needs_model = pytest.mark.skipif(not GGUF.exists(), reason="run `bepo-jax models fetch smollm2-135m` (make test does)")
pytestmark = pytest.mark.xdist_group("smollm2")
ATOL = 2e-3


@pytest.fixture
def tiny_dir(tmp_path):
    return copy_tiny_qwen2(tmp_path / "tiny_qwen2")


@pytest.fixture(scope="module")
def smol():
    return load_pretrained(GGUF)


@needs_model
def test_tokenizer_ids_and_decoding_equal_transformers(smol):
    for text, ids in REF["texts"].items():
        assert smol.tokenizer.encode(text) == ids, text
        assert smol.tokenizer.decode(ids) == REF["decoded"][text]
    assert smol.tokenizer.end_of_turn_ids == (2,) and smol.tokenizer.pad_id == 2


@needs_model
def test_chat_template_renders_as_transformers_does(smol):
    for c in REF["chats"]:
        assert smol.chat_template(c["messages"], add_generation_prompt=c["add_generation_prompt"]) == c["text"]


def _check_logits(got, ref):
    got = np.asarray(got, np.float64)
    np.testing.assert_array_equal(got.argmax(-1), np.asarray(ref["top_ids"])[:, 0])
    np.testing.assert_allclose(np.take_along_axis(got, np.asarray(ref["top_ids"]), -1), ref["top_values"], atol=ATOL)
    lse = np.log(np.exp(got - got.max(-1, keepdims=True)).sum(-1)) + got.max(-1)
    np.testing.assert_allclose(lse, ref["logsumexp"], atol=ATOL)


@needs_model
def test_logits_at_every_position_equal_transformers(smol):
    for i, ref in enumerate(REF["logits"]):
        ids = ref["ids"]
        chat = REF["chats"][2 * i]  # the conversation these ids came from, with the generation prompt
        assert chat["add_generation_prompt"] and smol.prompt_ids(chat["messages"]) == ids
        logits = smol.model(jnp.asarray([ids]), jnp.ones((1, len(ids)), bool))[0]
        _check_logits(logits, ref)


@needs_model
def test_logits_with_left_padding_in_a_batch(smol):
    refs = REF["logits"]
    L = max(len(r["ids"]) for r in refs)
    tokens = np.full((len(refs), L), 2, np.int32)
    mask = np.zeros((len(refs), L), bool)
    for i, r in enumerate(refs):
        tokens[i, L - len(r["ids"]):], mask[i, L - len(r["ids"]):] = r["ids"], True
    logits = np.asarray(smol.model(jnp.asarray(tokens), jnp.asarray(mask)))
    for i, r in enumerate(refs):
        _check_logits(logits[i, L - len(r["ids"]):], r)


@needs_model
def test_greedy_generation_equals_transformers_token_for_token(smol):
    """All four prompts decode in one batch (left-padded, the KV cache): each row equals
    transformers' greedy generation of that prompt alone."""
    gens = REF["greedy"]
    assert [g["prompt"] for g in gens] == [smol.prompt_ids(g["messages"]) for g in gens]
    new = generate(smol.model, [g["prompt"] for g in gens], max_tokens=24, stop_ids=(2,), pad_id=2)
    for g, ours in zip(gens, new):
        assert ours == g["new"][:len(ours)] and (len(ours) == len(g["new"]) or ours[-1] == 2), g["messages"]
    assert reply(smol, gens[0]["messages"], max_tokens=24) == gens[0]["text"] == "The capital of France is Paris."


def test_a_hugging_face_directory_loads_to_transformers_logits(tiny_dir):
    """A tiny random Qwen2 (q/k/v biases, an untied head, float16 safetensors) written by transformers'
    save_pretrained: the same logits, the same tokenizer as the GGUF's."""
    pre = load_pretrained(tiny_dir)
    assert pre.config.attention_bias and not pre.config.tie_embeddings and pre.config.kv_heads == 2
    for ref in json.loads((FIXTURES / "tiny_qwen2_logits.json").read_text()):
        ids = ref["ids"]
        _check_logits(pre.model(jnp.asarray([ids]), jnp.ones((1, len(ids)), bool))[0], ref)
    # the same tokenizer as the GGUF's (its refusal of ids past the tiny model's 512 rows set aside)
    tokenizer = dataclasses.replace(pre.tokenizer, model_vocab=None)
    for text, ids in REF["texts"].items():
        assert tokenizer.encode(text) == ids, text


def test_loading_onto_a_mesh_places_every_parameter_sharded(tiny_dir):
    """With a mesh the parameters are placed sharded as they load (8 simulated CPU devices), and the
    model computes what the unsharded one does."""
    from jax.sharding import Mesh
    from flax import nnx

    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("fsdp", "model"))
    sharded = load_pretrained(tiny_dir, mesh=mesh)
    plain = load_pretrained(tiny_dir)
    q = sharded.model.layers[0].q_proj.kernel[...]
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "model") and len(q.sharding.device_set) == 8
    leaves = jax.tree_util.tree_leaves(nnx.state(sharded.model))
    assert all(len(x.sharding.device_set) == 8 for x in leaves)
    ids = jnp.asarray([[1, 2, 3, 4]])
    np.testing.assert_allclose(np.asarray(sharded.model(ids, jnp.ones((1, 4), bool))),
                               np.asarray(plain.model(ids, jnp.ones((1, 4), bool))), rtol=1e-5, atol=1e-5)


def test_bad_checkpoints_raise_named_errors(tiny_dir, tmp_path):
    tokenizer, weights = (tiny_dir / "tokenizer.json").read_bytes(), (tiny_dir / "model.safetensors").read_bytes()
    (tiny_dir / "tokenizer.json").unlink()
    (tiny_dir / "model.safetensors").write_bytes(b"unreadable")  # the tokenizer is checked before the weights are read
    with pytest.raises(CheckpointError, match="has no tokenizer.json"):
        load_pretrained(tiny_dir)
    (tiny_dir / "tokenizer.json").write_bytes(tokenizer)
    (tiny_dir / "model.safetensors").write_bytes(weights)
    cfg = json.loads((tiny_dir / "config.json").read_text())
    (tiny_dir / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel.*not supported"):
        load_pretrained(tiny_dir)
    (tiny_dir / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    with pytest.raises(CheckpointError, match="model.layers.1.*has no place"):
        load_pretrained(tiny_dir)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_pretrained(tmp_path / "nowhere.gguf")


@needs_model
def test_a_cut_gguf_file_and_a_foreign_architecture_are_named(tmp_path):
    import gguf

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(GGUF.read_bytes()[: 5 << 20])
    with pytest.raises(CheckpointError, match="truncated or not a GGUF file"):
        load_pretrained(cut)
    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="general.architecture='gpt2' is not supported"):
        load_pretrained(tmp_path / "gpt2.gguf")


GGUF_FIELDS = ("attention.head_count", "embedding_length", "block_count", "feed_forward_length", "context_length",
               "attention.head_count_kv", "attention.key_length", "rope.freq_base", "attention.sliding_window",
               "attention.layer_norm_rms_epsilon", "vocab_size", "rope.scaling.type")


@needs_model
def test_malformed_gguf_metadata_gives_a_config_or_a_named_error():
    """The real file's metadata with up to three fields deleted or replaced by malformed values: the
    config is built, or a CheckpointError names the file and the field (never a KeyError, ValueError,
    TypeError or ZeroDivisionError from deep inside)."""
    import gguf
    from hypothesis import given, settings, strategies as st

    from bepo_jax.agent.models.pretrained import _gguf_config, _gguf_fields

    reader = gguf.GGUFReader(str(GGUF))
    good, names = _gguf_fields(reader), {t.name for t in reader.tensors}
    arch = good["general.architecture"]
    values = st.one_of(st.none(), st.just("abc"), st.integers(-3, 3), st.just(2.5), st.just([1]), st.just(True))

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(st.dictionaries(st.sampled_from(GGUF_FIELDS + ("tokenizer.ggml.tokens",)),
                           st.one_of(st.just("<delete>"), values), min_size=1, max_size=3))
    def check(changes):
        key = lambda f: f if f.startswith("tokenizer.") else f"{arch}.{f}"
        meta = {k: v for k, v in good.items() if k not in {key(f) for f, v in changes.items() if v == "<delete>"}}
        meta.update({key(f): v for f, v in changes.items() if v != "<delete>"})
        try:
            _, cfg = _gguf_config(meta, names, dtype="float32", context=None, where=f"GGUF file {GGUF}")
        except CheckpointError as e:
            assert str(GGUF) in str(e) and any(f in str(e) for f in GGUF_FIELDS + ("tokenizer.ggml.tokens", "context")), str(e)
            return
        assert cfg.heads >= 1 and cfg.hidden >= 1 and cfg.layers >= 1

    check()


@needs_model
def test_a_prompt_longer_than_the_context_is_refused(smol):
    with pytest.raises(ValueError, match="exceeds the model's context of 8192 tokens"):
        generate(smol.model, [[1] * 8190], max_tokens=8, stop_ids=(2,))


def test_a_named_model_that_is_not_fetched_names_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("BEPO_JAX_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="bepo-jax models fetch smollm2-135m"):
        load_pretrained("smollm2-135m")
    with pytest.raises(ValueError, match="unknown model 'llama-70b'"):
        hub.path_of("llama-70b")


def test_a_sharded_safetensors_index_loads_the_same_model(tiny_dir):
    """The same weights split over two shards named by model.safetensors.index.json (as large checkpoints
    come) load to the same logits; a shard the index names but the folder lacks is a named error."""
    from safetensors.numpy import load_file, save_file

    whole = load_file(str(tiny_dir / "model.safetensors"))
    names = sorted(whole)
    half = len(names) // 2
    parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    plain = load_pretrained(tiny_dir)
    (tiny_dir / "model.safetensors").unlink()
    for fname, keys in parts.items():
        save_file({k: whole[k] for k in keys}, str(tiny_dir / fname))
    index = {"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}
    (tiny_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    sharded = load_pretrained(tiny_dir)
    ids, mask = jnp.asarray([[1, 2, 3, 4, 5]]), jnp.ones((1, 5), bool)
    np.testing.assert_array_equal(np.asarray(sharded.model(ids, mask)), np.asarray(plain.model(ids, mask)))
    (tiny_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="the index names model-00002-of-00002.safetensors, which is missing"):
        load_pretrained(tiny_dir)


def test_text_beyond_a_smaller_embedding_is_refused_not_read_as_nan(tiny_dir):
    """The tiny Qwen2 keeps 512 embedding rows beside a 49152-token tokenizer. An id past the rows is, in
    XLA's gather, a NaN row (checked here on the model itself): encoding such text, or generating from
    such ids, raises and names the mismatch; text within the rows still encodes."""
    pre = load_pretrained(tiny_dir)
    assert pre.config.vocab == 512 and pre.tokenizer.vocab_size > 512
    ids = jnp.asarray([[5, 9, 600]])
    assert np.isnan(np.asarray(pre.model(ids, jnp.ones((1, 3), bool)))[0, -1]).all()  # what the refusal prevents
    with pytest.raises(ValueError, match="outside the model's 512-token vocabulary"):
        pre.prompt_ids([{"role": "user", "content": "What is the capital of France?"}])
    with pytest.raises(ValueError, match="prompt token id 600 is outside the model's 512-token vocabulary"):
        generate(pre.model, [[5, 9, 600]], max_tokens=2)
    low = [i for i in range(3, 40) if pre.tokenizer.decode([i]).strip()][:3]
    assert pre.tokenizer.encode(pre.tokenizer.decode(low), add_special_tokens=False)  # within the rows: no refusal
