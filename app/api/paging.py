"""Pages of a job's rows, by keyset: ``?after=<the last cursor read>&limit=<rows>``. A page
with more rows after it names the next one in an RFC 8288 ``Link: <url>; rel="next"``
header (and a body may repeat it); the last page has none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Query, Request, Response
from sqlalchemy import and_, or_
from sqlmodel import Session, col, select

from app.api.errors import invalid
from app.api.events import MAX_ID

DEFAULT_ROWS = 1000
MAX_ROWS = 10_000
Row = TypeVar("Row")

Limit = Annotated[int, Query(ge=1, le=MAX_ROWS,
                             description=f"rows per page (at most {MAX_ROWS})")]
MAX_LISTED = 100  # OpenAI's own bound on a list's limit
ListLimit = Annotated[int, Query(ge=1, le=MAX_LISTED,
                                 description=f"rows per page (at most {MAX_LISTED})")]
IdCursor = Annotated[str | None, Query(max_length=64, description=(
    "the last id of the page before; unset, from the newest"))]


def after_query(cursor: str) -> object:
    """The ``after`` parameter: rows after this ``cursor`` (a step, an id); unset, the first."""
    return Query(None, ge=0, le=MAX_ID, description=f"the rows after this {cursor}, as the "
                 "previous page's Link header names it; unset, from the first")


def page_of(rows: list[Row], limit: int, request: Request, response: Response,
            cursor: Callable[[Row], int]) -> tuple[list[Row], str | None]:
    """``rows``, read with a limit of ``limit + 1``: the page's rows and, when more follow,
    the next page's URL, also set as the response's ``Link`` header."""
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    url = str(request.url.include_query_params(after=cursor(rows[-1]), limit=limit))
    response.headers["Link"] = f'<{url}>; rel="next"'
    return rows, url


def newest_first(session: Session, table: type[Row], *, tenant: str, after: str | None,
                 limit: int) -> tuple[list[Row], bool]:
    """A page of the tenant's rows of ``table`` (with ``id``, ``tenant`` and ``created_at``),
    newest first, after the row with id ``after`` (a 422 if it is not the tenant's); and
    whether more follow."""
    query = select(table).where(table.tenant == tenant)
    if after is not None:
        cursor = session.get(table, after)
        if cursor is None or cursor.tenant != tenant:
            raise invalid("after", "no such id", after, where="query")
        query = query.where(or_(table.created_at < cursor.created_at,
                                and_(table.created_at == cursor.created_at,
                                     col(table.id) < cursor.id)))
    rows = list(session.exec(query.order_by(col(table.created_at).desc(),
                                            col(table.id).desc()).limit(limit + 1)).all())
    return rows[:limit], len(rows) > limit
