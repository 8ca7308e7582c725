"""Fixtures: a byte tokenizer, and small Hugging Face tokenizers saved to disk (no hub)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mebp_core.data.tokenizer import ByteTokenizer

WORDS = [
    "<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "[UNK]",
    "user", "assistant", "system", "hello", "world", "hi", "there", "!", "be", "brief",
]  # fmt: skip
VOCAB = {word: i for i, word in enumerate(WORDS)}
HF_VOCAB_SIZE = 32

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_GENERATION = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>"
    "{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Marks only the content, not <|im_end|>: a mask the prefix fallback could not produce.
CHATML_GENERATION_CONTENT = CHATML_GENERATION.replace(
    "{{ m['content'] }}<|im_end|>{% endgeneration %}",
    "{{ m['content'] }}{% endgeneration %}<|im_end|>",
)
# Renders the message count first, so a prefix renders differently from the whole.
PREFIX_UNSTABLE = "{{ messages | length }}" + CHATML
TEMPLATES = {"chatml": CHATML, "generation": CHATML_GENERATION, "unstable": PREFIX_UNSTABLE}
TEMPLATES["generation_content"] = CHATML_GENERATION_CONTENT


@pytest.fixture
def byte_tokenizer() -> ByteTokenizer:
    return ByteTokenizer(300)


@pytest.fixture
def make_hf_model_dir(tmp_path: Path) -> Callable[..., Path]:
    """Return a factory saving a WordLevel tokenizer (exact, known ids) and a config.json.

    `template` names a chat template in TEMPLATES, or None for a tokenizer without one.
    """

    def make(
        template: str | None = "chatml", *, pad: bool = True, vocab_size: int = HF_VOCAB_SIZE
    ) -> Path:
        model_dir = tmp_path / f"model-{len(list(tmp_path.iterdir()))}"
        backend = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="[UNK]"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]"}
        if pad:
            specials["pad_token"] = "<pad>"
        hf = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            additional_special_tokens=["<|im_start|>", "<|im_end|>"],
            **specials,
        )
        if template is not None:
            hf.chat_template = TEMPLATES[template]
        hf.save_pretrained(model_dir)
        (model_dir / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
        return model_dir

    return make


@pytest.fixture
def write_jsonl(tmp_path: Path) -> Callable[[list[object]], Path]:
    """Return a writer: dicts/lists become JSON lines, str and bytes are written verbatim."""

    def write(lines: list[object], name: str = "data.jsonl") -> Path:
        path = tmp_path / name
        chunks = []
        for line in lines:
            if isinstance(line, bytes):
                chunks.append(line)
            elif isinstance(line, str):
                chunks.append(line.encode("utf-8"))
            else:
                chunks.append(json.dumps(line).encode("utf-8"))
        path.write_bytes(b"\n".join(chunks) + b"\n")
        return path

    return write


@pytest.fixture
def bpe_model_dir(tmp_path: Path) -> Path:
    """Save a byte-level BPE trained on a few sentences, with the ChatML template."""
    from tokenizers import decoders, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    sentences = ["hello there, how are you?", "hi there! I am fine.", "the user asks, I answer"]
    backend.train_from_iterator(sentences * 10, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")
    hf.chat_template = CHATML
    model_dir = tmp_path / "bpe"
    hf.save_pretrained(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"vocab_size": 512}))
    return model_dir
