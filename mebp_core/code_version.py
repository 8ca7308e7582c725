"""Digests of the engine's own code, so that figures learned from one version of it are never
applied to another (another checkout sharing the cache, or this one after an edit)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).parent


def source_digest(*paths: Path) -> str:
    """sha256 (16 hex digits) of the named files' bytes, each under its path relative to the
    package; a directory stands for every ``.py`` file under it."""
    files = sorted({f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py"))})
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(PACKAGE_DIR)).encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def engine_code_digest() -> str:
    """Every source file of the engine package (the training step, the store, the planner's
    models): what measured step times are compared against."""
    return source_digest(PACKAGE_DIR)
