"""``RefuseNulInUrl``: NUL characters in a path or query never reach a route.

PostgreSQL cannot store or compare text holding NUL (it raises instead of finding nothing),
SQLite can: so a URL is refused here, the same on every database. No resource has a NUL in
its id (404); a query parameter holding one is a 422 naming it, like any invalid field.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send


class RefuseNulInUrl:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if "\x00" in scope["path"]:
            return await _answer(send, 404, {"detail": "no such resource: the path holds a "
                                                       "NUL character"})
        query = scope.get("query_string", b"").decode("latin-1")
        bad = [name for name, value in parse_qsl(query, keep_blank_values=True)
               if "\x00" in name or "\x00" in value]
        if bad:
            return await _answer(send, 422, {"detail": [{
                "type": "value_error", "loc": ["query", bad[0].replace("\x00", "\\x00")],
                "msg": "must not contain NUL characters"}]})
        return await self.app(scope, receive, send)


async def _answer(send: Send, status: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
