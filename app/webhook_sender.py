"""``WebhookSender``: the API process's thread that POSTs webhook deliveries
(``service.webhooks``), outside any request and any job's engine.

One event loop runs for the thread's life. Every ``webhook_interval_s``, and as soon as an
attempt ends while more may be due, it claims due deliveries for the free slots
(``webhook_max_in_flight``, ``webhook_max_in_flight_per_host`` to one host) and starts each
attempt on its own, cut at ``webhook_timeout_s``: a slow receiver holds its slot, no one
else's. Every ``reconcile_interval_s`` it first adds the deliveries of fleets' events seen in
their rows (a round ended: ``fleet.round.done`` or ``fleet.round.failed``; the fleet ended, as
``app.fleet_status`` reads it: ``fleet.done``, ``fleet.failed`` or ``fleet.cancelled``), one
fleet at a time, a fleet that cannot be read skipped. Every attempt connects only to an
address it resolved and checked (``PinnedBackend``). Deliveries are rows, so a restarted
service goes on with them; several API processes share them (a claim is a conditional
update, a fleet's event a unique row). ``stop`` cancels the attempts in flight: each is tried
again once its claim lapses, as after a crash.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
import time
from collections import Counter
from contextlib import suppress
from typing import NamedTuple
from urllib.parse import urlsplit

import httpcore
import httpx
from sqlalchemy import Engine, exists, func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.fleet_status import fleet_status
from service.federation import RUNNING as ROUND_RUNNING
from service.json_column import rows_that_load
from service.models import Fleet, FleetRound, Job, WebhookDelivery, utc_now
from service.settings import Settings
from service.webhooks import (
    add_delivery,
    claim_due,
    is_private_address,
    record_attempt,
    signed_headers,
    signing_secrets,
    tenant_secret,
)

log = logging.getLogger("mebp.webhooks")
FLEET_ENDS = ("done", "failed", "cancelled")
END = "end"
STOP_JOIN_S = 1.0  # stop() waits this long at most: the service has 10 s to exit in all
# what an attempt that had no answer records: coarse, so deliveries tell nothing of the
# network behind a receiver (no errno, no "refused" against "unreachable")
REFUSED_PRIVATE = "refused: private address"
CONNECTION_FAILED = "connection failed"
INVALID_URL = "the URL cannot be sent to"


class Attempt(NamedTuple):
    delivery_id: str
    number: int  # the delivery's attempts, this one included
    url: str
    body: str
    secrets: list[str]  # the tenant's signing secrets now


class PrivateAddressError(Exception):
    """The receiver's host resolved to an address webhooks may not reach."""


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, resolving the host itself and connecting only to an
    address it checked: a host that resolves to any private address is refused (unless
    allowed), and a second resolution (DNS rebinding) cannot change where it connects. TLS
    still verifies and sends SNI for the URL's host name, which httpcore passes apart."""

    def __init__(self, allow_private: bool) -> None:
        self.allow_private = allow_private
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options=None
                          ) -> httpcore.AsyncNetworkStream:
        try:
            found = await asyncio.get_running_loop().getaddrinfo(host, port,
                                                                 type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise httpcore.ConnectError(CONNECTION_FAILED) from exc
        addresses = list(dict.fromkeys(info[4][0] for info in found))
        if not self.allow_private and any(
                is_private_address(ipaddress.ip_address(a.split("%")[0])) for a in addresses):
            raise PrivateAddressError(host)
        for address in addresses[:-1]:
            with suppress(httpcore.ConnectError, httpcore.ConnectTimeout):
                return await self._backend.connect_tcp(address, port, timeout, local_address,
                                                       socket_options)
        return await self._backend.connect_tcp(addresses[-1], port, timeout, local_address,
                                               socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options=None) -> httpcore.AsyncNetworkStream:
        raise PrivateAddressError(path)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class WebhookSender:
    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine, self.settings = engine, settings
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task | None = None
        self._thread = threading.Thread(target=self._run, name="mebp-webhooks", daemon=True)
        self._per_host: Counter[str] = Counter()  # attempts in flight to each host:port
        self._freed: asyncio.Event | None = None  # an attempt ended: a slot is free
        self._next_fleet_scan = 0.0  # time.monotonic()

    def start(self) -> WebhookSender:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Cancels the attempts in flight (one cut short is tried again once its claim
        lapses, as after a crash) and waits STOP_JOIN_S at most for the thread."""
        self._stopping.set()
        loop, main = self._loop, self._main
        if loop is not None and main is not None:
            with suppress(RuntimeError):  # the loop has closed already
                loop.call_soon_threadsafe(main.cancel)
        self._thread.join(timeout=STOP_JOIN_S)

    def _run(self) -> None:
        with suppress(asyncio.CancelledError):
            asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop, self._main = asyncio.get_running_loop(), asyncio.current_task()
        self._freed = asyncio.Event()
        transport = httpx.AsyncHTTPTransport(trust_env=False, limits=httpx.Limits(
            max_connections=self.settings.webhook_max_in_flight))
        # httpx has no parameter for the network backend of the pool it makes
        transport._pool._network_backend = PinnedBackend(self.settings.webhook_allow_private)
        # no proxy from the environment, no redirect followed: the URL given is the receiver
        async with httpx.AsyncClient(transport=transport, follow_redirects=False,
                                     timeout=self.settings.webhook_timeout_s,
                                     trust_env=False) as client, \
                asyncio.TaskGroup() as attempts:
            while not self._stopping.is_set():
                free = self.settings.webhook_max_in_flight - self._per_host.total()
                claimed = self._claim(free) if free > 0 else []
                for attempt in claimed:
                    attempts.create_task(self._send(client, attempt))
                self._freed.clear()
                # more may be due once a slot frees: look again then, else at the interval
                if free <= 0 or len(claimed) == free:
                    with suppress(TimeoutError):
                        async with asyncio.timeout(self.settings.webhook_interval_s):
                            await self._freed.wait()
                else:
                    await asyncio.sleep(self.settings.webhook_interval_s)

    def _claim(self, free: int) -> list[Attempt]:
        """Fleets' new events added (at the reconciler's interval), then up to ``free``
        due deliveries claimed, none to a host at its cap; a failure of either is logged and
        the round goes on."""
        try:
            with Session(self.engine) as session:
                if time.monotonic() >= self._next_fleet_scan:
                    self._next_fleet_scan = time.monotonic() + self.settings.reconcile_interval_s
                    add_fleet_deliveries(session)
        except Exception as exc:  # the database down, say: claim what can be claimed
            log.warning("webhooks: fleets not scanned: %s", exc)
        try:
            with Session(self.engine) as session:
                cap, counted = self.settings.webhook_max_in_flight_per_host, Counter()

                def take(delivery: WebhookDelivery) -> bool:
                    host = host_of(delivery.url)
                    counted[host] += 1
                    return self._per_host[host] + counted[host] <= cap

                due = claim_due(session, self.settings, free, take)
                now = utc_now()
                secrets = {tenant: signing_secrets(tenant_secret(session, tenant), now)
                           for tenant in {delivery.tenant for delivery in due}}
                claimed = [Attempt(d.id, d.attempts, d.url, d.body, secrets[d.tenant])
                           for d in due]
        except Exception as exc:  # the database down, say: the next round tries again
            log.warning("webhooks: no delivery claimed: %s", exc)
            return []
        for attempt in claimed:
            self._per_host[host_of(attempt.url)] += 1
        return claimed

    async def _send(self, client: httpx.AsyncClient, attempt: Attempt) -> None:
        """One attempt, recorded; cancelled (the service stopping), nothing is recorded."""
        host = host_of(attempt.url)
        try:
            status_code, error = await self._post(client, attempt)
            try:
                with Session(self.engine) as session:
                    record_attempt(session, attempt.delivery_id, attempt.number,
                                   self.settings, status_code=status_code, error=error)
            except Exception as exc:  # its claim lapses: tried again
                log.warning("webhooks: attempt of %s not recorded: %s", attempt.delivery_id,
                            exc)
        finally:
            self._per_host[host] -= 1
            if self._per_host[host] <= 0:
                del self._per_host[host]
            self._freed.set()

    async def _post(self, client: httpx.AsyncClient, attempt: Attempt
                    ) -> tuple[int | None, str | None]:
        """The attempt's status code, or why there is none (coarsely); the answer's body is
        not read. Nothing a URL or a receiver does raises past here."""
        timeout_s = self.settings.webhook_timeout_s
        try:
            headers = signed_headers(attempt.secrets, attempt.delivery_id, int(time.time()),
                                     attempt.body)
            async with asyncio.timeout(timeout_s):  # the whole attempt, however it trickles
                async with client.stream("POST", attempt.url, content=attempt.body,
                                         headers=headers) as response:
                    return response.status_code, None
        except (TimeoutError, httpx.TimeoutException):
            return None, f"no answer within {timeout_s:g} s"
        except PrivateAddressError:
            return None, REFUSED_PRIVATE
        except httpx.HTTPError:
            return None, CONNECTION_FAILED
        except (UnicodeError, ValueError):  # a host IDNA refuses, stored before the 422
            return None, INVALID_URL
        except Exception:  # a bug: this delivery's alone
            log.exception("webhooks: attempt of %s", attempt.delivery_id)
            return None, CONNECTION_FAILED


def host_of(url: str) -> str:
    """The host and port an attempt to ``url`` connects to: what the per-host cap counts."""
    try:
        parts = urlsplit(url)
        return f"{(parts.hostname or '').lower()}:{parts.port or parts.scheme}"
    except ValueError:
        return ""


def add_fleet_deliveries(session: Session) -> None:
    """The deliveries of what fleets with a webhook did since they were last looked at: each
    round ended, then the fleet's end. A fleet whose end was posted is not read again; one
    that cannot be read (a row that does not load, a conflict) is logged and skipped."""
    unended = rows_that_load(session, select(Fleet).where(
        col(Fleet.webhook_url).is_not(None),
        ~exists().where(WebhookDelivery.fleet_id == Fleet.id,
                        WebhookDelivery.fleet_event == END)))
    for fleet in unended:
        try:
            _add_events_of(session, fleet)
            session.commit()
        except IntegrityError:  # another API process added them first
            session.rollback()
        except Exception as exc:
            session.rollback()
            log.warning("webhooks: fleet %s skipped: %s", fleet.id, exc)


def _add_events_of(session: Session, fleet: Fleet) -> None:
    # everything read before anything is added: no autoflush of an added row mid-read
    posted = set(session.exec(select(WebhookDelivery.fleet_event)
                              .where(WebhookDelivery.fleet_id == fleet.id)).all())
    count = session.exec(select(func.count()).select_from(FleetRound)
                         .where(FleetRound.fleet_id == fleet.id)).one()
    rounds = rows_that_load(session, select(FleetRound).where(FleetRound.fleet_id == fleet.id)
                            .order_by(col(FleetRound.index)))
    statuses = session.exec(select(Job.status).where(Job.fleet_id == fleet.id)).all()
    status = fleet_status(fleet, rounds, statuses) if len(rounds) == count else None
    for current in rounds:
        if current.status != ROUND_RUNNING and f"round-{current.index}" not in posted:
            _add(session, fleet, f"fleet.round.{current.status}", f"round-{current.index}",
                 round=current.index, eval_loss=current.eval_loss,
                 simulated_wall_s=current.simulated_wall_s,
                 outcomes=[seat.outcome for seat in current.participants])
    if status in FLEET_ENDS:  # a round that does not load leaves the fleet's end unknown
        _add(session, fleet, f"fleet.{status}", END, status=status,
             rounds_done=sum(current.status == "done" for current in rounds),
             error=fleet.error)


def _add(session: Session, fleet: Fleet, event: str, fleet_event: str, **data) -> None:
    add_delivery(session, tenant=fleet.tenant, url=fleet.webhook_url, event=event,
                 fleet_id=fleet.id, fleet_event=fleet_event,
                 data={"id": fleet.id, "object": "fleet", **data})
