"""Training data: tokenizers, JSONL reading, packing and batching."""

from __future__ import annotations

from mebp_core.data.batching import (
    Batch,
    iter_batches,
    iter_eval_batches,
    pack_examples,
    split_validation,
)
from mebp_core.data.example import IGNORE_INDEX, DatasetError, Example
from mebp_core.data.jsonl import DatasetReport, read_examples
from mebp_core.data.tokenizer import (
    ByteTokenizer,
    ChatTokens,
    HFTokenizer,
    Tokenizer,
    TokenizerError,
    load_tokenizer,
    read_vocab_size,
)

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "ByteTokenizer",
    "ChatTokens",
    "DatasetError",
    "DatasetReport",
    "Example",
    "HFTokenizer",
    "Tokenizer",
    "TokenizerError",
    "iter_batches",
    "iter_eval_batches",
    "load_tokenizer",
    "pack_examples",
    "read_examples",
    "read_vocab_size",
    "split_validation",
]
