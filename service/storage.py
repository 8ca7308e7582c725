"""Where datasets and job files live under the storage root (every path is generated here),
and the sha256 a kept file has beside it."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from mebp_core.atomic import staged_file

ZIP_TIMESTAMP = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can hold: the bytes never vary


def new_id(prefix: str) -> str:
    """``prefix-`` plus 20 random hex digits (ids also name files, so never user input)."""
    return f"{prefix}-{secrets.token_hex(10)}"


def dataset_path(root: Path, dataset_id: str) -> Path:
    return root / "datasets" / f"{dataset_id}.jsonl"


def job_dir(root: Path, job_id: str) -> Path:
    """One folder per job: its request, metrics, logs and the adapter it trained."""
    return root / "jobs" / job_id


def round_adapter_dir(root: Path, fleet_id: str, index: int) -> Path:
    """The global adapter a federated fleet's round combined."""
    return root / "fleets" / fleet_id / f"round-{index}" / "adapter"


def adapter_downloads_dir(adapter: Path) -> Path:
    """Beside an adapter folder, the files it downloads as (``service.adapter_downloads``)."""
    return adapter.with_name(f"{adapter.name}-downloads")


def coordinator_lock_path(root: Path, fleet_id: str) -> Path:
    """The lock a fleet's coordinators on this machine take in turn."""
    return root / "fleets" / fleet_id / "coordinator.lock"


def base_config_path(root: Path, job_id: str) -> Path:
    """The base model's Hugging Face config, kept beside the adapter for its exports."""
    return job_dir(root, job_id) / "base_config.json"


def bases_dir(root: Path) -> Path:
    """Exported base models, kept for download once made."""
    return root / "bases"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def digest_path(path: Path) -> Path:
    """Where the sha256 of ``path``'s bytes is kept beside it (``write_with_digest``)."""
    return path.with_name(f"{path.name}.sha256")


def kept_digest(path: Path) -> str | None:
    """The sha256 kept beside ``path``, or None while there is none (being made, removed)."""
    try:
        return digest_path(path).read_text().strip()
    except FileNotFoundError:
        return None


def write_with_digest(path: Path, write: Callable[[Path], None]) -> str:
    """Make ``path`` atomically (``write`` fills the staged file it is given), then its
    sha256 beside it; returns the digest. The old digest goes first, so a digest found
    always names the whole file it sits by, never one being replaced."""
    beside = digest_path(path)
    beside.unlink(missing_ok=True)
    with staged_file(path) as staging:
        write(staging)
        digest = sha256_file(staging)
    with staged_file(beside) as staging:
        staging.write_text(digest + "\n")
    return digest


def zip_directory(directory: Path, out: Path | BinaryIO, *, top: str = "",
                  compression: int = zipfile.ZIP_DEFLATED) -> None:
    """Zip the files under ``directory`` (below a folder ``top`` when given) in name order
    with a fixed timestamp, so the same files always give the same bytes. A missing
    ``directory`` is a FileNotFoundError, never an empty zip."""
    if not directory.is_dir():
        raise FileNotFoundError(f"no folder to zip at {directory}")
    with zipfile.ZipFile(out, "w", compression) as archive:
        for path in sorted(directory.rglob("*")):
            if not path.is_file():
                continue
            name = path.relative_to(directory).as_posix()
            info = zipfile.ZipInfo(f"{top}/{name}" if top else name, ZIP_TIMESTAMP)
            info.compress_type = compression
            info.external_attr = 0o644 << 16
            large = path.stat().st_size >= zipfile.ZIP64_LIMIT
            with open(path, "rb") as source, archive.open(info, "w", force_zip64=large) as sink:
                shutil.copyfileobj(source, sink, 1 << 20)


def write_shards(shards: list[list[bytes]], targets: list[Path]) -> list[tuple[int, int, str]]:
    """Write each shard's rows as a JSONL file at its target (beside its place, then renamed
    in); returns (bytes, rows, sha256) per shard."""
    stats = []
    for rows, target in zip(shards, targets, strict=True):
        content = b"".join(row.rstrip(b"\r\n") + b"\n" for row in rows)
        staging = target.with_name(f".{target.name}.tmp")
        staging.write_bytes(content)
        os.replace(staging, target)
        stats.append((len(content), content.count(b"\n"), hashlib.sha256(content).hexdigest()))
    return stats
