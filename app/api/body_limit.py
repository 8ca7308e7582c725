"""``BodyLimit``: every request body is capped before anything reads it, authentication
included: a declared ``Content-Length`` over the cap is a 413 at once, and a body of unknown
length is counted as it arrives and cut off with a 413 once past the cap. JSON and form
bodies get ``max_request_bytes``; dataset uploads ``max_upload_bytes`` plus the multipart
framing (their gzip is measured again after decompression, by ``app.uploads``)."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.uploads import MULTIPART_OVERHEAD_BYTES
from service.settings import Settings

UPLOAD_ROUTES = {("POST", "/v1/datasets"), ("POST", "/jobs/new")}  # the dashboard's form too


class BodyLimit:
    def __init__(self, app: ASGIApp, *, settings: Settings) -> None:
        self.app = app
        self.request_bytes = settings.max_request_bytes
        self.upload_bytes = settings.max_upload_bytes + MULTIPART_OVERHEAD_BYTES

    def limit_for(self, scope: Scope) -> tuple[int, str]:
        if (scope["method"], scope["path"]) in UPLOAD_ROUTES:
            return self.upload_bytes, "MEBP_MAX_UPLOAD_BYTES"
        return self.request_bytes, "MEBP_MAX_REQUEST_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self.limit_for(scope)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _too_large(limit, setting)(scope, receive, send)
            return
        received = 0
        started = answered = False  # the app's response began; the 413 was sent instead

        async def capped_receive() -> Message:
            nonlocal received, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if not started:
                        await _too_large(limit, setting)(scope, receive, send)
                        answered = True
                    return {"type": "http.disconnect"}  # the app stops reading here
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return  # the 413 is the answer; what the app makes of the cut is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped_receive, guarded_send)
        except Exception:
            if not answered:
                raise


def _too_large(limit: int, setting: str) -> JSONResponse:
    return JSONResponse({"detail": f"the request body is larger than the limit of {limit} "
                                   f"bytes ({setting})"}, 413)
