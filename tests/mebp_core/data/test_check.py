"""Checking a dataset's shape without a tokenizer, as the service does on upload."""

from __future__ import annotations

import json

import pytest

from mebp_core.data.check import check_jsonl
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
