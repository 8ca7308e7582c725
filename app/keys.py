"""API keys: generated, shown once, stored only as their sha256 (and a short prefix to tell
them apart in a listing); each belongs to a tenant and may expire. `mebp serve`'s own key is
``MEBP_API_KEY``, else the one it made on its first start, kept in the data dir for its
owner alone."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, col, delete, select, update

from service.db import database_url, make_engine, upgrade_database
from service.models import ApiKey, DashboardSession, utc_now
from service.settings import Settings, load_settings

log = logging.getLogger("mebp.keys")
BOOTSTRAP_TENANT = "default"
ADMIN, USER = "admin", "user"
KEY_FILE = "api-key"  # in the data dir: the key `mebp serve` made, owner-only
PREFIX_CHARS = 12  # "mebp-" and 7 random characters: enough to tell keys apart, not to use
KEY_USE_RESOLUTION_S = 60  # a key's last use is written at most once a minute


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


def create_key(session: Session, *, tenant: str, admin: bool = False,
               expires_in: timedelta | None = None) -> str:
    """A new key for ``tenant``, valid until revoked or for ``expires_in``; the caller shows
    it once, only its hash is kept."""
    key = generate_key()
    session.add(ApiKey(tenant=tenant, key_hash=hash_key(key), scopes=ADMIN if admin else USER,
                       prefix=key[:PREFIX_CHARS],
                       expires_at=None if expires_in is None else utc_now() + expires_in))
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
        session.add(ApiKey(tenant=BOOTSTRAP_TENANT, key_hash=hash_key(key), scopes=ADMIN,
                           prefix=key[:PREFIX_CHARS]))
        session.commit()


def bootstrap_key(settings: Settings) -> tuple[str, str]:
    """`mebp serve`'s key and where it came from: ``MEBP_API_KEY``; else the key a start
    made before (the data dir's ``api-key``), so a restart mints no new admin key; else a
    new one, kept there readable by its owner alone."""
    if settings.api_key is not None:
        return settings.api_key, "MEBP_API_KEY"
    path = settings.data_dir / KEY_FILE
    if not path.exists():
        _keep_new_key(path)  # two starts at once keep one key: the first link wins
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    key = path.read_text().strip()
    if len(key) < 8:
        raise SystemExit(f"mebp: {path} does not hold a key; remove it to make a new one")
    return key, str(path)


def _keep_new_key(path: Path) -> None:
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(generate_key() + "\n")
        file.flush()
        os.fsync(file.fileno())
    try:
        os.link(staged, path)
    except FileExistsError:
        pass
    finally:
        staged.unlink()


def principal_for_hash(session: Session, key_hash: str) -> Principal | None:
    """Who a key acts for: None for an unknown, revoked or expired key. Its last use is
    written at most once a minute, and only if the database can: a read must not fail
    because the database's disk is full or busy."""
    row = session.exec(select(ApiKey).where(ApiKey.key_hash == key_hash)).first()
    now = utc_now()
    if row is None or (row.expires_at is not None and row.expires_at <= now):
        return None
    principal = Principal(row.tenant, row.scopes == ADMIN, row.key_hash)
    key_id, prefix = row.id, row.prefix  # read before a commit or rollback expires the row
    if row.last_used_at is None or \
            now - row.last_used_at >= timedelta(seconds=KEY_USE_RESOLUTION_S):
        try:
            session.exec(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=now))
            session.commit()
        except DBAPIError as exc:  # full, busy, or read-only
            session.rollback()
            log.warning("the last use of key %s... was not recorded: %s", prefix, exc)
    return principal


def describe_keys(session: Session, tenant: str | None = None) -> list[dict[str, str]]:
    """Every key (or ``tenant``'s) as ``mebp keys list`` shows it, never the key itself."""
    query = select(ApiKey).order_by(ApiKey.tenant, ApiKey.created_at)
    if tenant is not None:
        query = query.where(ApiKey.tenant == tenant)
    return [{"prefix": (row.prefix or "?") + "...", "tenant": row.tenant,
             "admin": "yes" if row.scopes == ADMIN else "no",
             "created": _minute(row.created_at), "expires": _minute(row.expires_at, "never"),
             "last used": _minute(row.last_used_at, "never")}
            for row in session.exec(query)]


def _minute(moment, missing: str = "") -> str:
    return missing if moment is None else moment.strftime("%Y-%m-%d %H:%M UTC")


def keys_command(action: str, *, tenant: str | None, key: str | None, admin: bool,
                 expires_in: timedelta | None, data_dir: Path | None) -> int:
    """``mebp keys create`` prints a new key once (only its hash is kept); ``mebp keys
    revoke`` deletes one key or a tenant's keys; ``mebp keys list`` shows them."""
    settings = load_settings(data_dir=data_dir)
    url = database_url(settings.database_url, settings.data_dir)
    upgrade_database(url)
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            if action == "create":
                print(create_key(session, tenant=tenant, admin=admin, expires_in=expires_in))
                return 0
            if action == "list":
                _print_table(describe_keys(session, tenant))
                return 0
            revoked = revoke_keys(session, tenant=tenant, key=key)
            _forget_revoked_bootstrap_key(session, settings)
    finally:
        engine.dispose()
    print(f"mebp: revoked {revoked} key(s)", file=sys.stderr)
    return 0 if revoked else 1


def _forget_revoked_bootstrap_key(session: Session, settings: Settings) -> None:
    """The key kept for `mebp serve`, revoked, is removed: its next start makes a new one."""
    path = settings.data_dir / KEY_FILE
    if path.exists() and principal_for_hash(session, hash_key(path.read_text().strip())) \
            is None:
        path.unlink()
        print(f"mebp: removed {path}: the next `mebp serve` makes a new key",
              file=sys.stderr)


def _print_table(rows: list[dict[str, str]]) -> None:
    if not rows:
        print("mebp: no keys", file=sys.stderr)
        return
    widths = {name: max(len(name), *(len(row[name]) for row in rows)) for name in rows[0]}
    for line in ({name: name for name in rows[0]}, *rows):
        print("  ".join(line[name].ljust(width) for name, width in widths.items()).rstrip())
