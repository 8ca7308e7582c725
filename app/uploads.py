"""Keeping an uploaded JSONL dataset: bounded in bytes (gzip included, measured after
decompression, so a compression bomb stops at the limit), rows and line length, checked line
by line, and stored under a generated name only once whole and valid."""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import tempfile
import zlib
from typing import BinaryIO

from fastapi import HTTPException, UploadFile, status
from sqlmodel import Session

from app.api.errors import invalid
from app.models import Dataset
from app.settings import Settings
from app.storage import dataset_path, new_id
from mebp_core.data.check import check_jsonl
from mebp_core.data.example import DatasetError

_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"


def store_upload(session: Session, settings: Settings, file: UploadFile, *,
                 declared_bytes: int | None, tenant: str) -> Dataset:
    """413 past the size limit, 422 naming the first bad line; nothing is left behind."""
    limit = settings.max_upload_bytes
    if declared_bytes is not None and declared_bytes > limit + (64 << 10):
        raise too_large(limit)
    dataset_id = new_id("ds")
    final = dataset_path(settings.storage_root, dataset_id)
    final.parent.mkdir(parents=True, exist_ok=True)
    filename = os.path.basename(file.filename or "upload.jsonl")[:255]
    fd, staging = tempfile.mkstemp(dir=final.parent, prefix=f".{dataset_id}.")
    try:
        with os.fdopen(fd, "wb") as out:
            size, digest = _copy_bounded(_decompressed(file.file), out, limit, filename)
        try:
            summary = check_jsonl(staging, name=filename, max_rows=settings.max_upload_rows,
                                  max_line_bytes=settings.max_line_bytes)
        except DatasetError as exc:
            raise invalid("file", str(exc)) from None
        os.replace(staging, final)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    dataset = Dataset(id=dataset_id, tenant=tenant, filename=filename, path=str(final),
                      bytes=size, rows=summary.rows, sha256=digest)
    session.add(dataset)
    session.commit()
    session.refresh(dataset)
    return dataset


def too_large(limit: int) -> HTTPException:
    return HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                         f"file: larger than the upload limit of {limit} bytes "
                         f"(decompressed; MEBP_MAX_UPLOAD_BYTES)")


def _decompressed(source: BinaryIO) -> BinaryIO:
    """The upload as JSONL bytes: gzip (by its magic bytes, not its name) is unpacked."""
    head = source.read(2)
    source.seek(0)
    return gzip.GzipFile(fileobj=source, mode="rb") if head == _GZIP_MAGIC else source


def _copy_bounded(source: BinaryIO, out: BinaryIO, limit: int,
                  filename: str) -> tuple[int, str]:
    size, digest = 0, hashlib.sha256()
    while chunk := _read(source, min(_CHUNK, limit + 1 - size), filename):
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        try:
            out.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            raise HTTPException(status.HTTP_507_INSUFFICIENT_STORAGE,
                                "the service's storage is full; try again later") from None
        digest.update(chunk)
    return size, digest.hexdigest()


def _read(source: BinaryIO, size: int, filename: str) -> bytes:
    try:
        return source.read(size)
    except (OSError, EOFError, zlib.error) as exc:  # a truncated or corrupt gzip stream
        raise invalid("file", f"{filename}: not a readable gzip file ({exc})") from None
