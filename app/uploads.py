"""Keeping an uploaded JSONL dataset as it arrives: bounded in bytes (gzip included, measured
after decompression, so a compression bomb stops at the limit), rows and line length, checked
line by line, never holding more than a chunk and a line, and stored under a generated name
only once whole and valid. A full disk anywhere on the way is a 507."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from fastapi import HTTPException, UploadFile, status
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from app.api.errors import invalid
from mebp_core.data.check import JsonlChecker
from mebp_core.data.example import DatasetError
from service.disk_space import out_of_space
from service.models import Dataset
from service.settings import Settings
from service.storage import dataset_path, new_id

CHUNK_BYTES = 1 << 20
MULTIPART_OVERHEAD_BYTES = 64 << 10  # boundaries and part headers around the file
_GZIP_MAGIC = b"\x1f\x8b"


def store_upload(session: Session, settings: Settings, file: UploadFile, *,
                 tenant: str) -> Dataset:
    """An upload already received as a file (the dashboard's form): 413 past the size
    limit, 422 naming the first bad line, 507 on a full disk; nothing is left behind."""
    with DatasetUpload(settings) as upload:
        write = upload.start(file.filename)
        while chunk := file.file.read(CHUNK_BYTES):
            write(chunk)
        return upload.keep(session, tenant=tenant)


def too_large(limit: int) -> HTTPException:
    return HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                         f"file: larger than the upload limit of {limit} bytes "
                         f"(decompressed; MEBP_MAX_UPLOAD_BYTES)")


def storage_full_error() -> HTTPException:
    return HTTPException(status.HTTP_507_INSUFFICIENT_STORAGE,
                         "the service's storage is full; try again later")


@contextlib.contextmanager
def _storage_errors() -> Iterator[None]:
    try:
        yield
    except (OSError, OperationalError) as exc:
        if not out_of_space(exc):
            raise
        raise storage_full_error() from None


class DatasetUpload:
    """One upload: ``start(filename)`` gives the writer its bytes go to as received (plain
    or gzip, told by the magic bytes, not the name); ``keep`` stores it. Leaving the ``with``
    block removes whatever was not kept."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.limit = settings.max_upload_bytes
        self.id = new_id("ds")
        self.final = dataset_path(settings.storage_root, self.id)
        self.filename = "upload.jsonl"
        self.size, self._digest = 0, hashlib.sha256()
        self._staging: Path | None = None
        self._out = None
        self._head = b""  # the first bytes, until the format is known
        self._gzip: zlib._Decompress | None = None
        self._plain: bool | None = None
        self._members = 0  # gzip members finished (a file may hold several, like gzip's)
        self._checker: JsonlChecker | None = None

    def __enter__(self) -> DatasetUpload:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._out is not None:
            with contextlib.suppress(OSError):
                self._out.close()
        if self._staging is not None:
            self._staging.unlink(missing_ok=True)

    def start(self, filename: str | None) -> Callable[[bytes], None]:
        name = os.path.basename((filename or "").replace("\0", ""))[:255]
        self.filename = name or "upload.jsonl"
        self._checker = JsonlChecker(self.filename, max_rows=self.settings.max_upload_rows,
                                     max_line_bytes=self.settings.max_line_bytes)
        with _storage_errors():
            self.final.parent.mkdir(parents=True, exist_ok=True)
            fd, staging = tempfile.mkstemp(dir=self.final.parent, prefix=f".{self.id}.")
        self._staging, self._out = Path(staging), os.fdopen(fd, "wb")
        return self.write

    def write(self, data: bytes) -> None:
        """Bytes as received: unpacked if gzip, then bounded, checked and staged."""
        if self._plain is None:
            self._head += data
            if len(self._head) < len(_GZIP_MAGIC):
                return
            data, self._head = self._head, b""
            self._plain = not data.startswith(_GZIP_MAGIC)
        if self._plain:
            self._accept(data)
        else:
            self._inflate(data)

    def keep(self, session: Session, *, tenant: str) -> Dataset:
        """Store the whole upload under its generated name, once it has checked out."""
        if self._checker is None:
            raise invalid("file", "Field required")
        if self._plain is None:  # fewer bytes than the gzip magic: plain
            self._plain = True
            self._accept(self._head)
        elif not self._plain:
            self._inflate(b"")
            if self._gzip is not None or not self._members:
                self._corrupt_gzip("the gzip stream ends before its end-of-stream marker")
        try:
            summary = self._checker.finish()
        except DatasetError as exc:
            raise invalid("file", str(exc)) from None
        with _storage_errors():
            self._out.flush()
            os.fsync(self._out.fileno())
            self._out.close()  # a late ENOSPC surfaces here, on a full disk
            self._out = None
            os.replace(self._staging, self.final)
        dataset = Dataset(id=self.id, tenant=tenant, filename=self.filename,
                          path=str(self.final), bytes=self.size, rows=summary.rows,
                          sha256=self._digest.hexdigest())
        try:
            with _storage_errors():
                session.add(dataset)
                session.commit()
        except BaseException:
            session.rollback()
            self.final.unlink(missing_ok=True)  # not recorded, so not kept
            raise
        session.refresh(dataset)
        return dataset

    def _inflate(self, data: bytes) -> None:
        """Unpack at most a chunk at a time, so a bomb's output is refused as it grows;
        ``b""`` drains what zlib still holds."""
        while True:
            if self._gzip is None:
                if not data or (self._members and not data.strip(b"\0")):
                    return  # nothing more, or zero padding after a member, as gzip allows
                self._gzip = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            try:
                plain = self._gzip.decompress(data, CHUNK_BYTES)
            except zlib.error as exc:
                self._corrupt_gzip(str(exc))
            self._accept(plain)
            data = self._gzip.unconsumed_tail
            if self._gzip.eof:
                data, self._gzip = self._gzip.unused_data, None
                self._members += 1
            elif not data and not plain:
                return

    def _corrupt_gzip(self, reason: str) -> None:
        raise invalid("file", f"{self.filename}: not a readable gzip file ({reason})")

    def _accept(self, plain: bytes) -> None:
        self.size += len(plain)
        if self.size > self.limit:
            raise too_large(self.limit)
        try:
            self._checker.feed(plain)
        except DatasetError as exc:
            raise invalid("file", str(exc)) from None
        with _storage_errors():
            self._out.write(plain)
        self._digest.update(plain)
