"""URL guards. ``RefuseNulInUrl``: NUL characters in a path or query, and path segments
longer than any id, never reach a route. ``check_webhook_url``: a URL a request gives the
service to call (a webhook) is one the sender can send to, not the service itself, and not
a private address given literally (unless ``webhook_allow_private``; the sender checks what
a name resolves to at every attempt).

PostgreSQL cannot store or compare text holding NUL (it raises instead of finding nothing),
SQLite can: so a URL is refused here, the same on every database. No resource has a NUL in
its id (404); a query parameter holding one is a 422 naming it, like any invalid field. No
id or name is longer than MAX_PATH_SEGMENT_CHARS either: a longer segment is a 404 before
any route, key check or database sees it.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import parse_qsl, urlsplit

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.errors import invalid
from app.api.openai_errors import error_response, in_openai_shape
from service.settings import Settings
from service.webhooks import is_private_address

MAX_PATH_SEGMENT_CHARS = 256  # the longest id or name a body may give (app/common_schemas.py)
DEFAULT_PORTS = {"http": 80, "https": 443}
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class RefuseNulInUrl:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if "\x00" in path:
            return await _refusal(path, 404, "no such resource: the path holds a NUL "
                                  "character")(scope, receive, send)
        if any(len(part) > MAX_PATH_SEGMENT_CHARS for part in path.split("/")):
            return await _refusal(path, 404, "no such resource: a part of the path is longer "
                                  f"than {MAX_PATH_SEGMENT_CHARS} characters")(
                scope, receive, send)
        query = scope.get("query_string", b"").decode("latin-1")
        bad = [name for name, value in parse_qsl(query, keep_blank_values=True)
               if "\x00" in name or "\x00" in value]
        if bad:
            return await _refusal(path, 422, "must not contain NUL characters",
                                  bad[0].replace("\x00", "\\x00"))(scope, receive, send)
        return await self.app(scope, receive, send)


def _refusal(path: str, status_code: int, message: str,
             query_field: str | None = None) -> JSONResponse:
    """The refusal in the shape of the surface ``path`` belongs to: mebp's or OpenAI's."""
    if in_openai_shape(path):
        return error_response(status_code, message if query_field is None
                              else f"{query_field}: {message}", param=query_field,
                              code=None if query_field is None else "value_error")
    if query_field is None:
        return JSONResponse({"detail": message}, status_code)
    return JSONResponse({"detail": [{"type": "value_error", "loc": ["query", query_field],
                                     "msg": message}]}, status_code)


def check_webhook_url(url: object | None, request: Request, settings: Settings, *,
                      field: str = "webhook_url") -> None:
    """A 422 naming ``field`` unless the sender can send to ``url`` (httpx encodes it: an
    emoji host is valid to the schema but not to IDNA), it is not this service, and it is
    not a loopback name or a private address literally unless private ones are allowed."""
    if url is None:
        return
    try:  # .host decodes the IDNA host as httpx does before it connects
        httpx.URL(str(url)).host  # noqa: B018
    except (httpx.InvalidURL, UnicodeError, ValueError):
        raise invalid(field, "must be a URL that can be sent to (its host does not encode "
                      "as IDNA)", str(url)) from None
    refuse_own_address(url, request, settings, field=field)
    host = (urlsplit(str(url)).hostname or "").lower().rstrip(".")
    address = _address(host)
    if not settings.webhook_allow_private and (
            host in LOCAL_NAMES or (address is not None and is_private_address(address))):
        raise invalid(field, "must not be a private, loopback or link-local address",
                      str(url))


def refuse_own_address(url: object | None, request: Request, settings: Settings, *,
                       field: str = "webhook_url") -> None:
    """A 422 naming ``field`` when ``url`` points at this service: the host and port this
    request reached it by, or the port it listens on at an address of this machine (a
    loopback or unspecified address, its host name, the address it is bound to)."""
    if url is None:
        return
    parts = urlsplit(str(url))
    host = (parts.hostname or "").lower().rstrip(".")
    port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    reached = ((request.url.hostname or "").lower().rstrip("."),
               request.url.port or DEFAULT_PORTS.get(request.url.scheme))
    if (host, port) == reached or (port == settings.port and _this_machine(host, settings.host)):
        raise invalid(field, "must not point at this service itself", str(url))


def _this_machine(host: str, bound: str) -> bool:
    if host in LOCAL_NAMES or host in (bound.lower(), socket.gethostname().lower()):
        return True
    address = _address(host)
    return address is not None and (address.is_loopback or address.is_unspecified
                                    or address == _address(bound))


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address if it is one, in any form a resolver takes (``127.1``)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return mapped or address
