"""The kept base exports under the storage root's bases dir, bounded in bytes. An export is
its file, its sha256 beside it (written last: the export is kept once the digest exists) and
when it was last served, recorded as a marker's mtime (atime is unreliable: mounts are often
noatime or relatime). Beyond the bound, the least recently served go first (one never served
by when it was made); one being made is not kept yet, so never a candidate.

A download holds its file open from before it is answered (service/bases.py). Evicting
renames the export to a grave (a hidden name, ``.NAME.grave-<time>``) and deletes graves
GRAVE_GRACE_S old: the workers evict, and an unlink on a worker's host would cut short a
download the API streams from the same file over NFS (only the host that unlinks keeps an
open file readable); a rename keeps it readable everywhere."""

from __future__ import annotations

import time
from pathlib import Path

from mebp_core.atomic import try_lock
from service.storage import digest_path

EXPORT_SUFFIXES = (".zip", ".gguf")
GRAVE_GRACE_S = 6 * 3600  # an evicted export stays readable this long: a slow download
# another evictor holding the turn this long hangs: this eviction is skipped (and, while it
# hangs, every later one: the bound is then not kept, which the caller logs)
EVICTION_WAIT_S = 30.0


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


def evict_least_recently_served(bases: Path, max_bytes: int, keep: Path
                                ) -> list[Path] | None:
    """Remove kept exports, least recently served first, until they total at most
    ``max_bytes``; never ``keep`` (the one just made, not fetched yet). The removed; None
    when another process held the turn past ``EVICTION_WAIT_S`` (nothing was removed)."""
    removed = []
    # this machine's workers evict in turn
    with try_lock(eviction_lock_path(bases), wait_s=EVICTION_WAIT_S) as held:
        if not held:
            return None
        remove_old_graves(bases)
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


def eviction_lock_path(bases: Path) -> Path:
    """The lock the evictors of this machine take in turn."""
    return bases / ".eviction.lock"


def lock_path(path: Path) -> Path:
    """The lock its makers take (service/bases.py ``make_base``)."""
    return path.with_name(f".{path.name}.lock")


def remove_export(path: Path) -> None:
    digest_path(path).unlink(missing_ok=True)  # first: not kept from now on
    try:
        path.rename(path.with_name(f".{path.name}.grave-{time.time():.0f}"))
    except FileNotFoundError:
        pass
    for file in (served_file(path), lock_path(path)):
        file.unlink(missing_ok=True)


def remove_old_graves(bases: Path, grace_s: float = GRAVE_GRACE_S) -> None:
    """Delete the evicted exports renamed over ``grace_s`` ago."""
    for grave in bases.glob(".*.grave-*"):
        made_s = grave.name.rsplit("-", 1)[1]
        if made_s.isdigit() and time.time() - int(made_s) > grace_s:
            grave.unlink(missing_ok=True)
