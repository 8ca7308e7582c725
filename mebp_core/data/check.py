"""Checking a JSONL dataset's shape before any model is chosen (no tokenizer needed).

The service runs this on upload, so a malformed file is refused at once with its line
number; the vocabulary range of pre-tokenized ids is checked later, against the model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from mebp_core.data.example import DatasetError
from mebp_core.data.jsonl import parse_line
from mebp_core.data.rows import (
    RowError,
    check_messages,
    describe_json_type,
    detect_kind,
    require_int_list,
    require_string,
)


@dataclass
class DatasetSummary:
    rows: int = 0
    kinds: Counter = field(default_factory=Counter)  # rows per form


def check_row(row: object) -> str:
    """The row's form; raise `RowError` if its shape is not one of the four JSONL forms."""
    if not isinstance(row, dict):
        raise RowError(f"expected a JSON object, got {describe_json_type(row)}")
    kind = detect_kind(row)
    if kind == "text":
        require_string(row, "text")
    elif kind == "prompt_completion":
        require_string(row, "prompt", allow_empty=True)
        require_string(row, "completion")
    elif kind == "messages":
        check_messages(row["messages"])
    else:
        input_ids = require_int_list(row, "input_ids")
        if "labels" in row and len(require_int_list(row, "labels")) != len(input_ids):
            raise RowError('"labels" and "input_ids" differ in length')
    return kind


def check_jsonl(path: Path | str, *, name: str | None = None, max_rows: int | None = None,
                max_line_bytes: int | None = None) -> DatasetSummary:
    """Count the rows of a JSONL file by form; raise `DatasetError("<name>:<line>: ...")` at
    the first malformed or overlong line, past ``max_rows``, or if there is no row at all."""
    name = name or str(path)
    summary = DatasetSummary()
    with open(path, "rb") as lines:
        for line_no, raw in enumerate(lines, start=1):
            if max_line_bytes is not None and len(raw.rstrip(b"\r\n")) > max_line_bytes:
                raise DatasetError(f"{name}:{line_no}: the line is {len(raw)} bytes, more "
                                   f"than the limit of {max_line_bytes}")
            if max_rows is not None and summary.rows >= max_rows and raw.strip():
                raise DatasetError(f"{name}:{line_no}: more than the limit of {max_rows} rows")
            try:
                row = parse_line(raw, line_no)
                if row is not None:
                    summary.kinds[check_row(row)] += 1
                    summary.rows += 1
            except RowError as exc:
                raise DatasetError(f"{name}:{line_no}: {exc}") from None
    if summary.rows == 0:
        raise DatasetError(f"{name}: the dataset has no rows")
    return summary
