"""The unit of training data: one token sequence and its labels."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mebp_core.errors import MebpError

IGNORE_INDEX = -100
"""Label value that the loss ignores (the Hugging Face / PyTorch convention)."""

ExampleKind = Literal["text", "prompt_completion", "messages", "tokens"]


class DatasetError(MebpError, ValueError):
    """A dataset file or row cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Example:
    """One training row.

    `labels` follow the Hugging Face convention: same length as `input_ids` and NOT shifted
    (the loss compares the logits at position t with labels[t + 1]); -100 masks a position.
    `kind` says which JSONL form the row came from; only "text" rows are packed together.
    """

    input_ids: Sequence[int]  # a list, or a compact array("i") once packed
    labels: Sequence[int]
    kind: ExampleKind = "tokens"

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.labels):
            raise ValueError(
                f"input_ids ({len(self.input_ids)}) and labels ({len(self.labels)}) differ in "
                "length"
            )

    def count_supervised_tokens(self) -> int:
        """Return how many tokens the loss learns from (the first label is never predicted)."""
        return sum(1 for label in self.labels[1:] if label != IGNORE_INDEX)
