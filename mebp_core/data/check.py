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

_READ_BYTES = 1 << 20


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
    checker = JsonlChecker(name or str(path), max_rows=max_rows, max_line_bytes=max_line_bytes)
    with open(path, "rb") as file:
        while chunk := file.read(_READ_BYTES):
            checker.feed(chunk)
    return checker.finish()


class JsonlChecker:
    """`check_jsonl` for bytes fed in pieces of any size (an upload as it arrives). It holds
    at most one line: with ``max_line_bytes`` an overlong line is refused once it passes the
    limit, never held whole. A line's length excludes its ``\\n`` or ``\\r\\n`` ending."""

    def __init__(self, name: str, *, max_rows: int | None = None,
                 max_line_bytes: int | None = None) -> None:
        self.name, self.max_rows, self.max_line_bytes = name, max_rows, max_line_bytes
        self.summary = DatasetSummary()
        self._line_no = 1
        self._partial = bytearray()  # the current line's bytes so far, without its ending

    def feed(self, data: bytes) -> None:
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            if self._partial:
                self._hold(data[start:end])
                raw, self._partial = bytes(self._partial), bytearray()
            else:
                raw = data[start:end]
            self._check_line(raw.removesuffix(b"\r"))
            start = end + 1
        self._hold(data[start:])

    def finish(self) -> DatasetSummary:
        if self._partial:
            self._check_line(bytes(self._partial).removesuffix(b"\r"))
            self._partial = bytearray()
        if self.summary.rows == 0:
            raise DatasetError(f"{self.name}: the dataset has no rows")
        return self.summary

    def _hold(self, piece: bytes) -> None:
        self._partial += piece
        # one byte over is allowed while unfinished: it may be the \r of a \r\n ending
        if self.max_line_bytes is not None and len(self._partial) > self.max_line_bytes + 1:
            self._too_long()

    def _too_long(self) -> None:
        raise DatasetError(f"{self.name}:{self._line_no}: the line is longer than the limit "
                           f"of {self.max_line_bytes} bytes")

    def _check_line(self, raw: bytes) -> None:
        line_no = self._line_no
        if self.max_line_bytes is not None and len(raw) > self.max_line_bytes:
            self._too_long()
        if self.max_rows is not None and self.summary.rows >= self.max_rows and raw.strip():
            raise DatasetError(f"{self.name}:{line_no}: more than the limit of "
                               f"{self.max_rows} rows")
        try:
            row = parse_line(raw, line_no)
            if row is not None:
                self.summary.kinds[check_row(row)] += 1
                self.summary.rows += 1
        except RowError as exc:
            raise DatasetError(f"{self.name}:{line_no}: {exc}") from None
        self._line_no += 1
