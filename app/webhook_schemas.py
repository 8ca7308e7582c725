"""Webhook bodies: a job's or fleet's deliveries and the tenant's signing secret."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class WebhookDeliveryPublic(BaseModel):
    """One event POSTed (or to be) to a job's or fleet's webhook_url."""

    model_config = ConfigDict(from_attributes=True)

    id: str = Field(description="the webhook-id header, the same at every attempt")
    event: str = Field(description="job.running, job.checkpoint, job.succeeded, job.failed, "
                       "job.cancelled; fleet.round.done, fleet.round.failed, fleet.done, "
                       "fleet.failed, fleet.cancelled")
    status: Literal["pending", "delivered", "failed"] = Field(description=(
        "pending: to be tried (again) at next_attempt_at; delivered: a 2xx came back; "
        "failed: an answer that is not retried, or the attempts ran out"))
    attempts: int
    last_status_code: int | None = Field(description="the last attempt's answer, if any")
    last_error: str | None = Field(description="why the last attempt had no answer")
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    created_at: datetime
    url: str


class WebhookDeliveriesPublic(BaseModel):
    data: list[WebhookDeliveryPublic]
    count: int


class WebhookSecretPublic(BaseModel):
    secret: str = Field(description="whsec_ and the base64 HMAC key (README: Webhooks)")
    created_at: datetime
    previous_expires_at: datetime | None = Field(default=None, description=(
        "until when the secret a rotation replaced signs too (a second v1 signature)"))
