"""Checking a dataset's shape without a tokenizer, as the service does on upload."""

from __future__ import annotations

import json

import pytest

from mebp_core.data.check import JsonlChecker, check_jsonl
from mebp_core.data.example import DatasetError


def write(tmp_path, rows: list) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_every_form_is_counted(tmp_path):
    path = write(tmp_path, [{"text": "a"}, {"prompt": "", "completion": "b"}, "",
                            {"messages": [{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "yo"}]},
                            {"input_ids": [1, 2], "labels": [-100, 2]}])
    summary = check_jsonl(path)
    assert summary.rows == 4
    assert summary.kinds == {"text": 1, "prompt_completion": 1, "messages": 1, "tokens": 1}


@pytest.mark.parametrize("row, message", [
    ("[1, 2]", "expected a JSON object, got an array"),
    ({"txt": "a"}, "no known form"),
    ({"text": "a", "prompt": "b", "completion": "c"}, "several forms"),
    ({"prompt": "a"}, '"completion" is missing'),
    ({"messages": [{"role": "user", "content": "hi"}]}, "no non-empty assistant message"),
    ({"input_ids": [1, "2"]}, '"input_ids"[1] must be an integer'),
    ({"input_ids": [1, 2], "labels": [1]}, "differ in length"),
    ('{"text": ', "invalid JSON"),
])
def test_a_malformed_line_is_named_by_file_and_line(tmp_path, row, message):
    path = write(tmp_path, [{"text": "fine"}, row])
    with pytest.raises(DatasetError, match=r"^up\.jsonl:2: ") as caught:
        check_jsonl(path, name="up.jsonl")
    assert message in str(caught.value)


def test_a_file_without_rows_is_refused(tmp_path):
    with pytest.raises(DatasetError, match="no rows"):
        check_jsonl(write(tmp_path, ["", "  "]))


def test_rows_and_line_length_are_bounded_naming_the_line(tmp_path):
    path = write(tmp_path, [{"text": "a"}, {"text": "b"}, {"text": "c" * 100}])
    assert check_jsonl(path, max_rows=3, max_line_bytes=200).rows == 3
    with pytest.raises(DatasetError, match=r"^data\.jsonl:3: more than the limit of 2 rows"):
        check_jsonl(path, name="data.jsonl", max_rows=2)
    with pytest.raises(DatasetError, match=r"^data\.jsonl:3: the line is longer than "
                                           r"the limit of 50 bytes"):
        check_jsonl(path, name="data.jsonl", max_line_bytes=50)


@pytest.mark.parametrize("line, message", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"input_ids": [' + "9" * 5000 + "]}", "invalid JSON"),
])
def test_hostile_json_is_a_malformed_line_not_a_crash(tmp_path, line, message):
    path = write(tmp_path, [{"text": "fine"}, line])
    with pytest.raises(DatasetError, match=r"^data\.jsonl:2: invalid JSON") as caught:
        check_jsonl(path, name="data.jsonl")
    assert message in str(caught.value)


def test_pieces_of_any_size_check_as_the_whole_file_does(tmp_path):
    rows = [{"text": "a"}, "", {"prompt": "p", "completion": "c"}, {"input_ids": [1, 2]}]
    path = write(tmp_path, rows)
    content = path.read_bytes().replace(b"\n", b"\r\n")
    for size in (1, 2, 7, len(content)):
        checker = JsonlChecker("up.jsonl", max_line_bytes=40)
        for start in range(0, len(content), size):
            checker.feed(content[start:start + size])
        assert checker.finish().kinds == check_jsonl(path).kinds


def test_an_overlong_line_is_refused_before_it_has_all_arrived():
    checker = JsonlChecker("up.jsonl", max_line_bytes=1000)
    checker.feed(b'{"text": "fine"}\n')
    with pytest.raises(DatasetError, match=r"^up\.jsonl:2: the line is longer than"):
        for _ in range(100):  # 100 KB of one line, offered a kilobyte at a time
            checker.feed(b"x" * 1024)
