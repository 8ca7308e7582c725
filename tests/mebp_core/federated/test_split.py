"""Rows dealt to devices: evenly, by a field's value, or by Dirichlet shares of a label; every
device gets a row, and bad rows are refused naming their line."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from mebp_core.federated.split import SplitError, SplitSpec, read_rows, split_rows


def jsonl(records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


ROWS = read_rows(jsonl({"text": f"row {i}", "user": f"u{i % 5}", "label": i % 3}
                       for i in range(60)))


def users(shard) -> set[str]:
    return {json.loads(row.text)["user"] for row in shard}


def test_iid_deals_every_row_once_and_evenly():
    shards = split_rows(ROWS, 4, SplitSpec("iid"), seed=0)
    assert sorted(row.line for shard in shards for row in shard) == list(range(1, 61))
    assert [len(s) for s in shards] == [15] * 4
    assert split_rows(ROWS, 4, SplitSpec("iid"), seed=0) == shards
    assert split_rows(ROWS, 4, SplitSpec("iid"), seed=1) != shards


def test_by_field_keeps_each_users_rows_on_one_device():
    shards = split_rows(ROWS, 3, SplitSpec("by_field", field="user"), seed=0)
    seen = [users(shard) for shard in shards]
    assert all(seen) and sum(len(s) for s in seen) == 5  # no user on two devices
    assert sorted(len(s) for s in shards) == [12, 24, 24]


def test_dirichlet_skews_labels_more_as_alpha_shrinks():
    def skew(alpha: float) -> float:
        shards = split_rows(ROWS, 4, SplitSpec("dirichlet", field="label", alpha=alpha), seed=3)
        assert sum(len(s) for s in shards) == 60 and all(shards)
        counts = [Counter(json.loads(r.text)["label"] for r in s) for s in shards]
        return sum(max(c.values()) / sum(c.values()) for c in counts) / len(counts)
    assert skew(0.05) > skew(100.0)


def test_rows_that_cannot_be_split_are_refused_naming_the_line():
    rows = read_rows(b'{"text": "a", "user": 1}\n\n{"text": "b"}\n')
    with pytest.raises(SplitError, match="line 3: no field 'user'"):
        split_rows(rows, 2, SplitSpec("by_field", field="user"), seed=0)
    with pytest.raises(SplitError, match="3 distinct values for 4 devices"):
        split_rows(ROWS[:6], 4, SplitSpec("by_field", field="label"), seed=0)
    with pytest.raises(SplitError, match="3 rows cannot give each of 4 devices one"):
        split_rows(ROWS[:3], 4, SplitSpec("iid"), seed=0)
    with pytest.raises(SplitError, match="alpha > 0"):
        split_rows(ROWS, 2, SplitSpec("dirichlet", field="label"), seed=0)
