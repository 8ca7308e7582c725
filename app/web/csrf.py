"""Cross-site request forgery: every dashboard form must come from this service's own pages.
SameSite=Strict alone does not separate the ports of one host, so a POST must also name this
origin (Origin, else Referer) and, once signed in, carry the session's token."""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request, status

from app.sessions import CSRF_FIELD, SESSION_COOKIE, csrf_token

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:  # a port that is not a number
        return None
    if not parts.scheme or not parts.hostname or port is None:
        return None
    return parts.scheme.lower(), parts.hostname.lower(), port


def require_same_origin(request: Request) -> None:
    """403 unless the browser says the form was posted from this service's own origin."""
    claimed = request.headers.get("origin") or request.headers.get("referer")
    own = _origin(f"{request.url.scheme}://{request.headers.get('host', '')}")
    if claimed is None or own is None or _origin(claimed) != own:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            "refused: the form was not posted from this service's pages "
                            f"(origin {claimed or 'missing'})")


async def require_form_token(request: Request) -> None:
    """The origin check, and the hidden token of the signed-in session's pages."""
    require_same_origin(request)
    session_id = request.cookies.get(SESSION_COOKIE, "")
    token = (await request.form()).get(CSRF_FIELD)
    if not session_id or not isinstance(token, str) or \
            not hmac.compare_digest(token.encode(), csrf_token(session_id).encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            "refused: the form's token is missing or stale; reload the page")


SameOrigin = Depends(require_same_origin)
FormToken = Depends(require_form_token)
