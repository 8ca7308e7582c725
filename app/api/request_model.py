"""``RequestModel``: the base of every request body, so what a client may send is refused the
same way on every route and every database: unknown fields, non-finite numbers (``NaN``,
``Infinity``, ``1e999``), booleans where a number is asked for (``"steps": true``) and NUL
characters (which PostgreSQL cannot store) are 422s naming the field."""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

MAX_DEPTH = 32


class RequestModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_values(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, bool) and not _takes_bool(cls.model_fields[info.field_name]
                                                       .annotation):
            raise ValueError("must be a number or a string, not true or false")
        problem = _find_nul(value, MAX_DEPTH)
        if problem:
            raise ValueError(problem)
        return value


def _takes_bool(annotation: object) -> bool:
    if annotation is bool:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_bool(arg) for arg in typing.get_args(annotation))
    return False


def _find_nul(value: object, depth: int) -> str | None:
    """What is wrong with ``value``'s strings, looked at ``depth`` levels down."""
    if isinstance(value, str):
        return "must not contain NUL characters" if "\x00" in value else None
    if not isinstance(value, dict | list | tuple):
        return None
    if depth == 0:
        return f"nested more than {MAX_DEPTH} levels deep"
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    return next((found for item in items if (found := _find_nul(item, depth - 1))), None)
