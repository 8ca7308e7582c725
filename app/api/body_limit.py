"""Request bodies are capped by FastAPI's ``max_body_size``: the app's limit,
``max_request_bytes``, covers every body; the routers that take dataset uploads are included
with ``max_upload_bytes`` plus the multipart framing (their gzip is measured again after
decompression, by ``app.uploads``). A body is counted as it arrives and refused with a 413
once past its route's limit, without the rest being read; a declared ``Content-Length`` over
it is refused before a byte is read, by Starlette itself, with a bare "Content Too Large" in
place of whatever the route answers (no handler sees that one). ``BodyLimits`` holds the two
limits and names the one a counted body went past, and the setting that sets it."""

from __future__ import annotations

from fastapi import HTTPException, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import Response
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY, _RequestBodyTooLarge

from app.uploads import MULTIPART_OVERHEAD_BYTES
from service.settings import Settings


class BodyLimits:
    def __init__(self, settings: Settings) -> None:
        self.request_bytes = settings.max_request_bytes
        self.upload_bytes = settings.max_upload_bytes + MULTIPART_OVERHEAD_BYTES
        self._settings = {self.request_bytes: "MEBP_MAX_REQUEST_BYTES",
                          self.upload_bytes: "MEBP_MAX_UPLOAD_BYTES"}

    async def handle(self, request: Request, exc: HTTPException) -> Response:
        """The 413s: Starlette's (a body went past its route's limit) with the limit named;
        the routes' own as they are."""
        if isinstance(exc, _RequestBodyTooLarge):  # Starlette has no public name for it
            limit = request.scope[MAX_BODY_SIZE_SCOPE_KEY]  # the route's, set by FastAPI
            exc = HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                                f"the request body is larger than the limit of {limit} bytes "
                                f"({self._settings[limit]})")
        return await http_exception_handler(request, exc)
