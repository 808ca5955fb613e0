"""Bad input on the LLM path gets a named error before anything loads or is written; templates and
tokenizers behave as transformers' do (one BOS, a template chosen from a list, a refusal in the template's
words); a sliding attention window bounds the context instead of being ignored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bepo_jax.agent.models.pretrained import CheckpointError, load_pretrained, select_chat_template
from bepo_jax.agent.models.tokenizer import ChatTemplateError
from bepo_jax.cli import main

from .conftest import copy_tiny_qwen2, write_tiny_chat_model


@pytest.fixture
def tiny_dir(tmp_path):
    return copy_tiny_qwen2(tmp_path / "tiny_qwen2")


@pytest.fixture
def chat_dir(tmp_path):
    """A tiny random Llama with the same tokenizer and template files, its embedding covering the
    tokenizer (the tiny Qwen2 keeps 512 rows: text past them is refused, ``test_pretrained``)."""
    return write_tiny_chat_model(tmp_path / "tiny_llama")

def _edit(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_template_that_writes_bos_gets_one_bos_as_transformers_gives(chat_dir):
    # the tokenizer says "add BOS" and the template writes {{ bos_token }} itself (Llama 2/3 do)
    _edit(chat_dir / "tokenizer_config.json", bos_token="<|endoftext|>", add_bos_token=True)
    (chat_dir / "chat_template.jinja").write_text("{{ bos_token }}" + (chat_dir / "chat_template.jinja").read_text())
    pre = load_pretrained(chat_dir)
    bos = pre.tokenizer.token_id("<|endoftext|>")
    msgs = [{"role": "user", "content": "go east"}]
    ids = pre.prompt_ids(msgs)
    text = pre.chat_template(msgs)
    assert text.startswith("<|endoftext|>") and ids.count(bos) == 1 and ids[0] == bos
    # the rendered text encoded by the tokenizers library alone, no special tokens added (apply_chat_template)
    assert ids == pre.tokenizer.backend.encode(text, add_special_tokens=False).ids
    assert pre.tokenizer.encode("go") == [bos] + pre.tokenizer.encode("go", add_special_tokens=False)


def test_a_template_list_takes_the_default_and_refuses_a_list_without_one(tiny_dir):
    default = (tiny_dir / "chat_template.jinja").read_text()
    (tiny_dir / "chat_template.jinja").unlink()
    _edit(tiny_dir / "tokenizer_config.json",
          chat_template=[{"name": "tool_use", "template": "TOOLS {{ messages }}"}, {"name": "default", "template": default}])
    assert load_pretrained(tiny_dir).chat_template.source == default
    _edit(tiny_dir / "tokenizer_config.json", chat_template=[{"name": "tool_use", "template": "x"}])
    with pytest.raises(CheckpointError, match="none named 'default'"):
        load_pretrained(tiny_dir)
    with pytest.raises(CheckpointError, match="is a int"):
        select_chat_template(3, "here")


def test_a_template_that_raises_is_a_named_error(tiny_dir):
    (tiny_dir / "chat_template.jinja").write_text("{{ raise_exception('System role not supported') }}")
    pre = load_pretrained(tiny_dir)
    with pytest.raises(ChatTemplateError, match="refused the messages: System role not supported"):
        pre.prompt_ids([{"role": "system", "content": "x"}])
    with pytest.raises(SystemExit):  # the command line prints it instead of a traceback
        main(["generate", "--model", str(tiny_dir), "--prompt", "hi", "--max-tokens", "2"])


def test_a_sliding_window_bounds_the_context(tiny_dir):
    _edit(tiny_dir / "config.json", sliding_window=32, use_sliding_window=True)  # Mistral-style: the window is used
    assert load_pretrained(tiny_dir).config.context == 32  # within the window attention is full: exact
    with pytest.raises(CheckpointError, match="sliding attention window of 32 tokens"):
        load_pretrained(tiny_dir, context=64)
    _edit(tiny_dir / "config.json", sliding_window=32, use_sliding_window=False)  # Qwen2: declared, not used
    assert load_pretrained(tiny_dir).config.context == 128


@pytest.mark.parametrize("field", ["num_attention_heads", "hidden_size", "vocab_size"])
def test_a_config_missing_a_field_names_it_before_the_weights_load(tiny_dir, field):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    del cfg[field]
    (tiny_dir / "config.json").write_text(json.dumps(cfg))
    (tiny_dir / "model.safetensors").write_bytes(b"not weights")  # never read
    with pytest.raises(CheckpointError, match=f"lacks '{field}'"):
        load_pretrained(tiny_dir)


@pytest.mark.parametrize("flags,match", [(["--max-tokens", "0"], "--max-tokens 0"),
                                         (["--max-tokens", "-3"], "--max-tokens -3"),
                                         (["--temperature", "nan"], "--temperature nan"),
                                         (["--temperature", "-0.5"], "--temperature -0.5"),
                                         (["--prompt", "caf\udce9"], "not valid UTF-8")])
def test_generate_refuses_bad_flags_before_loading_a_model(flags, match, capsys):
    args = ["generate", "--model", "no/such/model.gguf", "--prompt", "hi", *flags]
    with pytest.raises(SystemExit):
        main(args)
    err = capsys.readouterr().err
    assert match in err and "no checkpoint at" not in err


def test_a_mistyped_model_leaves_no_run_behind(tmp_path, tiny_chat_dir, capsys):
    out = tmp_path / "run"
    flags = ["--env", "textworld", "--iterations", "1", "--out", str(out), "--quiet"]
    with pytest.raises(SystemExit):
        main(["train", "--model", str(tmp_path / "nowhere"), *flags])
    assert "no checkpoint at" in capsys.readouterr().err and not (out / "config.json").exists()
    # a checkpoint that fails to load after the run directory was checked leaves nothing either
    broken = tmp_path / "broken"
    shutil.copytree(tiny_chat_dir, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(SystemExit):
        main(["train", "--model", str(broken), *flags])
    assert not (out / "config.json").exists() and not (out / "held_out.json").exists()


FIELDS = ("num_attention_heads", "hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size",
          "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "sliding_window", "rope_parameters")


def test_malformed_configs_load_or_raise_a_named_error(tmp_path_factory):
    from hypothesis import given, settings, strategies as st

    base = copy_tiny_qwen2(tmp_path_factory.mktemp("malformed") / "tiny_qwen2")
    good = json.loads((base / "config.json").read_text())
    values = st.one_of(st.none(), st.just("abc"), st.integers(-3, 3), st.just(2.5), st.just([1]), st.just({}))

    @settings(max_examples=40, deadline=None, derandomize=True)
    @given(st.dictionaries(st.sampled_from(FIELDS), st.one_of(st.just("<delete>"), values), min_size=1, max_size=3))
    def check(changes):
        cfg = {k: v for k, v in good.items() if changes.get(k) != "<delete>"}
        cfg.update({k: v for k, v in changes.items() if v != "<delete>"})
        (base / "config.json").write_text(json.dumps(cfg))
        try:
            load_pretrained(base)
        except CheckpointError as e:  # named: the file and the field or tensor
            assert "config.json" in str(e) or "tensor" in str(e) or "model." in str(e), str(e)

    check()


def test_any_prompt_text_renders_encodes_and_generates(chat_dir):
    from hypothesis import given, settings, strategies as st

    from bepo_jax.agent.models.generate import reply

    pre = load_pretrained(chat_dir)

    text = lambda n: st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, blacklist_categories=("Cs", "Cc")),
                             max_size=n)

    @settings(max_examples=20, deadline=None, derandomize=True)
    @given(text(40), st.one_of(st.none(), text(20)))
    def check(prompt, system):
        msgs = ([{"role": "system", "content": system}] if system is not None else []) + \
            [{"role": "user", "content": prompt}]
        ids = pre.prompt_ids(msgs)
        assert ids and pre.tokenizer.decode(ids) == pre.chat_template(msgs)  # byte-level BPE: text round-trips
        assert isinstance(reply(pre, msgs, max_tokens=2), str)

    check()
