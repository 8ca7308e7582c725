"""What the webhook tests share: a service environment that retries webhooks within seconds,
and helpers to submit a job, read its deliveries through the API and add or read delivery
rows straight in the service's database."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

from service_harness import Service
from sqlmodel import Session
from waiting import HANG_GUARD_S, poll_until

from service.db import database_url, make_engine
from service.models import WebhookDelivery
from service.webhooks import add_delivery

ROWS = b"".join(json.dumps({"text": f"the quick brown fox {i} jumps over the lazy dog"})
                .encode() + b"\n" for i in range(32))
MAX_ATTEMPTS = 4
# the receivers are on loopback: private addresses allowed
FAST_WEBHOOKS = {"MEBP_WEBHOOK_RETRY_BASE_S": "0.2", "MEBP_WEBHOOK_RETRY_MAX_S": "1",
                 "MEBP_WEBHOOK_TIMEOUT_S": "1", "MEBP_WEBHOOK_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
                 "MEBP_WEBHOOK_INTERVAL_S": "0.1", "MEBP_WEBHOOK_ALLOW_PRIVATE": "true",
                 "MEBP_RECONCILE_INTERVAL_S": "0.5"}


def upload(service: Service) -> str:
    status, dataset = service.upload("train.jsonl", ROWS)
    assert status == 201, dataset
    return dataset["id"]


def deliveries(service: Service, path: str, done: Callable[[list[dict]], bool],
               what: str) -> list[dict]:
    """``GET {path}/webhook_deliveries``' rows once ``done`` holds of them."""
    return poll_until(lambda: service.request("GET", f"{path}/webhook_deliveries")[1]["data"],
                      done, HANG_GUARD_S, lambda rows: f"{what}: {rows}\n"
                                              f"{service.output.read_text()[-3000:]}")


def all_ended(count: int) -> Callable[[list[dict]], bool]:
    return lambda rows: len(rows) == count and all(r["status"] != "pending" for r in rows)


def service_engine(service: Service):
    return make_engine(database_url(None, service.output.parent / "data"))


def insert_deliveries(service: Service, *to: tuple[str, str]) -> list[str]:
    """Deliveries to (tenant, url) added straight to the service's database in one commit,
    all due now: the sender claims them together. Their ids."""
    engine = service_engine(service)
    try:
        with Session(engine) as session:
            ids = [add_delivery(session, tenant=tenant, url=url, event="test.ping",
                                data={"n": n}).id for n, (tenant, url) in enumerate(to)]
            session.commit()
        return ids
    finally:
        engine.dispose()


def delivery_rows(service: Service, ids: list[str]) -> list[WebhookDelivery]:
    engine = service_engine(service)
    try:
        with Session(engine) as session:
            return [session.get(WebhookDelivery, delivery_id) for delivery_id in ids]
    finally:
        engine.dispose()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def submit(service: Service, body: dict) -> dict:
    status, job = service.request("POST", "/v1/jobs", body)
    assert status == 201, job
    return job
