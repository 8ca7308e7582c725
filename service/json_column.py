"""JSON columns that hold pydantic models: dumped on write, validated on load, so readers use
attributes rather than key lookups. A row that does not validate (hand-edited, or written by
code that renamed a key) is a ``MalformedRowError`` naming its table, its primary key and the
field, raised as the row is loaded, not later where a key is missing.

The stored models ignore keys they do not know (``extra="ignore"``; the API's request models
forbid them): on a database shared mid rolling-upgrade, an older process loads a row a newer
one wrote with a key added (and drops that key if it writes the row back)."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import JSON, Select, event, inspect
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeDecorator

log = logging.getLogger("mebp.rows")


class MalformedRowError(ValueError):
    """A stored JSON column that does not validate against its model."""


class ModelJSON(TypeDecorator):
    """A JSON column of ``schema`` (a pydantic model, or a type such as ``list[Model]``);
    rows written with fewer keys load with the model's defaults."""

    impl = JSON
    cache_ok = True

    def __init__(self, schema: Any) -> None:
        super().__init__()
        self.schema = schema
        self._adapter = TypeAdapter(schema)

    def process_bind_param(self, value: Any, dialect) -> Any:
        if value is None:
            return None
        return self._adapter.dump_python(self._adapter.validate_python(value), mode="json")

    def process_result_value(self, value: Any, dialect) -> Any:
        if value is None:
            return None
        try:
            return self._adapter.validate_python(value)
        except ValidationError as exc:
            return Malformed(exc)  # raised by ``check_on_load``, which knows the row


class Malformed:
    """What a column that did not validate loads as, until its row's load event raises."""

    def __init__(self, error: ValidationError) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        raise MalformedRowError(describe(self.error))


def describe(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(the value)'}: {e['msg']}"
                     for e in error.errors()[:5])


def check_on_load(model: type) -> type:
    """A decorator for a table model: loading (or refreshing) one of its rows whose model
    JSON column does not validate raises ``MalformedRowError`` naming the row."""
    columns = [column.key for column in model.__table__.columns
               if isinstance(column.type, ModelJSON)]

    def check(target: Any, *_: Any) -> None:
        for key in columns:
            value = target.__dict__.get(key)
            if isinstance(value, Malformed):
                state = inspect(target)
                where = ", ".join(f"{column.key}={value!r}" for column, value in zip(
                    state.mapper.primary_key, state.identity or (), strict=False))
                raise MalformedRowError(f"{model.__tablename__} row {where}: its stored "
                                        f"{key} does not validate: {describe(value.error)}")

    event.listen(model, "load", check)
    event.listen(model, "refresh", check)
    return model


def rows_that_load(session: Session, statement: Select) -> list[Any]:
    """The rows ``statement`` (a select of one table model) finds, less those that do not
    validate, each logged naming it and why: a loop over rows goes on past a bad one. The
    query runs once; only when a row fails are the rows loaded one by one."""
    try:
        return list(session.scalars(statement).all())
    except MalformedRowError:
        pass
    model = statement.column_descriptions[0]["entity"]
    keys = session.execute(statement.with_only_columns(*inspect(model).primary_key)).all()
    rows = []
    for key in keys:
        try:  # populate_existing: a row the failed query left half-loaded is read again
            rows.append(session.get(model, tuple(key), populate_existing=True))
        except MalformedRowError as exc:
            log.warning("skipped: %s", exc)
    return rows
