"""The byte tokenizer written out for runtimes: a Hugging Face ``tokenizer.json`` and a GGUF
vocabulary that both turn text into exactly ``ByteTokenizer``'s ids.

Both are byte-level BPE vocabularies in GPT-2's byte-to-character mapping, with one token per
byte (id = the byte's value), BOS/EOS/PAD at 256/257/258, and the rest of the model's
vocabulary as unused padding tokens. The chat template renders ``ByteTokenizer``'s fixed
template, so a runtime formats conversations as the adapter was trained on them.
"""

from __future__ import annotations

import json
from pathlib import Path

from gguf.vocab import bytes_to_unicode

from mebp_core.data.tokenizer import ByteTokenizer, TokenizerError

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# llama.cpp refuses a byte-level vocabulary without merges. This one merge joins two 0xFF
# bytes, which never occur in UTF-8 text, so it never changes how text is tokenized.
UNREACHABLE_MERGE = (0xFF, 0xFF)


def byte_characters() -> list[str]:
    """The character standing for each byte value, in byte order."""
    mapping = bytes_to_unicode()
    return [mapping[byte] for byte in range(256)]


def special_ids() -> dict[str, int]:
    return {BOS: ByteTokenizer.bos_token_id, EOS: ByteTokenizer.eos_token_id,
            PAD: ByteTokenizer.pad_token_id}


def write_hf_tokenizer(out_dir: Path, vocab_size: int) -> list[Path]:
    """``tokenizer.json`` and ``tokenizer_config.json`` in ``out_dir``, for ``vocab_size``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    ByteTokenizer(vocab_size)  # the same vocabulary check as training
    vocab = {char: byte for byte, char in enumerate(byte_characters())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = sorted(special_ids().items(), key=lambda item: item[1])
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name, _ in specials])
    assert [tokenizer.token_to_id(name) for name, _ in specials] == [i for _, i in specials]
    out_dir = Path(out_dir)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
              "pad_token": PAD, "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
              "model_max_length": 1 << 30}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out_dir / "tokenizer.json", out_dir / "tokenizer_config.json"]


def gguf_tokens(vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the GGUF vocabulary for ``vocab_size`` ids."""
    from gguf import TokenType

    if vocab_size < 260:
        raise TokenizerError(f"a GGUF byte vocabulary needs at least 260 ids (256 bytes, "
                         f"BOS/EOS/PAD and one merge); this model has {vocab_size}")
    first, second = (byte_characters()[byte] for byte in UNREACHABLE_MERGE)
    tokens = byte_characters() + [BOS, EOS, PAD, first + second]
    types = [TokenType.NORMAL] * 256 + [TokenType.CONTROL] * 3 + [TokenType.NORMAL]
    unused = range(len(tokens), vocab_size)
    tokens += [f"[PAD{i}]" for i in unused]
    types += [TokenType.UNUSED] * len(unused)
    return tokens, [int(t) for t in types], [f"{first} {second}"]
