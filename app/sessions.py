"""Dashboard sessions: a random id per sign-in, in the browser's cookie; the database keeps
only its sha256, the tenant and key it acts for, and when it expires. Sign-out deletes the
row, revoking the key deletes its rows, and a row past ``expires_at`` signs nobody in."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from sqlmodel import Session, col, delete

from app.keys import Principal, principal_for_hash
from service.models import DashboardSession, utc_now

SESSION_COOKIE = "mebp_session"
CSRF_FIELD = "csrf_token"  # the hidden field every dashboard form posts


def _hash_session_id(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def start_session(session: Session, principal: Principal, *, ttl_s: int) -> str:
    """A new session for ``principal``; returns the id for the cookie (never stored)."""
    now = utc_now()
    session.exec(delete(DashboardSession).where(col(DashboardSession.expires_at) <= now))
    session_id = secrets.token_urlsafe(32)
    session.add(DashboardSession(id_hash=_hash_session_id(session_id), tenant=principal.tenant,
                                 key_hash=principal.key_hash, created_at=now,
                                 expires_at=now + timedelta(seconds=ttl_s)))
    session.commit()
    return session_id


def end_session(session: Session, session_id: str) -> None:
    session.exec(delete(DashboardSession)
                 .where(col(DashboardSession.id_hash) == _hash_session_id(session_id)))
    session.commit()


def principal_for_session(session: Session, session_id: str) -> Principal | None:
    """Who the session acts for: None once it expired, ended or its key was revoked."""
    if not session_id:
        return None
    row = session.get(DashboardSession, _hash_session_id(session_id))
    if row is None or row.expires_at <= utc_now():
        return None
    principal = principal_for_hash(session, row.key_hash)
    return principal if principal is not None and principal.tenant == row.tenant else None


def csrf_token(session_id: str) -> str:
    """The token a page's forms carry: derived from the HttpOnly cookie, so another site can
    neither read nor guess it, and it changes with every sign-in."""
    return hmac.new(session_id.encode(), b"mebp-dashboard-form", "sha256").hexdigest()
