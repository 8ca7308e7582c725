"""API keys: generated, shown once, stored only as their sha256; each belongs to a tenant."""

from __future__ import annotations

import hashlib
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from sqlmodel import Session, col, delete, select

from service.db import database_url, make_engine, upgrade_database
from service.models import ApiKey, DashboardSession
from service.settings import load_settings

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


def keys_command(action: str, *, tenant: str | None, key: str | None, admin: bool,
                 data_dir: Path | None) -> int:
    """``mebp keys create`` prints a new key once (only its hash is kept); ``mebp keys
    revoke`` deletes one key or a tenant's keys."""
    settings = load_settings(data_dir=data_dir)
    url = database_url(settings.database_url, settings.data_dir)
    upgrade_database(url)
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            if action == "create":
                print(create_key(session, tenant=tenant, admin=admin))
                return 0
            revoked = revoke_keys(session, tenant=tenant, key=key)
    finally:
        engine.dispose()
    print(f"mebp: revoked {revoked} key(s)", file=sys.stderr)
    return 0 if revoked else 1
