"""Request dependencies: the API key check and the settings of the running app."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


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
