"""``/v1/datasets``: JSONL uploads (plain or gzip), checked line by line as they arrive, only
after the key is checked, and kept once whole and valid."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from python_multipart.exceptions import MultipartParseError
from sqlalchemy import Engine, or_
from sqlmodel import Session, select
from starlette.requests import ClientDisconnect

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.multipart import MultipartField, batched
from app.dataset_schemas import DatasetPublic, DatasetsPublic
from app.keys import Principal
from app.uploads import CHUNK_BYTES, DatasetUpload
from service.models import Dataset, Fleet, Job
from service.settings import Settings

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
    return await receive_dataset(request, session, settings, principal)


async def receive_dataset(request: Request, session: Session, settings: Settings,
                          principal: Principal, *,
                          text_checks: Mapping[str, Callable[[str | None], None]] = {}
                          ) -> Dataset:
    """The multipart body's ``file``, checked and kept as the principal's dataset; each
    text field named in ``text_checks`` is given to its check (None if absent) before
    anything is kept."""
    # the key is checked: hold no connection (nor a request's session slot) while it streams
    await run_in_threadpool(session.close)
    with DatasetUpload(settings) as upload:
        form = MultipartField(request.headers.get("content-type", ""), "file", upload.start,
                              tuple(text_checks))
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
        for name, check in text_checks.items():
            check(form.values.get(name))
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


@router.delete("/{dataset_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_dataset(dataset_id: str, session: SessionDep, principal: PrincipalDep) -> None:
    """Refused (409) while a job or a fleet's shard refers to it."""
    remove_dataset(session, get_dataset_or_404(session, dataset_id, principal))


def remove_dataset(session: Session, dataset: Dataset) -> None:
    """Forget ``dataset`` and remove its file; a 409 naming what still refers to it."""
    user = dataset_user(session, dataset)
    if user is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"dataset {dataset.id} is in use by "
                            f"{user}")
    session.delete(dataset)
    session.commit()
    Path(dataset.path).unlink(missing_ok=True)  # after the commit: a failed one keeps it


def dataset_user(session: Session, dataset: Dataset) -> str | None:
    """A job, shard or fleet that refers to ``dataset`` (a fleet by its request's JSON)."""
    job = session.exec(select(Job.id).where(or_(Job.training_file == dataset.id,
                                                Job.validation_file == dataset.id))).first()
    if job is not None:
        return f"job {job}"
    shard = session.exec(select(Dataset.id).where(Dataset.source_id == dataset.id)).first()
    if shard is not None:
        return f"shard {shard}"
    fleets = session.exec(select(Fleet).where(Fleet.tenant == dataset.tenant)).all()
    return next((f"fleet {fleet.id}" for fleet in fleets if dataset.id in (
        fleet.spec.request.training_file, fleet.spec.request.validation_file)), None)


def get_dataset_or_404(session: Session, dataset_id: str, principal: Principal) -> Dataset:
    dataset = session.get(Dataset, dataset_id)
    if dataset is None or dataset.tenant != principal.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no dataset {dataset_id!r}")
    return dataset
