"""Field types and the error body that every resource's request and response bodies share."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, HttpUrl, StringConstraints, UrlConstraints

from service.models import WEBHOOK_URL_CHARS

Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=1024)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(
    max_length=32, description="up to 32 string pairs (keys up to 64 characters, values up "
    "to 1024)")]
WebhookUrl = Annotated[HttpUrl, UrlConstraints(max_length=WEBHOOK_URL_CHARS), Field(
    description="where its events are POSTed, signed (README: Webhooks); http or https, not "
    "this service itself")]
ID_PATTERN = r"^[a-z0-9]+([._-][a-z0-9]+)*$"


class ErrorMessage(BaseModel):
    """Every error but a 422: what went wrong, in words."""

    detail: str
