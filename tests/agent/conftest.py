"""Fixtures of the chat-model tests: a tiny random Llama checkpoint written in the Hugging Face
layout (by the names and shapes transformers uses, not by this package's loader) with the
SmolLM2 tokenizer and chat template of ``tests/fixtures/llm/tiny_qwen2``, and a toy text game."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llm"
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 16, 2, 2, 1, 32, 49152


def copy_tiny_qwen2(dest: Path) -> Path:
    """The tiny random Qwen2 checkpoint transformers saved (``tests/fixtures/llm/tiny_qwen2``), copied to
    ``dest`` with its tokenizer unpacked: a directory a test may edit."""
    shutil.copytree(FIXTURES / "tiny_qwen2", dest)
    (dest / "tokenizer.json").write_bytes(gzip.decompress((dest / "tokenizer.json.gz").read_bytes()))
    (dest / "tokenizer.json.gz").unlink()
    return dest


def write_tiny_chat_model(d: Path, seed: int = 0) -> Path:
    """A LlamaForCausalLM directory: config.json, model.safetensors (random, HF names, [out, in]
    weights), the tokenizer files and chat template."""
    from safetensors.numpy import save_file

    d.mkdir(parents=True, exist_ok=True)
    for f in ("chat_template.jinja", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(FIXTURES / "tiny_qwen2" / f, d / f)
    (d / "tokenizer.json").write_bytes(gzip.decompress((FIXTURES / "tiny_qwen2" / "tokenizer.json.gz").read_bytes()))
    head_dim = HIDDEN // HEADS
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "intermediate_size": INTERMEDIATE, "vocab_size": VOCAB, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}))
    rng = np.random.default_rng(seed)
    w = lambda *shape, s=0.2: (rng.standard_normal(shape) * s).astype(np.float32)
    t = {"model.embed_tokens.weight": w(VOCAB, HIDDEN, s=0.5), "model.norm.weight": 1 + w(HIDDEN, s=0.05)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(HEADS * head_dim, HIDDEN),
                  p + "self_attn.k_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
                  p + "self_attn.v_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
                  p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * head_dim),
                  p + "mlp.gate_proj.weight": w(INTERMEDIATE, HIDDEN), p + "mlp.up_proj.weight": w(INTERMEDIATE, HIDDEN),
                  p + "mlp.down_proj.weight": w(HIDDEN, INTERMEDIATE),
                  p + "input_layernorm.weight": 1 + w(HIDDEN, s=0.05),
                  p + "post_attention_layernorm.weight": 1 + w(HIDDEN, s=0.05)})
    save_file(t, str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory) -> Path:
    return write_tiny_chat_model(tmp_path_factory.mktemp("tiny_chat") / "model")


class Corridor:
    """A toy HostEnv: rooms 0 .. 3 in a row, start in room ``task``; "go east" / "go west" move,
    "look" stays; reaching room 3 wins (reward 1). ``log`` records every observation it gave and
    ``steps`` every command it was stepped with."""

    objective = "Reach room 3 at the east end of the corridor."
    commands = ["go east", "go west", "look"]

    def __init__(self):
        self.log: list[str] = []
        self.steps: list[str] = []

    def _obs(self) -> str:
        text = f"You are in room {self.room} of a corridor."
        self.log.append(text)
        return text

    def reset(self, task):
        self.room = int(task)
        return self._obs(), list(self.commands)

    def step(self, command):
        self.steps.append(command)
        self.room = min(3, self.room + 1) if command == "go east" else max(0, self.room - 1) if command == "go west" \
            else self.room
        won = self.room == 3
        return self._obs(), float(won), won, won, list(self.commands)
