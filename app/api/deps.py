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


def require_api_key(
    settings: Annotated[Settings, Depends(get_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries the service's key as a bearer token."""
    if credentials is None or not hmac.compare_digest(credentials.credentials.encode(),
                                                      settings.api_key.encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid API key",
                            headers={"WWW-Authenticate": "Bearer"})


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]

# Until issue 7 brings tenants and their keys, everything belongs to the bootstrap key's.
DEFAULT_TENANT = "default"
