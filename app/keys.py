"""API keys: generated, shown once, stored only as their sha256; each belongs to a tenant."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlmodel import Session, col, delete, select

from service.models import ApiKey, DashboardSession

BOOTSTRAP_TENANT = "default"
ADMIN, USER = "admin", "user"


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: every resource it makes or sees belongs to ``tenant``."""

    tenant: str
    admin: bool
    key_hash: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> str:
    return "mebp-" + secrets.token_urlsafe(24)


def create_key(session: Session, *, tenant: str, admin: bool = False) -> str:
    """A new key for ``tenant``; the caller shows it once, only its hash is kept."""
    key = generate_key()
    session.add(ApiKey(tenant=tenant, key_hash=hash_key(key), scopes=ADMIN if admin else USER))
    session.commit()
    return key


def revoke_keys(session: Session, *, tenant: str | None = None, key: str | None = None) -> int:
    """Delete ``key``, or every key of ``tenant``; how many went. Requests with them are
    401s from then on, and the dashboard sessions signed in with them end."""
    query = select(ApiKey)
    query = query.where(ApiKey.key_hash == hash_key(key)) if key is not None else \
        query.where(ApiKey.tenant == tenant)
    rows = session.exec(query).all()
    for row in rows:
        session.delete(row)
    session.exec(delete(DashboardSession).where(
        col(DashboardSession.key_hash).in_([row.key_hash for row in rows])))
    session.commit()
    return len(rows)


def ensure_bootstrap_key(session: Session, key: str) -> None:
    """`mebp serve`'s key: an admin of the default tenant."""
    if session.exec(select(ApiKey).where(ApiKey.key_hash == hash_key(key))).first() is None:
        session.add(ApiKey(tenant=BOOTSTRAP_TENANT, key_hash=hash_key(key), scopes=ADMIN))
        session.commit()


def principal_for_hash(session: Session, key_hash: str) -> Principal | None:
    row = session.exec(select(ApiKey).where(ApiKey.key_hash == key_hash)).first()
    return None if row is None else Principal(row.tenant, row.scopes == ADMIN, row.key_hash)
