"""Request dependencies: who is asking (an API key, or a signed-in dashboard), the settings
and a database session."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session

from app.keys import Principal, hash_key, principal_for_hash
from app.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
SESSION_COOKIE = "mebp_session"
_SAFE_METHODS = {"GET", "HEAD"}


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]


def _session_signature(settings: Settings, key_hash: str) -> str:
    secret = hashlib.sha256(b"mebp-dashboard-session:" + settings.api_key.encode()).digest()
    return hmac.new(secret, key_hash.encode(), "sha256").hexdigest()


def session_cookie(settings: Settings, key: str) -> str:
    """The dashboard's cookie for ``key``: its hash, signed, so the key itself never sits in
    the browser and a deleted key signs nobody in."""
    key_hash = hash_key(key)
    return f"{key_hash}.{_session_signature(settings, key_hash)}"


def session_principal(request: Request, settings: Settings,
                      session: Session) -> Principal | None:
    key_hash, _, signature = request.cookies.get(SESSION_COOKIE, "").partition(".")
    if not key_hash or not hmac.compare_digest(signature.encode(),
                                               _session_signature(settings, key_hash).encode()):
        return None
    return principal_for_hash(session, key_hash)


def require_api_key(
    request: Request, settings: SettingsDep, session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """401 unless the request carries a known key as a bearer token, or is a read by a
    signed-in dashboard (API writes always need the key; the dashboard's own forms post with
    its cookie, which is SameSite=Strict)."""
    if credentials is not None:
        principal = principal_for_hash(session, hash_key(credentials.credentials))
        if principal is not None:
            return principal
    elif request.method in _SAFE_METHODS:
        principal = session_principal(request, settings, session)
        if principal is not None:
            return principal
    raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid API key",
                        headers={"WWW-Authenticate": "Bearer"})


PrincipalDep = Annotated[Principal, Depends(require_api_key)]


def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this needs an admin key")
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]
