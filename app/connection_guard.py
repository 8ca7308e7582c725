"""The API's HTTP connections, bounded: uvicorn's h11 protocol with what a slow or idle client
may hold taken away from it.

- A request's headers must arrive whole within ``header_timeout_s`` of the connection opening
  (or of its first byte, on a kept-alive connection), and be at most ``max_header_bytes``:
  an idle socket, or one trickling its headers a byte at a time, is closed (408), a larger
  header is a 431.
- A request's body must keep arriving at ``body_min_bytes_per_s`` or faster after a grace of
  ``body_timeout_s`` (Apache's mod_reqtimeout ``body=T,MinRate=R``): each received byte
  moves the deadline on by ``1 / body_min_bytes_per_s`` s. Time the server itself is not
  reading (flow control paused it) does not count against the client.
- At most ``max_connections`` connections are open at once: beyond, a new one is answered 503
  and closed as it opens, so file descriptors never run out (when they did, every accept
  logged a traceback) and the service refuses rather than stalls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("mebp.connections")
REFUSAL_LOG_EVERY_S = 10.0
# descriptors kept for everything but client connections: the database pool, Redis, the
# workers' pipes, uploads being staged, files being served
RESERVED_DESCRIPTORS = 256
LINGER_S = 2.0  # after refusing a request, how long its client's bytes are read and dropped


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    body_min_bytes_per_s: float


def connection_limits(settings) -> ConnectionLimits:
    """The limits ``settings`` (``service.settings.Settings``) set."""
    return ConnectionLimits(**{name: getattr(settings, name)
                               for name in ConnectionLimits.__dataclass_fields__})


def raise_descriptor_limit(limits: ConnectionLimits) -> ConnectionLimits:
    """Lift this process's soft file-descriptor limit to its hard one; ``limits`` with
    ``max_connections`` lowered (and a warning) if even that leaves too few."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        soft = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    room = soft - RESERVED_DESCRIPTORS
    if limits.max_connections <= room:
        return limits
    allowed = max(room, 16)
    log.warning("MEBP_MAX_CONNECTIONS=%d is more than this process's file descriptors allow "
                "(%d, %d kept for the service itself): using %d", limits.max_connections, soft,
                RESERVED_DESCRIPTORS, allowed)
    return ConnectionLimits(**{**limits.__dict__, "max_connections": allowed})


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """The protocol class uvicorn makes one of per connection (``uvicorn.run(http=...)``)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class GuardedH11Protocol(H11Protocol):
    limits: ConnectionLimits
    _last_refusal_log = 0.0
    _refused_since_log = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._body_deadline_at = 0.0
        self._head_bytes, self._head_tail = 0, b""  # the head so far, its last 3 bytes
        self._lingering = False
        if len(self.connections) > self.limits.max_connections:
            self._refuse_connection()
            return
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        state = self.conn.their_state
        if state is h11.IDLE:  # a request's head is due (h11 reads what follows a body)
            if self._deadline is None:
                self._arm_header_deadline()  # a kept-alive connection's next request began
            if not self._head_within_bound(data):
                return
        elif state is h11.SEND_BODY and self._body_deadline_at:
            self._body_deadline_at += len(data) / self.limits.body_min_bytes_per_s
        super().data_received(data)

    def handle_events(self) -> None:
        """After each parse, from new data or from a response ending (a pipelined request
        waits in h11's buffer until then): a new request's head within bounds, and the
        deadline of where the request now is."""
        cycle = self.cycle
        super().handle_events()
        if self._lingering or self.transport.is_closing():
            return
        if self.cycle is not cycle and not self._headers_within_bound():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if not self._body_deadline_at:
                self._disarm()
                self._body_deadline_at = self.loop.time() + self.limits.body_timeout_s
                self._deadline = self.loop.call_at(self._body_deadline_at, self._body_late)
        elif state is h11.IDLE:
            if self.conn.trailing_data[0] and self._deadline is None:
                self._arm_header_deadline()  # a pipelined request's head, begun
        else:
            self._disarm()

    def _headers_within_bound(self) -> bool:
        """A parsed request's headers, measured (one pipelined behind another escapes the
        count of raw bytes below)."""
        size = sum(len(name) + len(value) + 4 for name, value in self.headers or ())
        if size <= self.limits.max_header_bytes:
            return True
        self._refuse_headers()
        return False

    def _head_within_bound(self, data: bytes) -> bool:
        """Count the head's bytes up to its blank line, before h11 parses them (h11 bounds
        only a head still incomplete, and a whole 100 kB head arrives in one read)."""
        window = self._head_tail + data
        end = window.find(b"\r\n\r\n")
        size = self._head_bytes - len(self._head_tail) + (len(window) if end < 0 else end + 4)
        if size > self.limits.max_header_bytes:
            self._refuse_headers()
            return False
        self._head_bytes, self._head_tail = (size, window[-3:]) if end < 0 else (0, b"")
        return True

    def _refuse_headers(self) -> None:
        self._answer_and_close(431, "Request Header Fields Too Large", "the request's headers "
                               f"are larger than {self.limits.max_header_bytes} bytes "
                               "(MEBP_MAX_HEADER_BYTES)")

    def _arm_header_deadline(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._body_deadline_at = None, 0.0

    def _headers_late(self) -> None:
        self._deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is under way (its next request's head came early): let it be
        self._answer_and_close(408, "Request Timeout", "the request's headers did not arrive "
                               f"within {self.limits.header_timeout_s:g} s "
                               "(MEBP_HEADER_TIMEOUT_S)")

    def _body_late(self) -> None:
        now = self.loop.time()
        if self.flow.read_paused or self.cycle.waiting_for_100_continue:
            # the server is not reading yet, or the client waits for its go: not its delay
            self._body_deadline_at = max(self._body_deadline_at, now + self.limits.body_timeout_s)
        if now < self._body_deadline_at:
            self._deadline = self.loop.call_at(self._body_deadline_at, self._body_late)
            return
        self._deadline, self._body_deadline_at = None, 0.0
        self._answer_and_close(408, "Request Timeout", "the request's body arrived slower "
                               f"than {self.limits.body_min_bytes_per_s:g} bytes/s after "
                               f"{self.limits.body_timeout_s:g} s (MEBP_BODY_TIMEOUT_S, "
                               "MEBP_BODY_MIN_BYTES_PER_S)")

    def _answer_and_close(self, status: int, reason: str, detail: str) -> None:
        """Answer with ``status`` unless this request's response has begun, then close; an
        application still reading the request sees the client disconnect (and its answer
        goes nowhere)."""
        cycle = self.cycle
        answered = cycle is not None and cycle.response_started and \
            not (cycle.response_complete and self.conn.their_state is h11.IDLE)
        if not answered:
            body = json.dumps({"detail": detail}).encode()
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                                 % (status, reason.encode(), len(body), body))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self._linger()

    def _linger(self) -> None:
        """Close as a lingering close does: the answer and a FIN now, what the client still
        sends read and dropped for a moment, then the socket closed. Closed at once with its
        bytes unread, the kernel would answer them with a reset, which can destroy the
        answer before the client reads it."""
        self._disarm()
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def _refuse_connection(self) -> None:
        cls = type(self)
        cls._refused_since_log += 1
        now = time.monotonic()
        if now - cls._last_refusal_log >= REFUSAL_LOG_EVERY_S:
            log.warning("%d connection(s) refused: %d open, the most this process takes "
                        "(MEBP_MAX_CONNECTIONS)", cls._refused_since_log,
                        len(self.connections) - 1)
            cls._last_refusal_log, cls._refused_since_log = now, 0
        self._answer_and_close(503, "Service Unavailable", "too many open connections; "
                               "retry shortly")
