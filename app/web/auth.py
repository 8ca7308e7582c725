"""Signing the dashboard in with the API key: a server-side session per sign-in
(app/sessions.py) that ends at sign-out, when the key is revoked, or after its TTL."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse

from app.api.deps import SessionDep, SettingsDep, session_principal
from app.keys import Principal, hash_key, principal_for_hash
from app.sessions import SESSION_COOKIE, csrf_token, end_session, start_session
from app.web.csrf import FormToken, SameOrigin
from app.web.templating import templates

router = APIRouter(include_in_schema=False)


class SignInRequired(Exception):
    """Raised by pages without a session; the app answers with a redirect to /signin."""


def require_session(request: Request, session: SessionDep) -> Principal:
    principal = session_principal(request, session)
    session.commit()  # hold no pooled connection while the page waits for a thread
    if principal is None:
        raise SignInRequired
    # the pages' forms carry it (templates/base.html); app/web/csrf.py checks it
    request.state.csrf_token = csrf_token(request.cookies[SESSION_COOKIE])
    return principal


SessionRequired = Depends(require_session)
PagePrincipal = Annotated[Principal, SessionRequired]


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "signin.html", {"error": None})


@router.post("/signin", response_class=HTMLResponse, dependencies=[SameOrigin])
def signin(request: Request, settings: SettingsDep, session: SessionDep,
           api_key: Annotated[str, Form()]) -> HTMLResponse:
    principal = principal_for_hash(session, hash_key(api_key.strip()))
    if principal is None:
        return templates.TemplateResponse(request, "signin.html",
                                          {"error": "That is not this service's API key."},
                                          status_code=status.HTTP_401_UNAUTHORIZED)
    end_session(session, request.cookies.get(SESSION_COOKIE, ""))  # one at a time per browser
    session_id = start_session(session, principal, ttl_s=settings.session_ttl_s)
    response = RedirectResponse("/explorer", status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(SESSION_COOKIE, session_id, max_age=settings.session_ttl_s,
                        httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


@router.post("/signout", dependencies=[FormToken])
def signout(request: Request, session: SessionDep) -> RedirectResponse:
    end_session(session, request.cookies.get(SESSION_COOKIE, ""))
    response = RedirectResponse("/signin", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
    return response
