"""``Settings``: the only reader of the environment for the service."""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "mebp"


class Settings(BaseSettings):
    """Service settings from ``MEBP_*`` variables (``MEBP_API_KEY``, ``MEBP_DATA_DIR``...)."""

    model_config = SettingsConfigDict(env_prefix="MEBP_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    data_dir: Path = Field(default_factory=default_data_dir)
    # the bootstrap key; one is made (and printed by `mebp serve`) when unset
    api_key: str = Field(default_factory=lambda: "mebp-" + secrets.token_urlsafe(24),
                         min_length=8)
    cache_dir: Path | None = None  # packed models and the host calibration
    # PostgreSQL for a shared deployment; SQLite inside data_dir when unset
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    threads: int | None = Field(default=None, ge=1)
