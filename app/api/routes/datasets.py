"""``/v1/datasets``: JSONL uploads (plain or gzip), checked line by line as they arrive, only
after the key is checked, and kept once whole and valid."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from python_multipart.exceptions import MultipartParseError
from sqlalchemy import Engine
from sqlmodel import Session, select
from starlette.requests import ClientDisconnect

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.multipart import MultipartField, batched
from app.keys import Principal
from app.schemas import DatasetPublic, DatasetsPublic
from app.uploads import CHUNK_BYTES, DatasetUpload
from service.models import Dataset

router = APIRouter(prefix="/datasets", tags=["datasets"])
# routes whose body is a dataset upload: create_app includes them with the upload limit
uploads = APIRouter(prefix="/datasets", tags=["datasets"])

# the body is read by the route itself (after the key is checked), so it is documented here
UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file"], "title": "DatasetUpload",
    "properties": {"file": {"type": "string", "contentMediaType": "application/octet-stream",
                            "title": "File"}}}}}}}
VALIDATION_ERROR = {422: {"description": "Validation Error", "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}}}


@uploads.post("", response_model=DatasetPublic, status_code=status.HTTP_201_CREATED,
             openapi_extra=UPLOAD_BODY, responses=VALIDATION_ERROR)
async def upload_dataset(request: Request, session: SessionDep, settings: SettingsDep,
                         principal: PrincipalDep) -> Dataset:
    """Upload a JSONL file (multipart field ``file``): rows of ``{"text"}``,
    ``{"prompt", "completion"}``, ``{"messages"}`` or ``{"input_ids"[, "labels"]}``."""
    # the key is checked: hold no connection (nor a request's session slot) while it streams
    await run_in_threadpool(session.close)
    with DatasetUpload(settings) as upload:
        form = MultipartField(request.headers.get("content-type", ""), "file", upload.start)
        try:
            async for batch in batched(request.stream(), CHUNK_BYTES):
                await run_in_threadpool(form.write, batch)
            await run_in_threadpool(form.finish)
        except MultipartParseError as exc:
            raise HTTPException(status.HTTP_400_BAD_REQUEST,
                                f"the multipart body could not be parsed: {exc}") from None
        except ClientDisconnect:
            raise HTTPException(status.HTTP_400_BAD_REQUEST,
                                "the body ended early: the client went away") from None
        async with request.app.state.session_slots.hold():
            return await run_in_threadpool(_keep, upload, request.app.state.engine,
                                           principal.tenant)


def _keep(upload: DatasetUpload, engine: Engine, tenant: str) -> Dataset:
    with Session(engine, expire_on_commit=False) as session:
        return upload.keep(session, tenant=tenant)


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
