"""Tokenizers behind one small interface: a Hugging Face tokenizer, or bytes for synthetic models.

A model directory with tokenizer files gets its own tokenizer through
`transformers.AutoTokenizer`. Synthetic presets ship only `config.json`; they get
`ByteTokenizer`: ids 0..255 are UTF-8 bytes, 256/257/258 are BOS/EOS/PAD.

Chat rows need to know which tokens are assistant content (the only ones the loss learns
from). `encode_chat` returns the ids with that mask:
- byte tokenizer: the fixed template `BOS (<|role|>\\n content EOS)*`; the mask covers each
  assistant content and its EOS, so the model learns to stop.
- HF tokenizer whose template marks `{% generation %}` blocks: transformers'
  `return_assistant_tokens_mask`.
- any other HF template: each assistant message's span is the text between the rendering of
  the messages before it (with the generation prompt) and the rendering up to and including
  it; tokens overlapping a span are assistant tokens. This needs a template whose rendering of
  a prefix is a prefix of the full rendering; otherwise `TokenizerError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mebp_core.errors import MebpError

CHAT_ROLES = ("system", "user", "assistant", "tool")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "spiece.model",
)
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")

Message = dict[str, str]


class TokenizerError(MebpError, ValueError):
    """A tokenizer cannot be built or cannot encode the given input."""


@dataclass(frozen=True)
class ChatTokens:
    """Token ids of a rendered conversation and which of them are assistant content."""

    input_ids: list[int]
    assistant_mask: list[bool]


class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer."""

    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int

    def encode(self, text: str) -> list[int]:
        """Return the ids of `text`, without special tokens."""
        ...

    def apply_chat_template(self, messages: list[Message]) -> list[int]:
        """Return the ids of the rendered conversation."""
        ...

    def encode_chat(self, messages: list[Message]) -> ChatTokens:
        """Return the ids of the rendered conversation and its assistant-token mask."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, plus BOS=256, EOS=257, PAD=258."""

    bos_token_id: int | None = 256
    eos_token_id: int | None = 257
    pad_token_id: int = 258
    MIN_VOCAB_SIZE = 259

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < self.MIN_VOCAB_SIZE:
            raise TokenizerError(
                f"the byte tokenizer needs a vocabulary of at least 259 ids "
                f"(256 bytes + BOS/EOS/PAD); this model has {vocab_size}"
            )
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def apply_chat_template(self, messages: list[Message]) -> list[int]:
        return self.encode_chat(messages).input_ids

    def encode_chat(self, messages: list[Message]) -> ChatTokens:
        ids: list[int] = [self.bos_token_id]
        mask: list[bool] = [False]
        for message in messages:
            header = self.encode(f"<|{message['role']}|>\n")
            body = self.encode(message["content"]) + [self.eos_token_id]
            is_assistant = message["role"] == "assistant"
            ids += header + body
            mask += [False] * len(header) + [is_assistant] * len(body)
        return ChatTokens(ids, mask)


class HFTokenizer:
    """A thin adapter over a `transformers` tokenizer."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf = hf_tokenizer
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id
        self.eos_token_id: int | None = hf_tokenizer.eos_token_id
        # Padding is always label-masked and right-aligned, so any id works when none is set.
        pad = hf_tokenizer.pad_token_id
        self.pad_token_id: int = pad if pad is not None else (self.eos_token_id or 0)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def apply_chat_template(self, messages: list[Message]) -> list[int]:
        self._require_template()
        return list(
            self.hf.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        )

    def encode_chat(self, messages: list[Message]) -> ChatTokens:
        template = self._require_template()
        if _GENERATION_TAG.search(template):
            out = self.hf.apply_chat_template(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            return ChatTokens(list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]])
        return self._encode_chat_by_prefixes(messages)

    def _require_template(self) -> str:
        template = self.hf.chat_template
        if not template:
            raise TokenizerError("the tokenizer has no chat template, so it cannot encode messages")
        if isinstance(template, dict):
            template = template.get("default") or next(iter(template.values()))
        return template

    def _render(self, messages: list[Message], *, add_generation_prompt: bool) -> str:
        return self.hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode_chat_by_prefixes(self, messages: list[Message]) -> ChatTokens:
        full = self._render(messages, add_generation_prompt=False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self._render(messages[:i], add_generation_prompt=True) if i else ""
            through = self._render(messages[: i + 1], add_generation_prompt=False)
            if not (full.startswith(through) and through.startswith(before)):
                raise TokenizerError(
                    "the chat template renders a conversation prefix differently from the full "
                    "conversation, so assistant tokens cannot be located; add {% generation %} "
                    "markers to the template"
                )
            spans.append((len(before), len(through)))
        if not self.hf.is_fast:
            raise TokenizerError("locating assistant tokens needs a fast (tokenizers) tokenizer")
        out = self.hf(full, add_special_tokens=False, return_offsets_mapping=True)
        mask = [
            any(start < end_span and end > start_span for start_span, end_span in spans)
            for start, end in out["offset_mapping"]
        ]
        return ChatTokens(list(out["input_ids"]), mask)


def read_vocab_size(config: dict) -> int:
    """Return the model's vocabulary size from its HF config (nested `text_config` included)."""
    for source in (config, config.get("text_config") or {}):
        if isinstance(source.get("vocab_size"), int):
            return source["vocab_size"]
    raise TokenizerError("the model config has no integer vocab_size")


def has_tokenizer_files(model_dir: Path) -> bool:
    """Return whether `model_dir` ships its own tokenizer."""
    return any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(model_dir: Path, config: dict) -> Tokenizer:
    """Return the model's own tokenizer if its directory has one, else a `ByteTokenizer`."""
    vocab_size = read_vocab_size(config)
    if not has_tokenizer_files(model_dir):
        return ByteTokenizer(vocab_size)
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot load the tokenizer in {model_dir}: {exc}") from exc
    tokenizer = HFTokenizer(hf)
    check_special_ids(tokenizer, vocab_size)
    return tokenizer


def check_special_ids(tokenizer: Tokenizer, vocab_size: int) -> None:
    """Raise `TokenizerError` if a special id is outside the model's vocabulary."""
    named = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    named["pad"] = tokenizer.pad_token_id
    for name, token_id in named.items():
        if token_id is not None and not 0 <= token_id < vocab_size:
            raise TokenizerError(
                f"the tokenizer's {name} id {token_id} is outside the model's vocabulary "
                f"(vocab_size={vocab_size})"
            )
