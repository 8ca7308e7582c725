"""``/v1/datasets``: JSONL uploads, checked line by line before they are kept."""

from __future__ import annotations

import hashlib
import os
import tempfile

from fastapi import APIRouter, HTTPException, Request, UploadFile, status
from sqlmodel import Session, select

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.keys import Principal
from app.models import Dataset
from app.schemas import DatasetPublic, DatasetsPublic
from app.settings import Settings
from app.storage import dataset_path, new_id
from mebp_core.data.check import check_jsonl
from mebp_core.data.example import DatasetError

router = APIRouter(prefix="/datasets", tags=["datasets"])
_COPY_CHUNK = 1 << 20


@router.post("", response_model=DatasetPublic, status_code=status.HTTP_201_CREATED)
def upload_dataset(file: UploadFile, request: Request, session: SessionDep,
                   settings: SettingsDep, principal: PrincipalDep) -> Dataset:
    """Upload a JSONL file (multipart field ``file``): rows of ``{"text"}``,
    ``{"prompt", "completion"}``, ``{"messages"}`` or ``{"input_ids"[, "labels"]}``."""
    return store_upload(session, settings, file, request, tenant=principal.tenant)


def store_upload(session: Session, settings: Settings, file: UploadFile, request: Request, *,
                 tenant: str) -> Dataset:
    """Check and keep an uploaded JSONL file: 413 past the size limit, 422 naming the first
    malformed line; nothing is left behind either way."""
    limit = settings.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + (64 << 10):
        raise _too_large(limit)
    dataset_id = new_id("ds")
    final = dataset_path(settings.storage_root, dataset_id)
    final.parent.mkdir(parents=True, exist_ok=True)
    # staged beside its final place and renamed in only once checked: never half a dataset
    fd, staging = tempfile.mkstemp(dir=final.parent, prefix=f".{dataset_id}.")
    try:
        size, digest = 0, hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            while chunk := file.file.read(_COPY_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                out.write(chunk)
                digest.update(chunk)
        filename = os.path.basename(file.filename or "upload.jsonl")[:255]
        try:
            summary = check_jsonl(staging, name=filename)
        except DatasetError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
        os.replace(staging, final)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    dataset = Dataset(id=dataset_id, tenant=tenant, filename=filename, path=str(final),
                      bytes=size, rows=summary.rows, sha256=digest.hexdigest())
    session.add(dataset)
    session.commit()
    session.refresh(dataset)
    return dataset


@router.get("", response_model=DatasetsPublic)
def list_datasets(session: SessionDep, principal: PrincipalDep) -> DatasetsPublic:
    rows = session.exec(select(Dataset).where(Dataset.tenant == principal.tenant)
                        .order_by(Dataset.created_at.desc())).all()
    return DatasetsPublic(data=[DatasetPublic.model_validate(row) for row in rows],
                          count=len(rows))


@router.get("/{dataset_id}", response_model=DatasetPublic)
def read_dataset(dataset_id: str, session: SessionDep, principal: PrincipalDep) -> Dataset:
    return get_dataset_or_404(session, dataset_id, principal)


def get_dataset_or_404(session: Session, dataset_id: str, principal: Principal) -> Dataset:
    dataset = session.get(Dataset, dataset_id)
    if dataset is None or dataset.tenant != principal.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no dataset {dataset_id!r}")
    return dataset


def _too_large(limit: int) -> HTTPException:
    return HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                         f"file: larger than the upload limit of {limit} bytes "
                         f"(MEBP_MAX_UPLOAD_BYTES)")
