"""Splitting a dataset's rows across a fleet's devices, as real phones hold data.

``iid``: rows shuffled and dealt evenly. ``by_field``: every row with the same value of a
field (a user, a source) goes to one device, so devices differ as their users do.
``dirichlet``: for each value of a label field, the devices' shares are drawn from a
Dirichlet(alpha) (small alpha: each label concentrates on few devices). Every device gets at
least one row. Errors name the line (1-based, as in the file).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from mebp_core.errors import MebpError

SplitKind = Literal["iid", "by_field", "dirichlet"]
SPLIT_KINDS: tuple[str, ...] = get_args(SplitKind)


class SplitError(MebpError, ValueError):
    """Rows that cannot be split as asked; the message names the line or the field."""


@dataclass(frozen=True)
class Row:
    line: int  # 1-based line number in the file
    text: bytes


@dataclass(frozen=True)
class SplitSpec:
    kind: SplitKind = "iid"
    field: str | None = None  # by_field: the grouping field; dirichlet: the label field
    alpha: float | None = None  # dirichlet only


def read_rows(content: bytes) -> list[Row]:
    """The non-blank lines of a JSONL file with their line numbers."""
    return [Row(number, line) for number, line in enumerate(content.splitlines(), start=1)
            if line.strip()]


def split_rows(rows: Sequence[Row], devices: int, spec: SplitSpec, seed: int) -> list[list[Row]]:
    """``rows`` dealt to ``devices`` shards by ``spec``, each in file order."""
    if devices < 1:
        raise SplitError("a split needs at least one device")
    if len(rows) < devices:
        raise SplitError(f"{len(rows)} rows cannot give each of {devices} devices one")
    rng = random.Random(f"{seed}:split")
    if spec.kind == "iid":
        order = list(range(len(rows)))
        rng.shuffle(order)
        shards = [order[i::devices] for i in range(devices)]
    elif spec.kind == "by_field":
        shards = by_field(field_values(rows, spec.field), devices)
    elif spec.kind == "dirichlet":
        if spec.alpha is None or spec.alpha <= 0:
            raise SplitError("dirichlet needs alpha > 0")
        shards = dirichlet(field_values(rows, spec.field), devices, spec.alpha, seed)
    else:
        raise SplitError(f"unknown split {spec.kind!r} (known: {', '.join(SPLIT_KINDS)})")
    fill_empty(shards)
    return [[rows[i] for i in sorted(shard)] for shard in shards]


def field_values(rows: Sequence[Row], field: str | None) -> list[str]:
    """Each row's value of ``field``, as canonical JSON text so any JSON value groups."""
    if not field:
        raise SplitError("this split needs the name of a field")
    values = []
    for row in rows:
        try:
            record = json.loads(row.text)
        except json.JSONDecodeError as exc:
            raise SplitError(f"line {row.line}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or field not in record:
            raise SplitError(f"line {row.line}: no field {field!r} to split by")
        values.append(json.dumps(record[field], sort_keys=True))
    return values


def groups_of(values: Sequence[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for index, value in enumerate(values):
        groups.setdefault(value, []).append(index)
    return groups


def by_field(values: Sequence[str], devices: int) -> list[list[int]]:
    """Whole groups to devices, largest first onto the device with the fewest rows."""
    groups = groups_of(values)
    if len(groups) < devices:
        raise SplitError(f"the field has {len(groups)} distinct values for {devices} devices: "
                         "each device needs its own")
    shards: list[list[int]] = [[] for _ in range(devices)]
    for _, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        min(shards, key=len).extend(members)
    return shards


def dirichlet(values: Sequence[str], devices: int, alpha: float, seed: int) -> list[list[int]]:
    generator = np.random.default_rng(seed)
    shards: list[list[int]] = [[] for _ in range(devices)]
    for _, members in sorted(groups_of(values).items()):
        shares = generator.dirichlet(np.full(devices, alpha))
        members = list(members)
        generator.shuffle(members)
        bounds = np.round(np.cumsum(shares) * len(members)).astype(int)
        start = 0
        for device, end in enumerate(bounds):
            shards[device].extend(members[start:end])
            start = end
    return shards


def fill_empty(shards: list[list[int]]) -> None:
    """Move one row from the largest shard to each empty one."""
    for shard in shards:
        if not shard:
            donor = max(shards, key=len)
            shard.append(donor.pop())
