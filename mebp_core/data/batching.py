"""Packing, shuffling, padding and batching of `Example`s; deterministic and resumable.

The batch stream: epoch e visits every example once in the order of a shuffle seeded with
`seed + e`; the epochs are laid end to end and cut into consecutive groups of `batch_size`.
Every batch is therefore full (a batch may straddle two epochs) and batch k depends only on
(examples, batch_size, seed, k), which is what makes `start=k` resumption exact.

Padding: right padding to the longest row of the batch (not to seq_len, to save compute), with
`pad_token_id` and label -100. The engine uses a causal mask only, so right padding never
changes the logits of the real tokens before it.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from mebp_core.data.example import IGNORE_INDEX, Example


@dataclass(frozen=True)
class Batch:
    """One training batch; `index` is its position in the batch stream (0-based)."""

    input_ids: torch.Tensor  # (B, T) int64
    labels: torch.Tensor  # (B, T) int64, -100 on padding and masked tokens
    example_indices: tuple[int, ...]  # (B,) positions in the examples list
    index: int


def pack_examples(examples: Sequence[Example], seq_len: int) -> list[Example]:
    """Return the text examples packed into `seq_len` chunks, then the other examples as they are.

    Text rows (already framed by BOS/EOS) are concatenated into one stream and cut every
    `seq_len` tokens; the last, shorter chunk is kept (batching pads it) unless it has a single
    token, which nothing could be learned from. Documents in a chunk see each other, as in
    standard causal-LM packing.
    """
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    # compact int32 arrays, not lists: 4 bytes a token where a list of ints costs 8-40
    stream_ids, stream_labels = array("i"), array("i")
    others: list[Example] = []
    for example in examples:
        if example.kind == "text":
            stream_ids.extend(example.input_ids)
            stream_labels.extend(example.labels)
        else:
            others.append(example)
    chunks = [
        Example(stream_ids[i : i + seq_len], stream_labels[i : i + seq_len], "text")
        for i in range(0, len(stream_ids), seq_len)
        if len(stream_ids) - i >= 2
    ]
    return chunks + others


def shuffle_epoch(num_examples: int, seed: int, epoch: int) -> list[int]:
    """Return the visiting order of epoch `epoch` (a permutation seeded with `seed + epoch`)."""
    order = list(range(num_examples))
    random.Random(seed + epoch).shuffle(order)
    return order


def collate(examples: Sequence[Example], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return right-padded (input_ids, labels), both (B, T) with T the longest row."""
    width = max(len(example.input_ids) for example in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    for row, example in enumerate(examples):
        input_ids[row, : len(example.input_ids)] = torch.tensor(example.input_ids)
        labels[row, : len(example.labels)] = torch.tensor(example.labels)
    return input_ids, labels


def iter_batches(
    examples: Sequence[Example],
    *,
    batch_size: int,
    seq_len: int,
    seed: int,
    pad_token_id: int,
    start: int = 0,
) -> Iterator[Batch]:
    """Yield batches start, start + 1, ... of the endless stream described in the module doc."""
    if not examples:
        raise ValueError("cannot batch an empty list of examples")
    if batch_size < 1 or start < 0:
        raise ValueError(f"need batch_size >= 1 and start >= 0, got {batch_size} and {start}")
    too_long = [i for i, example in enumerate(examples) if len(example.input_ids) > seq_len]
    if too_long:
        raise ValueError(
            f"{len(too_long)} examples exceed seq_len={seq_len} (first: #{too_long[0]})"
        )
    num_examples = len(examples)
    orders: dict[int, list[int]] = {}
    index = start
    while True:
        positions = range(index * batch_size, (index + 1) * batch_size)
        for epoch in {pos // num_examples for pos in positions} - orders.keys():
            orders[epoch] = shuffle_epoch(num_examples, seed, epoch)
        chosen = tuple(orders[pos // num_examples][pos % num_examples] for pos in positions)
        input_ids, labels = collate([examples[i] for i in chosen], pad_token_id)
        yield Batch(input_ids, labels, chosen, index)
        last_epoch = positions[-1] // num_examples
        orders = {epoch: order for epoch, order in orders.items() if epoch >= last_epoch}
        index += 1


def iter_eval_batches(
    examples: Sequence[Example], *, batch_size: int, pad_token_id: int
) -> Iterator[Batch]:
    """Yield the examples once, in order, `batch_size` at a time (the last batch may be short)."""
    if batch_size < 1:
        raise ValueError(f"need batch_size >= 1, got {batch_size}")
    for index, first in enumerate(range(0, len(examples), batch_size)):
        chosen = tuple(range(first, min(first + batch_size, len(examples))))
        input_ids, labels = collate([examples[i] for i in chosen], pad_token_id)
        yield Batch(input_ids, labels, chosen, index)


def split_validation(
    examples: Sequence[Example], fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """Return (train, validation): a seeded random `fraction` held out, original order kept.

    At least one example goes to each side. Split before packing, so that no packed chunk
    mixes training and validation text.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"the validation fraction must be in (0, 1), got {fraction}")
    if len(examples) < 2:
        raise ValueError("need at least 2 examples to hold some out for validation")
    num_val = min(max(1, round(len(examples) * fraction)), len(examples) - 1)
    held_out = set(shuffle_epoch(len(examples), seed, 0)[:num_val])
    train = [example for i, example in enumerate(examples) if i not in held_out]
    val = [example for i, example in enumerate(examples) if i in held_out]
    return train, val


def sample_examples(examples: Sequence[Example], count: int, seed: int) -> list[Example]:
    """At most ``count`` of the examples, drawn with ``seed``, in their original order."""
    if len(examples) <= count:
        return list(examples)
    chosen = set(shuffle_epoch(len(examples), seed, 0)[:count])
    return [example for i, example in enumerate(examples) if i in chosen]
