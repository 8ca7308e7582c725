"""``/v1/files``: OpenAI's files over mebp's datasets. An upload with ``purpose=fine-tune``
is a dataset, checked and kept as ``POST /v1/datasets`` keeps one; a file is listed, read and
deleted as its dataset is."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.errors import invalid
from app.api.openai_errors import OpenAIRoute
from app.api.paging import ListLimit, newest_first
from app.api.routes.datasets import (
    UPLOAD_BODY,
    get_dataset_or_404,
    receive_dataset,
    remove_dataset,
)
from app.openai_schemas import FileDeleted, FileObject, OpenAIList
from app.openai_view import file_object
from service.models import Dataset

router = APIRouter(prefix="/files", tags=["files (OpenAI)"], route_class=OpenAIRoute)
# routes whose body is a dataset upload: create_app includes them with the upload limit
uploads = APIRouter(prefix="/files", tags=["files (OpenAI)"], route_class=OpenAIRoute)

PURPOSE = "fine-tune"
_schema = UPLOAD_BODY["requestBody"]["content"]["multipart/form-data"]["schema"]
FILE_UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": {**_schema, "title": "FileUpload", "required": ["file", "purpose"],
               "properties": {**_schema["properties"], "purpose": {
                   "type": "string", "enum": [PURPOSE], "title": "Purpose"}}}}}}}


@uploads.post("", response_model=FileObject, openapi_extra=FILE_UPLOAD_BODY)
async def upload_file(request: Request, session: SessionDep, settings: SettingsDep,
                      principal: PrincipalDep) -> FileObject:
    """Multipart fields ``file`` (JSONL, as for POST /v1/datasets) and ``purpose``."""
    dataset = await receive_dataset(request, session, settings, principal,
                                    text_checks={"purpose": check_purpose})
    return file_object(dataset)


def check_purpose(purpose: str | None) -> None:
    if purpose is None:
        raise invalid("purpose", "Field required")
    if purpose != PURPOSE:
        raise invalid("purpose", f"only {PURPOSE!r}: mebp keeps files to fine-tune on",
                      purpose)


@router.get("", response_model=OpenAIList[FileObject])
def list_files(session: SessionDep, principal: PrincipalDep,
               after: Annotated[str | None, Query(max_length=64)] = None,
               limit: ListLimit = 20) -> OpenAIList[FileObject]:
    """Newest first; ``after``: a file id, the last of the page before."""
    rows, more = newest_first(session, Dataset, tenant=principal.tenant, after=after,
                              limit=limit)
    return OpenAIList[FileObject](data=[file_object(row) for row in rows], has_more=more)


@router.get("/{file_id}", response_model=FileObject)
def read_file(file_id: str, session: SessionDep, principal: PrincipalDep) -> FileObject:
    return file_object(get_dataset_or_404(session, file_id, principal))


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: str, session: SessionDep, principal: PrincipalDep) -> FileDeleted:
    """Refused (409) while a job or a fleet refers to it."""
    remove_dataset(session, get_dataset_or_404(session, file_id, principal))
    return FileDeleted(id=file_id)
