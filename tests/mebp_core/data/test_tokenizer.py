from __future__ import annotations

import json

import pytest

from mebp_core.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    TokenizerError,
    load_tokenizer,
    read_vocab_size,
)

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hi there"},
    {"role": "user", "content": "world"},
    {"role": "assistant", "content": "!"},
]
# <|im_start|>=3 <|im_end|>=4 user=6 assistant=7 system=8 hello=9 world=10 hi=11 there=12 !=13
# be=14 brief=15; the newlines of the template are dropped by the Whitespace pre-tokenizer.
CONVERSATION_IDS = [3, 8, 14, 15, 4, 3, 6, 9, 4, 3, 7, 11, 12, 4, 3, 6, 10, 4, 3, 7, 13, 4]
ASSISTANT_POSITIONS = {11, 12, 13, 20, 21}  # "hi there<|im_end|>" and "!<|im_end|>"


def test_synthetic_dir_gets_byte_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 512}))
    tokenizer = load_tokenizer(tmp_path, {"vocab_size": 512})
    assert isinstance(tokenizer, ByteTokenizer)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        256,
        257,
        258,
    )
    assert tokenizer.encode("hé") == [104, 195, 169]


def test_byte_tokenizer_refuses_small_vocab(tmp_path):
    with pytest.raises(TokenizerError, match="at least 259.*has 258"):
        load_tokenizer(tmp_path, {"vocab_size": 258})


def test_byte_chat_template_masks_assistant_content_and_eos(byte_tokenizer):
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    chat = byte_tokenizer.encode_chat(messages)
    user = list(b"<|user|>\na") + [257]
    assistant_header = list(b"<|assistant|>\n")
    assert chat.input_ids == [256] + user + assistant_header + [98, 257]
    assert chat.assistant_mask == [False] * (1 + len(user) + len(assistant_header)) + [True] * 2
    assert byte_tokenizer.apply_chat_template(messages) == chat.input_ids


def test_hf_tokenizer_loads_from_disk_with_its_special_ids(make_hf_model_dir):
    tokenizer = load_tokenizer(make_hf_model_dir(), {"vocab_size": 32})
    assert isinstance(tokenizer, HFTokenizer)
    assert tokenizer.encode("hello world") == [9, 10]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 0)


def test_hf_tokenizer_without_pad_pads_with_eos(make_hf_model_dir):
    tokenizer = load_tokenizer(make_hf_model_dir(pad=False), {"vocab_size": 32})
    assert tokenizer.hf.pad_token_id is None
    assert tokenizer.pad_token_id == 2


@pytest.mark.parametrize("template", ["chatml", "generation"])
def test_hf_chat_assistant_mask(make_hf_model_dir, template):
    tokenizer = load_tokenizer(make_hf_model_dir(template), {"vocab_size": 32})
    chat = tokenizer.encode_chat(CONVERSATION)
    assert chat.input_ids == CONVERSATION_IDS
    assert {i for i, keep in enumerate(chat.assistant_mask) if keep} == ASSISTANT_POSITIONS
    assert tokenizer.apply_chat_template(CONVERSATION) == CONVERSATION_IDS


def test_hf_chat_generation_markers_decide_the_mask(make_hf_model_dir):
    tokenizer = load_tokenizer(make_hf_model_dir("generation_content"), {"vocab_size": 32})
    chat = tokenizer.encode_chat(CONVERSATION)
    assert chat.input_ids == CONVERSATION_IDS
    assert {i for i, keep in enumerate(chat.assistant_mask) if keep} == {11, 12, 20}


def test_hf_chat_refuses_prefix_unstable_template(make_hf_model_dir):
    tokenizer = load_tokenizer(make_hf_model_dir("unstable"), {"vocab_size": 32})
    with pytest.raises(TokenizerError, match="generation"):
        tokenizer.encode_chat(CONVERSATION)


def test_hf_chat_without_template_is_an_error(make_hf_model_dir):
    tokenizer = load_tokenizer(make_hf_model_dir(None), {"vocab_size": 32})
    with pytest.raises(TokenizerError, match="no chat template"):
        tokenizer.encode_chat(CONVERSATION)


def test_special_ids_outside_model_vocab_are_refused(make_hf_model_dir):
    with pytest.raises(TokenizerError, match="eos id 2 is outside.*vocab_size=2"):
        load_tokenizer(make_hf_model_dir(pad=False), {"vocab_size": 2})


def test_read_vocab_size_from_nested_text_config():
    assert read_vocab_size({"text_config": {"vocab_size": 262144}}) == 262144
    with pytest.raises(TokenizerError):
        read_vocab_size({})


def test_trained_bpe_prefix_fallback_covers_exactly_the_assistant_turns(bpe_model_dir):
    tokenizer = load_tokenizer(bpe_model_dir, {"vocab_size": 512})
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id) == (None, tokenizer.eos_token_id)
    messages = [
        {"role": "user", "content": "hello there, how are you?"},
        {"role": "assistant", "content": "hi there! I am fine."},
        {"role": "user", "content": "the user asks"},
        {"role": "assistant", "content": "I answer"},
    ]
    chat = tokenizer.encode_chat(messages)
    assert chat.input_ids == tokenizer.apply_chat_template(messages)
    learned = [t for t, keep in zip(chat.input_ids, chat.assistant_mask, strict=True) if keep]
    decoded = tokenizer.hf.decode(learned)
    assert decoded == "hi there! I am fine.<|im_end|>\nI answer<|im_end|>\n"
