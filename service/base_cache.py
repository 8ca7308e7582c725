"""The kept base exports under the storage root's bases dir, bounded in bytes. An export is
its file, its sha256 beside it (written last: the export is kept once the digest exists) and
when it was last served, recorded as a marker's mtime (atime is unreliable: mounts are often
noatime or relatime). Beyond the bound, the least recently served go first (one never served
by when it was made); one being made is not kept yet, so never a candidate.

A download holds its file open from before it is answered (service/bases.py), so evicting
one mid-download is safe: on Linux an unlinked file stays readable through the descriptors
open on it, and its space is freed when the last one closes."""

from __future__ import annotations

from pathlib import Path

from mebp_core.atomic import exclusive_lock
from service.storage import digest_path

EXPORT_SUFFIXES = (".zip", ".gguf")


def served_file(path: Path) -> Path:
    return path.with_name(path.name + ".served")


def record_served(path: Path) -> None:
    served_file(path).touch()


def last_used_s(path: Path) -> float:
    """When ``path`` was last served, else made (0 if it is gone meanwhile)."""
    for marker in (served_file(path), digest_path(path)):
        try:
            return marker.stat().st_mtime
        except FileNotFoundError:
            continue
    return 0.0


def kept_exports(bases: Path) -> dict[Path, int]:
    """{export: size in bytes} of the whole exports in ``bases`` (not those being made)."""
    kept = {}
    for path in bases.iterdir() if bases.is_dir() else ():
        if path.suffix in EXPORT_SUFFIXES and not path.name.startswith(".") \
                and digest_path(path).is_file():
            try:
                kept[path] = path.stat().st_size
            except FileNotFoundError:  # evicted by another process meanwhile
                continue
    return kept


def evict_least_recently_served(bases: Path, max_bytes: int, keep: Path) -> list[Path]:
    """Remove kept exports, least recently served first, until they total at most
    ``max_bytes``; never ``keep`` (the one just made, not fetched yet). The removed."""
    removed = []
    with exclusive_lock(bases / ".eviction.lock"):  # the API processes of this machine
        kept = kept_exports(bases)
        total_bytes = sum(kept.values())
        for path in sorted(kept, key=last_used_s):
            if total_bytes <= max_bytes:
                break
            if path != keep:
                remove_export(path)
                total_bytes -= kept[path]
                removed.append(path)
    return removed


def remove_export(path: Path) -> None:
    for file in (digest_path(path), path, served_file(path)):  # the digest first: not kept
        file.unlink(missing_ok=True)
