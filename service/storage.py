"""Where datasets and job files live under the storage root; every path is generated here."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path


def new_id(prefix: str) -> str:
    """``prefix-`` plus 20 random hex digits (ids also name files, so never user input)."""
    return f"{prefix}-{secrets.token_hex(10)}"


def dataset_path(root: Path, dataset_id: str) -> Path:
    return root / "datasets" / f"{dataset_id}.jsonl"


def job_dir(root: Path, job_id: str) -> Path:
    """One folder per job: its request, metrics, logs and the adapter it trained."""
    return root / "jobs" / job_id


def base_config_path(root: Path, job_id: str) -> Path:
    """The base model's Hugging Face config, kept beside the adapter for its exports."""
    return job_dir(root, job_id) / "base_config.json"


def sha256_files(paths: list[Path]) -> str:
    """One digest over the files in the given order (name and content of each)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def write_shards(source: Path, targets: list[Path]) -> list[tuple[int, int, str]]:
    """Deal the non-blank lines of ``source`` round-robin into ``targets`` (each written
    beside its place and renamed in); returns (bytes, rows, sha256) per shard."""
    lines = [line for line in source.read_bytes().splitlines(keepends=True) if line.strip()]
    stats = []
    for index, target in enumerate(targets):
        content = b"".join(line if line.endswith(b"\n") else line + b"\n"
                           for line in lines[index::len(targets)])
        staging = target.with_name(f".{target.name}.tmp")
        staging.write_bytes(content)
        os.replace(staging, target)
        stats.append((len(content), content.count(b"\n"), hashlib.sha256(content).hexdigest()))
    return stats
