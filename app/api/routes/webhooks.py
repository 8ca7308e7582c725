"""Webhooks: the tenant's signing secret, and what was POSTed of a job's or fleet's events."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, status

from app.api.deps import BearerCredentials, PrincipalDep, SessionDep, SettingsDep
from app.api.routes.fleets import read_fleet_or_404
from app.api.routes.jobs import get_job_or_404
from app.webhook_schemas import WebhookDeliveriesPublic, WebhookDeliveryPublic, WebhookSecretPublic
from service.webhooks import deliveries_of, rotate_secret, tenant_secret

router = APIRouter(tags=["webhooks"])


def require_bearer_key(credentials: BearerCredentials) -> None:
    """The signing secret is the key's alone: a signed-in dashboard's cookie does not read
    it (a GET is otherwise a read the cookie may make)."""
    if credentials is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "this needs an API key",
                            headers={"WWW-Authenticate": "Bearer"})


KEY_ONLY = [Depends(require_bearer_key)]
DeliveriesLimit = Annotated[int, Query(ge=1, le=1000, description="at most this many, oldest "
                                       "first")]


@router.get("/webhook_secret", response_model=WebhookSecretPublic, dependencies=KEY_ONLY)
def read_webhook_secret(session: SessionDep, principal: PrincipalDep) -> WebhookSecretPublic:
    """The secret every webhook delivery of this tenant is signed with (made on first
    ask): verify ``webhook-signature`` with it (README: Webhooks)."""
    return WebhookSecretPublic.model_validate(tenant_secret(session, principal.tenant),
                                              from_attributes=True)


@router.post("/webhook_secret/rotate", response_model=WebhookSecretPublic,
             dependencies=KEY_ONLY)
def rotate_webhook_secret(session: SessionDep, settings: SettingsDep, principal: PrincipalDep
                          ) -> WebhookSecretPublic:
    """A new secret, signing every attempt from now on (retries of earlier events too); the
    previous one signs beside it for MEBP_WEBHOOK_SECRET_GRACE_S (24 h)."""
    return WebhookSecretPublic.model_validate(
        rotate_secret(session, principal.tenant, settings), from_attributes=True)


@router.get("/jobs/{job_id}/webhook_deliveries", response_model=WebhookDeliveriesPublic)
def list_job_deliveries(job_id: str, session: SessionDep, principal: PrincipalDep,
                        limit: DeliveriesLimit = 100) -> WebhookDeliveriesPublic:
    """The job's events POSTed to its webhook_url, or to be."""
    job = get_job_or_404(session, job_id, principal)
    return _page(deliveries_of(session, job_id=job.id, limit=limit))


@router.get("/fleets/{fleet_id}/webhook_deliveries", response_model=WebhookDeliveriesPublic)
def list_fleet_deliveries(fleet_id: str, session: SessionDep, principal: PrincipalDep,
                          limit: DeliveriesLimit = 100) -> WebhookDeliveriesPublic:
    """The fleet's events (its rounds' ends, its end) POSTed to its webhook_url, or to be."""
    fleet = read_fleet_or_404(session, fleet_id, principal)
    return _page(deliveries_of(session, fleet_id=fleet.id, limit=limit))


def _page(deliveries) -> WebhookDeliveriesPublic:
    return WebhookDeliveriesPublic(data=[WebhookDeliveryPublic.model_validate(delivery)
                                         for delivery in deliveries], count=len(deliveries))
