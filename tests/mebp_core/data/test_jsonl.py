from __future__ import annotations

import pytest

from mebp_core.data.example import DatasetError, Example
from mebp_core.data.jsonl import read_examples
from mebp_core.data.tokenizer import load_tokenizer

M = -100
CHAT = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


def read_one(path, tokenizer, vocab_size=300, seq_len=64):
    report = read_examples(path, tokenizer, seq_len=seq_len, vocab_size=vocab_size)
    assert len(report.examples) == 1
    return report.examples[0]


def test_byte_forms_give_exact_ids_and_labels(write_jsonl, byte_tokenizer):
    rows = [
        {"text": "hi"},
        {"prompt": "a", "completion": "bc"},
        {"messages": CHAT},
        {"input_ids": [5, 6, 7]},
        {"input_ids": [5, 6, 7], "labels": [M, 6, 7], "id": "extra keys are ignored"},
    ]
    report = read_examples(write_jsonl(rows), byte_tokenizer, seq_len=64, vocab_size=300)
    header_user, header_assistant = list(b"<|user|>\n"), list(b"<|assistant|>\n")
    chat_ids = [256] + header_user + [97, 257] + header_assistant + [98, 257]
    chat_labels = [M] * (len(chat_ids) - 2) + [98, 257]
    assert report.examples == [
        Example([256, 104, 105, 257], [256, 104, 105, 257], "text"),
        Example([256, 97, 98, 99, 257], [M, M, 98, 99, 257], "prompt_completion"),
        Example(chat_ids, chat_labels, "messages"),
        Example([5, 6, 7], [5, 6, 7], "tokens"),
        Example([5, 6, 7], [M, 6, 7], "tokens"),
    ]
    assert (report.skipped, report.truncated, report.split) == ([], 0, 0)


@pytest.mark.parametrize("template", ["chatml", "generation"])
def test_hf_forms_give_exact_ids_and_labels(write_jsonl, make_hf_model_dir, template):
    tokenizer = load_tokenizer(make_hf_model_dir(template), {"vocab_size": 32})
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    rows = [{"text": "hello world"}, {"prompt": "hello", "completion": "world"}]
    report = read_examples(
        write_jsonl(rows + [{"messages": messages}]), tokenizer, seq_len=64, vocab_size=32
    )
    assert report.examples == [
        Example([1, 9, 10, 2], [1, 9, 10, 2], "text"),
        Example([1, 9, 10, 2], [M, M, 10, 2], "prompt_completion"),
        Example([3, 6, 9, 4, 3, 7, 11, 4], [M, M, M, M, M, M, 11, 4], "messages"),
    ]


def test_blank_lines_are_skipped_but_counted_in_line_numbers(write_jsonl, byte_tokenizer):
    path = write_jsonl([{"text": "a"}, "", "   ", {"text": 1}])
    with pytest.raises(DatasetError) as info:
        read_examples(path, byte_tokenizer, seq_len=8, vocab_size=300)
    assert str(info.value) == f'{path}:4: "text" must be a string, got an integer'


MALFORMED = [
    ("{bad json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object, got an array"),
    ('"text"', "expected a JSON object, got a string"),
    ({"foo": 1}, "no known form"),
    ({"text": "a", "input_ids": [1, 2]}, "several forms in one row (text, tokens)"),
    ({"messages": CHAT, "prompt": "a", "completion": "b"}, "several forms"),
    ({"text": 5}, '"text" must be a string, got an integer'),
    ({"text": ""}, '"text" is empty'),
    ({"text": None}, '"text" must be a string, got null'),
    ({"prompt": "a"}, '"completion" is missing'),
    ({"completion": "a"}, '"prompt" is missing'),
    ({"prompt": "a", "completion": ""}, '"completion" is empty'),
    ({"prompt": ["a"], "completion": "b"}, '"prompt" must be a string, got an array'),
    ({"messages": []}, '"messages" must be a non-empty array'),
    ({"messages": "hi"}, '"messages" must be a non-empty array'),
    ({"messages": ["hi"]}, '"messages"[0] must be an object, got a string'),
    ({"messages": [CHAT[0], {"role": "robot", "content": "b"}]}, "[1] has unknown role 'robot'"),
    ({"messages": [{"content": "b"}]}, "[0] has unknown role None"),
    ({"messages": [{"role": "user", "content": 3}]}, '[0]["content"] must be a string'),
    ({"messages": [CHAT[0]]}, "no non-empty assistant message"),
    ({"input_ids": []}, '"input_ids" must be a non-empty array of integers'),
    ({"input_ids": [1, 2.5]}, '"input_ids"[1] must be an integer, got a number'),
    ({"input_ids": [1, True]}, '"input_ids"[1] must be an integer, got a boolean'),
    ({"input_ids": [1, -2]}, '"input_ids"[1] is a negative token id (-2)'),
    ({"input_ids": [1, 300]}, '"input_ids"[1] = 300 is outside the vocabulary (vocab_size=300)'),
    ({"input_ids": [1, 2], "labels": [1]}, '"labels" has 1 values but "input_ids" has 2'),
    ({"input_ids": [1, 2], "labels": [M, 400]}, '"labels"[1] = 400 is outside the vocabulary'),
    ({"input_ids": [1, 2], "labels": [M, -5]}, '"labels"[1] is a negative token id (-5)'),
    ({"input_ids": [1, 2], "labels": [M, M]}, "no token to learn from"),
    ({"input_ids": [1]}, "no token to learn from"),
    ({"labels": [1, 2]}, '"labels" is only allowed together with "input_ids"'),
    (b'{"text": "caf\xe9"}', "not valid UTF-8 (byte 13 of the line)"),
]


@pytest.mark.parametrize(("line", "message"), MALFORMED)
def test_malformed_line_names_file_line_and_problem(write_jsonl, byte_tokenizer, line, message):
    path = write_jsonl([{"text": "ok"}, "", line, {"text": "ok"}])
    with pytest.raises(DatasetError) as info:
        read_examples(path, byte_tokenizer, seq_len=64, vocab_size=300)
    assert str(info.value).startswith(f"{path}:3: ")
    assert message in str(info.value)


def test_tokenizer_ids_beyond_model_vocab_are_an_error(write_jsonl, make_hf_model_dir):
    tokenizer = load_tokenizer(make_hf_model_dir(), {"vocab_size": 32})
    path = write_jsonl([{"text": "hello"}, {"text": "hello world"}])
    with pytest.raises(DatasetError) as info:
        read_examples(path, tokenizer, seq_len=64, vocab_size=10)
    assert str(info.value) == (
        f"{path}:2: encoded token[2] = 10 is outside the vocabulary (vocab_size=10)"
    )


def test_skip_malformed_records_lines_and_reasons(write_jsonl, byte_tokenizer):
    path = write_jsonl([{"text": "a"}, "{", "", {"input_ids": [999, 1]}, {"text": "b"}])
    report = read_examples(path, byte_tokenizer, seq_len=8, vocab_size=300, skip_malformed=True)
    assert [e.input_ids for e in report.examples] == [[256, 97, 257], [256, 98, 257]]
    assert [line for line, _ in report.skipped] == [2, 4]
    assert "invalid JSON" in report.skipped[0][1]
    assert "outside the vocabulary" in report.skipped[1][1]


@pytest.mark.parametrize("lines", [[], ["", "  "]], ids=["empty", "blank"])
def test_empty_dataset_is_an_error_naming_the_file(write_jsonl, byte_tokenizer, lines):
    path = write_jsonl(lines)
    with pytest.raises(DatasetError, match=f"^{path}: the dataset has no usable rows$"):
        read_examples(path, byte_tokenizer, seq_len=8, vocab_size=300)


def test_all_rows_skipped_is_an_error_that_says_so(write_jsonl, byte_tokenizer):
    path = write_jsonl(["{", "[]"])
    with pytest.raises(DatasetError, match=r"no usable rows \(2 malformed rows skipped\)"):
        read_examples(path, byte_tokenizer, seq_len=8, vocab_size=300, skip_malformed=True)


def test_missing_file_is_a_dataset_error(tmp_path, byte_tokenizer):
    with pytest.raises(DatasetError, match="cannot read"):
        read_examples(tmp_path / "nope.jsonl", byte_tokenizer, seq_len=8, vocab_size=300)


def test_utf8_bom_and_crlf_are_accepted(tmp_path, byte_tokenizer):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n{"text": "b"}\r\n')
    report = read_examples(path, byte_tokenizer, seq_len=8, vocab_size=300)
    assert [e.input_ids for e in report.examples] == [[256, 97, 257], [256, 98, 257]]


def test_long_rows_are_truncated_and_counted(write_jsonl, byte_tokenizer):
    rows = [
        {"prompt": "ab", "completion": "cdefgh"},
        {"input_ids": list(range(10))},
        {"input_ids": [1, 2, 3]},
    ]
    report = read_examples(write_jsonl(rows), byte_tokenizer, seq_len=5, vocab_size=300)
    assert report.examples == [
        Example([256, 97, 98, 99, 100], [M, M, M, 99, 100], "prompt_completion"),
        Example([0, 1, 2, 3, 4], [0, 1, 2, 3, 4], "tokens"),
        Example([1, 2, 3], [1, 2, 3], "tokens"),
    ]
    assert (report.truncated, report.split) == (2, 0)


def test_truncation_that_leaves_nothing_to_learn_is_malformed(write_jsonl, byte_tokenizer):
    path = write_jsonl([{"prompt": "abcdefgh", "completion": "x"}])
    with pytest.raises(DatasetError, match=":1: no token to learn from within the first seq_len=5"):
        read_examples(path, byte_tokenizer, seq_len=5, vocab_size=300)


def test_long_text_is_split_into_windows_without_loss(write_jsonl, byte_tokenizer):
    report = read_examples(
        write_jsonl([{"text": "abcdefghij"}]), byte_tokenizer, seq_len=5, vocab_size=300
    )
    assert [len(e.input_ids) for e in report.examples] == [5, 5, 2]
    assert [t for e in report.examples for t in e.input_ids] == [256, *b"abcdefghij", 257]
    assert all(e.kind == "text" for e in report.examples)
    assert (report.truncated, report.split) == (0, 1)
