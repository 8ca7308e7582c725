"""Read a JSONL training file into `Example`s, with exact line numbers for every problem.

Length policy: every returned example has at most `seq_len` tokens.
- A "text" row longer than `seq_len` is split into consecutive `seq_len` windows (counted in
  `split`), so nothing is lost: packing concatenates text rows into one stream anyway.
- Any other row longer than `seq_len` is truncated to its first `seq_len` tokens (counted in
  `truncated`); if no learned token is left, the row is malformed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mebp_core.data.example import DatasetError, Example
from mebp_core.data.rows import RowError, build_example
from mebp_core.data.tokenizer import Tokenizer

_UTF8_BOM = b"\xef\xbb\xbf"


@dataclass
class DatasetReport:
    """The usable examples of a file and what was done to the rest."""

    examples: list[Example] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, reason)
    truncated: int = 0
    split: int = 0


def parse_line(raw: bytes, line_no: int) -> object | None:
    """Return the JSON value of one line, None for a blank line; raise `RowError` if invalid."""
    if line_no == 1 and raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RowError(f"not valid UTF-8 (byte {exc.start} of the line)") from None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RowError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise RowError("invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise RowError(f"invalid JSON: {exc}") from None


def fit_to_seq_len(example: Example, seq_len: int) -> list[Example]:
    """Return `example` cut to at most `seq_len` tokens, per the module's length policy."""
    if len(example.input_ids) <= seq_len:
        return [example]
    if example.kind == "text":
        return [
            Example(example.input_ids[i : i + seq_len], example.labels[i : i + seq_len], "text")
            for i in range(0, len(example.input_ids), seq_len)
        ]
    cut = Example(example.input_ids[:seq_len], example.labels[:seq_len], example.kind)
    if cut.count_supervised_tokens() == 0:
        raise RowError(f"no token to learn from within the first seq_len={seq_len} tokens")
    return [cut]


def add_line(
    report: DatasetReport,
    raw: bytes,
    line_no: int,
    *,
    tokenizer: Tokenizer,
    seq_len: int,
    vocab_size: int,
) -> None:
    """Add the examples of one line to `report`; raise `RowError` if the line is malformed."""
    row = parse_line(raw, line_no)
    if row is None:
        return
    example = build_example(row, tokenizer, vocab_size)
    pieces = fit_to_seq_len(example, seq_len)
    if len(pieces) > 1:
        report.split += 1
    elif len(pieces[0].input_ids) < len(example.input_ids):
        report.truncated += 1
    report.examples.extend(pieces)


def read_examples(
    path: Path | str,
    tokenizer: Tokenizer,
    *,
    seq_len: int,
    vocab_size: int,
    skip_malformed: bool = False,
) -> DatasetReport:
    """Return the examples of the JSONL file at `path`.

    A malformed line raises `DatasetError("<path>:<line>: <what is wrong>")`, or with
    `skip_malformed` is recorded in `skipped`. Blank lines are ignored. A file without any
    usable row is a `DatasetError`.
    """
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    report = DatasetReport()
    try:
        with open(path, "rb") as lines:
            for line_no, raw in enumerate(lines, start=1):
                try:
                    add_line(
                        report,
                        raw,
                        line_no,
                        tokenizer=tokenizer,
                        seq_len=seq_len,
                        vocab_size=vocab_size,
                    )
                except RowError as exc:
                    if not skip_malformed:
                        raise DatasetError(f"{path}:{line_no}: {exc}") from None
                    report.skipped.append((line_no, str(exc)))
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read the dataset: {exc.strerror or exc}") from None
    if not report.examples:
        skipped = f" ({len(report.skipped)} malformed rows skipped)" if report.skipped else ""
        raise DatasetError(f"{path}: the dataset has no usable rows{skipped}")
    return report
