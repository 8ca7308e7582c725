from __future__ import annotations

import random
from collections import Counter
from itertools import islice

import pytest
import torch

from mebp_core.data.batching import iter_batches, iter_eval_batches, pack_examples, split_validation
from mebp_core.data.example import Example
from mebp_core.data.jsonl import read_examples

M = -100
PAD = 258


def make_examples(lengths: list[int], kind: str = "tokens") -> list[Example]:
    """Return examples whose ids encode (row, position) so every token is traceable."""
    return [
        Example([100 * row + t for t in range(n)], [100 * row + t for t in range(n)], kind)
        for row, n in enumerate(lengths)
    ]


def test_pack_concatenates_text_and_keeps_other_rows():
    text = make_examples([3, 4, 5], "text")
    prompt = Example([7, 8, 9], [M, 8, 9], "prompt_completion")
    packed = pack_examples([text[0], prompt, text[1], text[2]], seq_len=5)
    stream = [t for e in text for t in e.input_ids]
    assert [list(e.input_ids) for e in packed[:3]] == [stream[0:5], stream[5:10], stream[10:12]]
    assert [list(e.labels) for e in packed[:3]] == [stream[0:5], stream[5:10], stream[10:12]]
    assert all(e.input_ids.itemsize == e.labels.itemsize == 4 for e in packed[:3])  # compact
    assert [e.kind for e in packed[:3]] == ["text"] * 3
    assert packed[3] is prompt
    assert len(packed) == 4


def test_pack_drops_a_single_token_tail():
    packed = pack_examples(make_examples([6, 5], "text"), seq_len=5)
    assert [len(e.input_ids) for e in packed] == [5, 5]


def test_batches_are_right_padded_to_the_longest_row():
    examples = [Example([1, 2], [M, 2], "prompt_completion"), Example([3, 4, 5, 6], [3, 4, 5, 6])]
    batch = next(iter_batches(examples, batch_size=2, seq_len=8, seed=0, pad_token_id=PAD))
    rows = {i: r for r, i in enumerate(batch.example_indices)}
    assert batch.input_ids.shape == batch.labels.shape == (2, 4)
    assert batch.input_ids.dtype == batch.labels.dtype == torch.long
    assert batch.input_ids[rows[0]].tolist() == [1, 2, PAD, PAD]
    assert batch.labels[rows[0]].tolist() == [M, 2, M, M]
    assert batch.input_ids[rows[1]].tolist() == [3, 4, 5, 6]
    assert batch.labels[rows[1]].tolist() == [3, 4, 5, 6]


def test_each_epoch_is_the_seeded_permutation_and_batches_are_full():
    examples = make_examples([2] * 7)
    stream_of_batches = iter_batches(examples, batch_size=3, seq_len=4, seed=11, pad_token_id=PAD)
    batches = list(islice(stream_of_batches, 7))
    assert all(len(b.example_indices) == 3 for b in batches)
    stream = [i for b in batches for i in b.example_indices]  # 21 = 3 epochs of 7
    for epoch in range(3):
        expected = list(range(7))
        random.Random(11 + epoch).shuffle(expected)
        assert stream[7 * epoch : 7 * (epoch + 1)] == expected
    assert stream[0:7] != stream[7:14]


def test_batching_is_deterministic_per_seed():
    examples = make_examples([3, 2, 4, 1, 2, 3, 4, 2, 3, 1])

    def first_batches(seed):
        it = iter_batches(examples, batch_size=4, seq_len=4, seed=seed, pad_token_id=PAD)
        return [b.example_indices for b in islice(it, 6)]

    assert first_batches(3) == first_batches(3)
    assert first_batches(3) != first_batches(4)


@pytest.mark.parametrize("start", [0, 1, 2, 5, 13])
def test_resuming_at_start_yields_the_same_batches(start):
    examples = make_examples([3, 2, 4, 1, 2, 3, 4])
    kwargs = {"batch_size": 3, "seq_len": 4, "seed": 5, "pad_token_id": PAD}
    fresh = list(islice(iter_batches(examples, **kwargs), start + 4))[start:]
    resumed = list(islice(iter_batches(examples, start=start, **kwargs), 4))
    for a, b in zip(fresh, resumed, strict=True):
        assert (a.index, a.example_indices) == (b.index, b.example_indices)
        assert torch.equal(a.input_ids, b.input_ids)
        assert torch.equal(a.labels, b.labels)
    assert resumed[0].index == start


def test_batch_larger_than_dataset_cycles():
    examples = make_examples([2, 2])
    batch = next(iter_batches(examples, batch_size=5, seq_len=2, seed=0, pad_token_id=PAD))
    assert sorted(Counter(batch.example_indices).values()) == [2, 3]  # epochs 0, 1 and half of 2


def test_batching_refuses_bad_input():
    with pytest.raises(ValueError, match="exceed seq_len=3"):
        next(iter_batches(make_examples([2, 4]), batch_size=1, seq_len=3, seed=0, pad_token_id=0))
    with pytest.raises(ValueError, match="empty"):
        next(iter_batches([], batch_size=1, seq_len=3, seed=0, pad_token_id=0))
    with pytest.raises(ValueError, match="batch_size"):
        next(iter_batches(make_examples([2]), batch_size=0, seq_len=3, seed=0, pad_token_id=0))


def test_eval_batches_visit_every_example_once_in_order():
    examples = make_examples([2, 3, 1, 2, 2])
    batches = list(iter_eval_batches(examples, batch_size=2, pad_token_id=PAD))
    assert [b.example_indices for b in batches] == [(0, 1), (2, 3), (4,)]
    assert batches[1].input_ids.tolist() == [[200, PAD], [300, 301]]
    assert batches[1].labels.tolist() == [[200, M], [300, 301]]


def test_split_validation_is_seeded_disjoint_and_keeps_order():
    examples = make_examples([2] * 10)
    train, val = split_validation(examples, 0.2, seed=1)
    assert (len(train), len(val)) == (8, 2)
    assert sorted(map(id, train + val)) == sorted(map(id, examples))
    assert train == [e for e in examples if e in train]
    assert split_validation(examples, 0.2, seed=1) == (train, val)
    assert any(split_validation(examples, 0.2, seed=s)[1] != val for s in range(2, 6))
    assert len(split_validation(examples[:2], 0.01, seed=0)[1]) == 1
    with pytest.raises(ValueError):
        split_validation(examples, 1.0, seed=0)
    with pytest.raises(ValueError):
        split_validation(examples[:1], 0.5, seed=0)


def test_jsonl_to_batches_end_to_end(write_jsonl, byte_tokenizer):
    path = write_jsonl([{"text": "abc"}, {"text": "defg"}, {"prompt": "x", "completion": "y"}])
    report = read_examples(path, byte_tokenizer, seq_len=4, vocab_size=300)
    examples = pack_examples(report.examples, seq_len=4)
    # stream: BOS a b c EOS BOS d e f g EOS -> chunks of 4, 4, 3; then the prompt row
    assert [len(e.input_ids) for e in examples] == [4, 4, 3, 4]
    stream_of_batches = iter_batches(examples, batch_size=2, seq_len=4, seed=0, pad_token_id=PAD)
    batches = list(islice(stream_of_batches, 2))
    assert sorted(i for b in batches for i in b.example_indices) == [0, 1, 2, 3]
    for b in batches:
        assert (b.labels[b.input_ids == PAD] == M).all()
