"""``/v1/datasets``: JSONL uploads (plain or gzip), checked line by line before they are kept."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, UploadFile, status
from sqlmodel import Session, select

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.keys import Principal
from app.models import Dataset
from app.schemas import DatasetPublic, DatasetsPublic
from app.uploads import store_upload

router = APIRouter(prefix="/datasets", tags=["datasets"])


@router.post("", response_model=DatasetPublic, status_code=status.HTTP_201_CREATED)
def upload_dataset(file: UploadFile, request: Request, session: SessionDep,
                   settings: SettingsDep, principal: PrincipalDep) -> Dataset:
    """Upload a JSONL file (multipart field ``file``): rows of ``{"text"}``,
    ``{"prompt", "completion"}``, ``{"messages"}`` or ``{"input_ids"[, "labels"]}``."""
    declared = request.headers.get("content-length", "")
    return store_upload(session, settings, file, tenant=principal.tenant,
                        declared_bytes=int(declared) if declared.isdigit() else None)


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
