"""Errors shaped like FastAPI's own 422s, so every refusal names the field at fault."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
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
