"""``RefuseNulInUrl``: NUL characters in a path or query, and path segments longer than any
id, never reach a route.

PostgreSQL cannot store or compare text holding NUL (it raises instead of finding nothing),
SQLite can: so a URL is refused here, the same on every database. No resource has a NUL in
its id (404); a query parameter holding one is a 422 naming it, like any invalid field. No
id or name is longer than MAX_PATH_SEGMENT_CHARS either: a longer segment is a 404 before
any route, key check or database sees it.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

MAX_PATH_SEGMENT_CHARS = 256  # the longest id or name a body may give (app/schemas.py)


class RefuseNulInUrl:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if "\x00" in scope["path"]:
            return await JSONResponse({"detail": "no such resource: the path holds a NUL "
                                                 "character"}, 404)(scope, receive, send)
        if any(len(part) > MAX_PATH_SEGMENT_CHARS for part in scope["path"].split("/")):
            return await JSONResponse({"detail": "no such resource: a part of the path is "
                                                 f"longer than {MAX_PATH_SEGMENT_CHARS} "
                                                 "characters"}, 404)(scope, receive, send)
        query = scope.get("query_string", b"").decode("latin-1")
        bad = [name for name, value in parse_qsl(query, keep_blank_values=True)
               if "\x00" in name or "\x00" in value]
        if bad:
            return await JSONResponse({"detail": [{
                "type": "value_error", "loc": ["query", bad[0].replace("\x00", "\\x00")],
                "msg": "must not contain NUL characters"}]}, 422)(scope, receive, send)
        return await self.app(scope, receive, send)
