"""Errors shaped like FastAPI's own 422s, so every refusal names the field at fault."""

from __future__ import annotations

import math

from fastapi import Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError


def invalid(field: str | tuple[str, ...], message: str, value=None, *, where: str = "body",
            **extra) -> RequestValidationError:
    """A 422 naming ``<where>.<field>``; ``extra`` keys ride along in the error object."""
    loc = (where, *((field,) if isinstance(field, str) else field))
    return RequestValidationError([{"type": "value_error", "loc": loc, "msg": message,
                                    "input": value, **extra}])


def invalid_from(exc: ValidationError, prefix: tuple[str, ...] = (), *,
                 where: str = "body") -> RequestValidationError:
    """A pydantic error raised past the edge, re-rooted under ``<where>.<prefix>``."""
    error = exc.errors()[0]
    return invalid((*prefix, *map(str, error["loc"])),
                   error["msg"].removeprefix("Value error, "), error.get("input"), where=where)


MAX_ECHO_CHARS = 200
MAX_ECHO_ITEMS = 20


async def validation_error_response(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 body, with the offending input echoed JSON-safely: a non-finite number
    as its name (``"nan"``), long strings and containers cut short."""
    return JSONResponse({"detail": validation_errors(exc)},
                        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def validation_errors(exc: RequestValidationError) -> list[dict]:
    """The errors of ``exc``, JSON-safe, as a 422 body carries them."""
    return [{**error, "input": _echo(error["input"])} if "input" in error else error
            for error in jsonable_encoder(exc.errors(), custom_encoder={float: _finite})]


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _echo(value, depth: int = 4):
    if isinstance(value, str):
        return value if len(value) <= MAX_ECHO_CHARS else value[:MAX_ECHO_CHARS] + "…"
    if isinstance(value, float):
        return _finite(value)
    if depth == 0 and isinstance(value, dict | list):
        return "…"
    if isinstance(value, dict):
        return {_echo(k, 0): _echo(v, depth - 1)
                for k, v in list(value.items())[:MAX_ECHO_ITEMS]}
    if isinstance(value, list):
        return [_echo(item, depth - 1) for item in value[:MAX_ECHO_ITEMS]]
    return value
