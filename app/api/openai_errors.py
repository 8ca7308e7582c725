"""Refusals as OpenAI's API words them, ``{"error": {"message", "type", "param", "code"}}``,
for the routes of the OpenAI-compatible surface (``OpenAIRoute``): its SDKs pick their
exception by the status (422 ``UnprocessableEntityError``, 404 ``NotFoundError``, ...) and
read these fields. 5xx answers keep the service's own ``{"detail"}``, as every route's."""

from __future__ import annotations

from collections.abc import Callable, Coroutine

from fastapi import Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from app.api.errors import validation_errors

# where the OpenAI-compatible routes live (app/api/routes/openai_*.py): what refuses a
# request before routing (app/api/url_guard.py) answers these in OpenAI's shape too
OPENAI_ROOTS = ("/v1/files", "/v1/fine_tuning")


def in_openai_shape(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in OPENAI_ROOTS)


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, or authentication_error for a 401")
    param: str | None = Field(description="the field at fault, dotted, if one is")
    code: str | None = Field(description="a 422's first error type (e.g. extra_forbidden)")
    errors: list[dict] | None = Field(default=None, description=(
        "a 422's errors as mebp's own routes give them (loc, msg, input, and extras such "
        "as smallest_budget_mb)"))


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


class OpenAIRoute(APIRoute):
    """A route whose 4xx refusals, its dependencies' included, are ``OpenAIError`` bodies."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[None, None, Response]]:
        handle = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as exc:
                return unprocessable(exc)
            except HTTPException as exc:
                if exc.status_code >= 500:
                    raise
                return error_response(exc.status_code, str(exc.detail), "authentication_error"
                                      if exc.status_code == 401 else "invalid_request_error",
                                      headers=exc.headers)
        return answer


def unprocessable(exc: RequestValidationError) -> JSONResponse:
    errors = validation_errors(exc)
    params = [".".join(map(str, error["loc"][1:])) or None for error in errors]
    message = "; ".join(f"{param}: {error['msg']}" if param else error["msg"]
                        for param, error in zip(params, errors, strict=True))
    return error_response(status.HTTP_422_UNPROCESSABLE_CONTENT, message, param=params[0],
                          code=errors[0]["type"], errors=errors)


def error_response(status_code: int, message: str, kind: str = "invalid_request_error", *,
                   param: str | None = None, code: str | None = None,
                   errors: list[dict] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    detail = OpenAIErrorDetail(message=message, type=kind, param=param, code=code,
                               errors=errors)
    return JSONResponse(OpenAIError(error=detail).model_dump(mode="json"),
                        status_code=status_code, headers=headers)
