"""Where datasets and job files live under the storage root; every path is generated here."""

from __future__ import annotations

import hashlib
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


def adapter_dir(root: Path, job_id: str) -> Path:
    return job_dir(root, job_id) / "adapter"


def sha256_files(paths: list[Path]) -> str:
    """One digest over the files in the given order (name and content of each)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
