"""Signing the dashboard in with the API key, once per browser session."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse

from app.api.deps import SESSION_COOKIE, SettingsDep, has_session, session_token
from app.web.templating import templates

router = APIRouter(include_in_schema=False)


class SignInRequired(Exception):
    """Raised by pages without a session; the app answers with a redirect to /signin."""


def require_session(request: Request, settings: SettingsDep) -> None:
    if not has_session(request, settings):
        raise SignInRequired


SessionRequired = Depends(require_session)


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "signin.html", {"error": None})


@router.post("/signin", response_class=HTMLResponse)
def signin(request: Request, settings: SettingsDep,
           api_key: Annotated[str, Form()]) -> HTMLResponse:
    if not hmac.compare_digest(api_key.strip().encode(), settings.api_key.encode()):
        return templates.TemplateResponse(request, "signin.html",
                                          {"error": "That is not this service's API key."},
                                          status_code=status.HTTP_401_UNAUTHORIZED)
    response = RedirectResponse("/explorer", status_code=status.HTTP_303_SEE_OTHER)
    # no max-age: the cookie ends with the browser session
    response.set_cookie(SESSION_COOKIE, session_token(settings), httponly=True,
                        samesite="strict")
    return response


@router.post("/signout")
def signout() -> RedirectResponse:
    response = RedirectResponse("/signin", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(SESSION_COOKIE)
    return response
