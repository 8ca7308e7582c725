"""Request dependencies: who is asking (an API key, or a signed-in dashboard), the settings
and a database session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session

from app.keys import Principal, hash_key, principal_for_hash
from app.sessions import SESSION_COOKIE, principal_for_session
from service.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_SAFE_METHODS = {"GET", "HEAD"}


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session within the pool's capacity (app/api/request_sessions.py); async, so its
    closing runs on the event loop rather than waiting for a thread."""
    async for session in request.app.state.session_slots.session():
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]


def session_principal(request: Request, session: Session) -> Principal | None:
    """Who the dashboard's cookie signs in (app/sessions.py), if anyone."""
    return principal_for_session(session, request.cookies.get(SESSION_COOKIE, ""))


def require_api_key(
    request: Request, session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """401 unless the request carries a known key as a bearer token, or is a read by a
    signed-in dashboard (API writes always need the key; the dashboard's own forms post with
    its cookie and are checked for their origin and token, app/web/csrf.py)."""
    principal = None
    if credentials is not None:
        principal = principal_for_hash(session, hash_key(credentials.credentials))
    elif request.method in _SAFE_METHODS:
        principal = session_principal(request, session)
    # end the lookup's transaction: a request waiting for a thread to run its route must not
    # hold a pooled connection (a burst of such requests would starve the pool for good)
    session.commit()
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid API key",
                            headers={"WWW-Authenticate": "Bearer"})
    return principal


PrincipalDep = Annotated[Principal, Depends(require_api_key)]
# set only when the request carried a key (valid, or require_api_key answered 401): what a
# route that must not act on a signed-in browser's cookie alone checks
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this needs an admin key")
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]
