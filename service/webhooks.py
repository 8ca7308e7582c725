"""Webhooks: a job's or a fleet's events POSTed to the ``webhook_url`` it was made with,
signed as Standard Webhooks (and OpenAI's webhooks) sign them, delivered at least once.

A job's event (``crud.add_event``: its status moving to running, succeeded, failed or
cancelled, and its checkpoints) and its delivery are written in one transaction; a fleet's
(a round ended, the fleet ended) are seen in its rows by the API's sender
(``app.webhook_sender``), once each. The sender claims due deliveries, POSTs them outside any
request and any engine, and records each attempt here: a 2xx ends it delivered; no answer in
time, a 408, a 429 or a 5xx is tried again later, the delay doubling; any other answer, or
the last attempt failing, ends it failed. Nothing of a job waits on or reads its deliveries.

Signing (https://www.standardwebhooks.com): ``webhook-id`` (the delivery's id, the same at
every attempt), ``webhook-timestamp`` (the attempt's unix seconds) and ``webhook-signature:
v1,<base64 of HMAC-SHA256 over "{id}.{timestamp}.{body}">``, keyed by the tenant's secret
``whsec_<base64 key>`` decoded; for ``webhook_secret_grace_s`` after a rotation a second
``v1,`` value, keyed by the previous secret, follows (space-separated, as the scheme allows).
The secrets are stored as they are: signing needs them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from service.models import Job, WebhookDelivery, WebhookSecret, utc_now
from service.settings import Settings
from service.storage import new_id

NOTIFIED_STATUSES = frozenset({"running", "succeeded", "failed", "cancelled"})
CHECKPOINT = "checkpoint"  # an event kind: {step, loss, valid_loss, checkpoint_id}
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
RETRIED_STATUS_CODES = frozenset({408, 429})  # and every 5xx
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
# a claimed attempt not recorded this long after its timeout lost its sender: tried again
LEASE_SLACK_S = 30.0
MAX_ERROR_CHARS = 500
CANDIDATES_PER_SLOT = 4  # due deliveries read per free slot: some may be to a busy host


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def tenant_secret(session: Session, tenant: str) -> WebhookSecret:
    """The tenant's signing secret, made on first use (of two made at once, one is kept).
    Commits."""
    found = session.get(WebhookSecret, tenant)
    if found is not None:
        return found
    session.add(WebhookSecret(tenant=tenant, secret=new_secret()))
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
    return session.get(WebhookSecret, tenant)


def rotate_secret(session: Session, tenant: str, settings: Settings) -> WebhookSecret:
    """A new secret for the tenant, signing every attempt from now on; the one it replaces
    signs beside it for ``webhook_secret_grace_s``, so a receiver updated later (or a retry
    of an earlier event) still verifies. Commits."""
    secret = tenant_secret(session, tenant)
    now = utc_now()
    secret.previous_secret, secret.previous_expires_at = secret.secret, now + timedelta(
        seconds=settings.webhook_secret_grace_s)
    secret.secret, secret.created_at = new_secret(), now
    session.add(secret)
    session.commit()
    session.refresh(secret)
    return secret


def signing_secrets(secret: WebhookSecret, now: datetime) -> list[str]:
    """The secrets an attempt at ``now`` is signed with: the current one, then the previous
    one while its grace lasts."""
    previous = secret.previous_secret
    in_grace = secret.previous_expires_at is not None and secret.previous_expires_at > now
    return [secret.secret] + ([previous] if previous is not None and in_grace else [])


def signature(secret: str, message_id: str, timestamp: int, body: str) -> str:
    """One ``v1,`` value of ``body`` sent as ``message_id`` at ``timestamp``."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{message_id}.{timestamp}.{body}".encode(), hashlib.sha256)
    return "v1," + base64.b64encode(digest.digest()).decode()


def signed_headers(secrets_: list[str], message_id: str, timestamp: int, body: str
                   ) -> dict[str, str]:
    """The headers of an attempt; ``webhook-signature`` holds one value per secret."""
    return {"content-type": "application/json", "user-agent": "mebp-webhooks/1",
            "webhook-id": message_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(signature(secret, message_id, timestamp, body)
                                          for secret in secrets_)}


def is_private_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a receiver at ``address`` is refused unless ``webhook_allow_private``: any
    address not globally routable (loopback, RFC 1918, link-local and so 169.254.169.254,
    unique-local, unspecified, shared, reserved), an IPv4-mapped one judged as its IPv4."""
    mapped = getattr(address, "ipv4_mapped", None)
    return not (mapped or address).is_global or (mapped or address).is_multicast


def add_delivery(session: Session, *, tenant: str, url: str, event: str, data: dict,
                 **subject) -> WebhookDelivery:
    """A delivery of ``event`` with ``data``, due now; ``subject``: job_id, or fleet_id with
    fleet_event. The caller commits."""
    delivery_id = new_id("msg")
    now = utc_now()
    body = json.dumps({"id": delivery_id, "type": event, "created_at": int(now.timestamp()),
                       "data": data}, separators=(",", ":"))
    delivery = WebhookDelivery(id=delivery_id, tenant=tenant, url=url, event=event,
                               body=body, created_at=now, next_attempt_at=now, **subject)
    session.add(delivery)
    return delivery


def add_job_event_delivery(session: Session, *, job_id: str, kind: str, message: str,
                           data: dict) -> None:
    """The delivery of a job's event, if the job has a webhook and the event is one it
    posts (``job.<status>`` or ``job.checkpoint``). The caller commits, with the event."""
    notified = kind == CHECKPOINT or (kind == "status"
                                      and data.get("status") in NOTIFIED_STATUSES)
    job = session.get(Job, job_id) if notified else None
    if job is None or job.webhook_url is None:
        return
    status = data["status"] if kind == "status" else job.status
    event = "job.checkpoint" if kind == CHECKPOINT else f"job.{status}"
    add_delivery(session, tenant=job.tenant, url=job.webhook_url, event=event, job_id=job_id,
                 data={**data, "id": job_id, "object": "job", "status": status,
                       "message": message, "fleet_id": job.fleet_id})


def claim_due(session: Session, settings: Settings, limit: int,
              take: Callable[[WebhookDelivery], bool] = lambda _: True
              ) -> list[WebhookDelivery]:
    """Up to ``limit`` deliveries due now that ``take`` accepts (of the CANDIDATES_PER_SLOT
    times as many due first), each taken for one attempt (its attempts counted, its next
    attempt pushed past this one's timeout, so no other sender takes it meanwhile). One whose
    attempts ran out while its sender was lost ends failed. Commits."""
    now = utc_now()
    # in one order, and on PostgreSQL past rows another sender holds (SQLite ignores it):
    # two senders never wait on each other's rows, so never deadlock
    due = session.exec(select(WebhookDelivery).where(
        WebhookDelivery.status == PENDING, col(WebhookDelivery.next_attempt_at) <= now)
        .order_by(col(WebhookDelivery.next_attempt_at), col(WebhookDelivery.id))
        .limit(limit * CANDIDATES_PER_SLOT).with_for_update(skip_locked=True)).all()
    lease = now + timedelta(seconds=settings.webhook_timeout_s + LEASE_SLACK_S)
    taken = []
    for delivery in due:
        expected = {"status": PENDING, "attempts": delivery.attempts}
        if delivery.attempts >= settings.webhook_max_attempts:
            _move(session, delivery.id, expected, status=FAILED, next_attempt_at=None,
                  last_error="its last attempt's sender was lost")
        elif len(taken) < limit and take(delivery) and _move(
                session, delivery.id, expected, attempts=delivery.attempts + 1,
                next_attempt_at=lease):
            taken.append(delivery)
    session.commit()
    for delivery in taken:
        session.refresh(delivery)
    return taken


def record_attempt(session: Session, delivery_id: str, attempt: int, settings: Settings, *,
                   status_code: int | None, error: str | None) -> None:
    """What attempt ``attempt`` of the delivery (claimed by ``claim_due``) came to: delivered
    on a 2xx, else tried again later or ended failed. Commits."""
    now = utc_now()
    delivered = status_code is not None and 200 <= status_code < 300
    retried = status_code is None or status_code >= 500 or status_code in RETRIED_STATUS_CODES
    values: dict = {"last_status_code": status_code,
                    "last_error": None if error is None else error[:MAX_ERROR_CHARS]}
    if delivered:
        values.update(status=DELIVERED, delivered_at=now, next_attempt_at=None)
    elif retried and attempt < settings.webhook_max_attempts:
        values["next_attempt_at"] = now + timedelta(seconds=retry_delay_s(attempt, settings))
    else:
        values.update(status=FAILED, next_attempt_at=None)
    # only if no later attempt took it (this one outlived its claim)
    _move(session, delivery_id, {"status": PENDING, "attempts": attempt}, **values)
    session.commit()


def retry_delay_s(attempt: int, settings: Settings) -> float:
    """The wait after failed attempt ``attempt`` (from 1): doubling from the base."""
    return min(settings.webhook_retry_base_s * 2 ** (attempt - 1), settings.webhook_retry_max_s)


def _move(session: Session, delivery_id: str, expected: dict, **values) -> bool:
    conditions = [getattr(WebhookDelivery, name) == value for name, value in expected.items()]
    moved = session.exec(update(WebhookDelivery)
                         .where(WebhookDelivery.id == delivery_id, *conditions)
                         .values(**values).execution_options(synchronize_session=False))
    return moved.rowcount == 1


def deliveries_of(session: Session, *, limit: int, **subject) -> list[WebhookDelivery]:
    """A job's (``job_id``) or fleet's (``fleet_id``) deliveries, oldest first."""
    (name, value), = subject.items()
    return list(session.exec(select(WebhookDelivery)
                             .where(getattr(WebhookDelivery, name) == value)
                             .order_by(col(WebhookDelivery.created_at),
                                       col(WebhookDelivery.id)).limit(limit)).all())

