"""A fleet's shards: its training file's rows dealt to its members by its data split
(``mebp_core.federated.split``, seeded, so every dealing gives each member the same rows),
and the files of the members that train. A population's phone has its shard written when it
is first drawn into a round (``write_missing_shards``), so a fleet of 10,000 writes only the
shards its rounds use."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sqlmodel import Session

from mebp_core.federated.split import Row, SplitSpec, read_rows, split_rows
from service.fleet_spec import shard_id
from service.models import Dataset, Fleet
from service.storage import dataset_path, write_shards


def deal(source: Dataset, fleet: Fleet) -> list[list[Row]]:
    """Every member's rows. ``SplitError`` names the line or field."""
    request = fleet.spec.request
    return split_rows(read_rows(Path(source.path).read_bytes()), fleet.spec.member_count,
                      request.data_split or SplitSpec(), request.seed)


def write_member_shards(storage_root: Path, source: Dataset, fleet: Fleet,
                        dealt: list[list[Row]], indices: Iterable[int]) -> list[Dataset]:
    """Write the shards of members ``indices``; their ``Dataset`` rows, not yet added (a
    file written is removed again if any fails)."""
    indices = list(indices)
    ids = [shard_id(fleet.id, index) for index in indices]
    paths = [dataset_path(storage_root, shard) for shard in ids]
    try:
        stats = write_shards([[row.text for row in dealt[index]] for index in indices], paths)
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise
    count = fleet.spec.member_count
    datasets = []
    for index, shard, path, (size, rows, digest) in zip(indices, ids, paths, stats,
                                                        strict=True):
        name = f"{source.filename} (shard {index + 1} of {count}, {fleet.id})"
        datasets.append(Dataset(id=shard, tenant=source.tenant, filename=name[:255],
                                path=str(path), bytes=size, rows=rows, sha256=digest,
                                source_id=source.id))
    return datasets


def write_missing_shards(session: Session, fleet: Fleet, indices: Iterable[int],
                         storage_root: Path) -> None:
    """Write and add the shards of a population's members ``indices`` not written yet (the
    training file dealt again, to the same rows)."""
    missing = [index for index in indices
               if session.get(Dataset, shard_id(fleet.id, index)) is None]
    if not missing:
        return
    source = session.get(Dataset, fleet.spec.request.training_file)
    session.add_all(write_member_shards(storage_root, source, fleet, deal(source, fleet),
                                        missing))
