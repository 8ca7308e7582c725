"""Signing the dashboard in with the API key, once per browser session."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse

from app.api.deps import (
    SESSION_COOKIE,
    SessionDep,
    SettingsDep,
    session_cookie,
    session_principal,
)
from app.keys import Principal, hash_key, principal_for_hash
from app.web.templating import templates

router = APIRouter(include_in_schema=False)


class SignInRequired(Exception):
    """Raised by pages without a session; the app answers with a redirect to /signin."""


def require_session(request: Request, settings: SettingsDep, session: SessionDep) -> Principal:
    principal = session_principal(request, settings, session)
    if principal is None:
        raise SignInRequired
    return principal


SessionRequired = Depends(require_session)
PagePrincipal = Annotated[Principal, SessionRequired]


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "signin.html", {"error": None})


@router.post("/signin", response_class=HTMLResponse)
def signin(request: Request, settings: SettingsDep, session: SessionDep,
           api_key: Annotated[str, Form()]) -> HTMLResponse:
    if principal_for_hash(session, hash_key(api_key.strip())) is None:
        return templates.TemplateResponse(request, "signin.html",
                                          {"error": "That is not this service's API key."},
                                          status_code=status.HTTP_401_UNAUTHORIZED)
    response = RedirectResponse("/explorer", status_code=status.HTTP_303_SEE_OTHER)
    # no max-age: the cookie ends with the browser session
    response.set_cookie(SESSION_COOKIE, session_cookie(settings, api_key.strip()), httponly=True,
                        samesite="strict")
    return response


@router.post("/signout")
def signout() -> RedirectResponse:
    response = RedirectResponse("/signin", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(SESSION_COOKIE)
    return response
