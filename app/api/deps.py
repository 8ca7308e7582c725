"""Request dependencies: the API key check, the settings and a database session."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session

from app.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


SESSION_COOKIE = "mebp_session"
_SAFE_METHODS = {"GET", "HEAD"}


def session_token(settings: Settings) -> str:
    """The dashboard's session cookie: derived from the key, so the key itself never sits
    in the browser, and signing in again is needed once the key changes."""
    return hmac.new(settings.api_key.encode(), b"mebp-dashboard-session", "sha256").hexdigest()


def has_session(request: Request, settings: Settings) -> bool:
    cookie = request.cookies.get(SESSION_COOKIE)
    return cookie is not None and hmac.compare_digest(cookie.encode(),
                                                      session_token(settings).encode())


def require_api_key(
    request: Request,
    settings: Annotated[Settings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries the service's key as a bearer token, or is a read by
    a signed-in dashboard (its cookie is SameSite=Strict; writes always need the key)."""
    if credentials is not None and hmac.compare_digest(credentials.credentials.encode(),
                                                       settings.api_key.encode()):
        return
    if request.method in _SAFE_METHODS and has_session(request, settings):
        return
    raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid API key",
                        headers={"WWW-Authenticate": "Bearer"})


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]

# Until issue 7 brings tenants and their keys, everything belongs to the bootstrap key's.
DEFAULT_TENANT = "default"
