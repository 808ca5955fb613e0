"""A checkpoint the project loads, in Tunix's own model classes (bepo_jax.integrations.tunix.models).

The reference for the weights is a float64 NumPy forward written from the equations
(tests/agent/test_llama.numpy_forward), not Tunix and not the bridge; the reference for the chat
parser is the checkpoint's chat template applied to the whole conversation at once (the real
SmolLM2 tokenizer and template of the test fixture). Python 3.12 with the tunix extra only.
"""

import numpy as np
import pytest

tunix = pytest.importorskip("tunix", reason="the tunix extra (Python 3.12): pip install 'bepo-jax[tunix]'")

import jax.numpy as jnp  # noqa: E402
from tunix.generate import tokenizer_adapter  # noqa: E402
from tunix.rl.agentic import utils as agentic_utils  # noqa: E402

from bepo_jax.agent.models.pretrained import Pretrained, load_pretrained  # noqa: E402
from bepo_jax.integrations.tunix import models as tm  # noqa: E402
from tests.agent.conftest import write_tiny_chat_model  # noqa: E402
from tests.agent.test_llama import _model, numpy_forward  # noqa: E402

TOKENS = [3, 17, 5, 88, 41, 2, 60, 9, 33]


def _pre(**over):
    model = _model(**over)
    return Pretrained(model=model, tokenizer=None, chat_template=None, config=model.cfg, source="test")


def _tunix_logits(model, tokens):
    L = len(tokens)
    ids = jnp.asarray([tokens], jnp.int32)
    mask = jnp.tril(jnp.ones((1, L, L), bool))
    return np.asarray(model(ids, jnp.arange(L)[None], None, mask)[0][0], np.float64)


@pytest.mark.parametrize("over", [dict(), dict(attention_bias=True), dict(tie_embeddings=False)],
                         ids=["llama", "qwen2-biases", "untied-head"])
def test_qwen2_class_holds_the_checkpoint_exactly(over):
    pre = _pre(**over)
    got = _tunix_logits(tm.to_tunix(pre, "qwen2"), TOKENS)
    np.testing.assert_allclose(got, numpy_forward(pre.model, TOKENS), atol=2e-4, rtol=1e-4)


def test_llama3_class_is_refused_where_its_rope_theta_is_wrong_and_exact_where_it_is_right():
    pre = _pre(rope_theta=1e4)
    if not tm.llama3_honours_rope_theta():  # Tunix 0.1.7 and its main branch of 2026-08-21
        with pytest.raises(tm.TunixBridgeError, match="rope_theta is 10000.*family='qwen2'"):
            tm.to_tunix(pre, "llama3")
    pre = _pre(rope_theta=1e6)
    got = _tunix_logits(tm.to_tunix(pre, "llama3"), TOKENS)
    np.testing.assert_allclose(got, numpy_forward(pre.model, TOKENS), atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("family, over, match", [
    ("qwen3", dict(), "qwen3 always applies q/k norms"),
    ("llama3", dict(attention_bias=True, rope_theta=1e6), "attention_bias=True"),
    ("qwen2", dict(rope_type="linear", rope_factor=2.0), "rope_type='linear'"),
])
def test_what_a_class_cannot_represent_is_refused_by_name(family, over, match):
    with pytest.raises(tm.TunixBridgeError, match=match):
        tm.to_tunix(_pre(**over), family)


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    return load_pretrained(write_tiny_chat_model(tmp_path_factory.mktemp("tunix_chat") / "model"))


def test_tunix_tokenizer_adapter_takes_the_checkpoint_tokenizer(chat):
    tok = tokenizer_adapter.TokenizerAdapter(tm.TunixTokenizer(chat))
    assert tok.eos_id() == chat.tokenizer.token_id("<|im_end|>")
    text = "<|im_start|>user\nopen the door<|im_end|>\n"
    assert tok.encode(text) == chat.tokenizer.encode(text)
    assert tok.decode(tok.encode(text)) == text


def test_incremental_rendering_through_tunix_equals_the_template_on_the_whole_conversation(chat):
    # how Tunix's collector tokenizes: the first messages with is_first, every later message on its own
    conversation = [{"role": "system", "content": "You play a text game."},
                    {"role": "user", "content": "You are in a kitchen. Exits: east."},
                    {"role": "assistant", "content": "go east"},
                    {"role": "tool", "content": "You are in a hall."},
                    {"role": "assistant", "content": "open door"},
                    {"role": "user", "content": "The door opens."}]
    parser = tm.TemplateChatParser(chat)
    tok = tokenizer_adapter.TokenizerAdapter(tm.TunixTokenizer(chat))
    tokens, masks = agentic_utils.tokenize_and_generate_masks(conversation[:2], tok, parser,
                                                               contains_first_msg=True, contains_generation_msg=True)
    for m in conversation[2:]:
        t, k = agentic_utils.tokenize_and_generate_masks([m], tok, parser, contains_first_msg=False,
                                                         contains_generation_msg=m["role"] != "assistant")
        tokens, masks = tokens + t, masks + k
    whole = chat.tokenizer.encode(chat.chat_template(conversation, add_generation_prompt=True))
    assert tokens == whole
    # the mask covers exactly the assistant replies as the template writes them (content, end of turn, newline)
    replies = [chat.tokenizer.encode(m["content"] + "<|im_end|>\n") for m in conversation if m["role"] == "assistant"]
    assert [t for t, k in zip(tokens, masks) if k] == replies[0] + replies[1]
    assert parser.assistant_token == "<|im_start|>assistant\n"
