"""Dataset bodies: an uploaded training or validation file as the API shows it."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class DatasetPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    filename: str
    bytes: int
    rows: int
    sha256: str
    created_at: datetime


class DatasetsPublic(BaseModel):
    data: list[DatasetPublic]
    count: int
