"""``Settings``: the only reader of the environment for the service and its workers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Enforcement = Literal["auto", "cgroup-v2", "cgroup-v1", "rlimit"]


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "mebp"


class Settings(BaseSettings):
    """Service settings from ``MEBP_*`` variables (``MEBP_API_KEY``, ``MEBP_DATA_DIR``...),
    plus ``DATABASE_URL`` and ``REDIS_URL``."""

    model_config = SettingsConfigDict(env_prefix="MEBP_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    data_dir: Path = Field(default_factory=default_data_dir)
    # the bootstrap key; unset, `mebp serve` uses the one it made before, kept in the data
    # dir, or makes one there (app/keys.py `bootstrap_key`)
    api_key: str | None = Field(default=None, min_length=8)
    cache_dir: Path | None = None  # packed models and the host calibration
    # datasets and adapters; shared by every worker of a deployment (data_dir/storage if unset)
    storage_dir: Path | None = None
    # PostgreSQL for a shared deployment; SQLite inside data_dir when unset
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    # a shared Redis; `mebp serve` starts an embedded one inside data_dir when unset
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    queue_name: str = Field(default="mebp", min_length=1, max_length=64)
    workers: int = Field(default=1, ge=0, le=64, description="workers `mebp serve` starts")
    enforcement: Enforcement = "auto"  # how a job's memory budget is enforced
    # where registered models may live (os.pathsep-separated); nothing outside is read
    model_roots: str = ""
    max_upload_bytes: int = Field(default=256 << 20, ge=1)  # after decompression
    max_upload_rows: int = Field(default=1_000_000, ge=1)
    max_line_bytes: int = Field(default=1 << 20, ge=16)
    # any other request body (JSON, forms), refused before it is read or its key checked
    max_request_bytes: int = Field(default=1 << 20, ge=1024)
    # a slow or idle client (app/connection_guard.py): its request's head whole within
    # header_timeout_s and at most max_header_bytes; its body at body_min_bytes_per_s or more
    # after body_timeout_s; at most max_connections open at once per API process
    max_connections: int = Field(default=4096, ge=16, le=1 << 20)
    max_header_bytes: int = Field(default=32 << 10, ge=1024, le=1 << 20)
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    body_timeout_s: float = Field(default=20.0, gt=0, le=3600)
    body_min_bytes_per_s: float = Field(default=500.0, gt=0)
    # health is degraded (503) when the storage root or data dir has less free than this
    min_free_storage_bytes: int = Field(default=8 << 20, ge=0)
    # kept in reserve on the data dir's disk, freed so a job that filled it can be recorded
    storage_reserve_bytes: int = Field(default=8 << 20, ge=0)
    # every job's engine threads; unset, each job takes the cores free as it starts
    threads: int | None = Field(default=None, ge=1)
    # event streams one key (its API clients and dashboard tabs together) holds open at once
    max_streams_per_key: int = Field(default=16, ge=1, le=10_000)
    # base exports (service/bases.py): a tenant starts at most this many in any hour (the
    # count kept in Redis, so every API process sees it), and the kept ones are evicted,
    # least recently served first, beyond max_base_cache_bytes
    max_base_exports_per_tenant_per_hour: int = Field(default=8, ge=0, le=10_000)
    max_base_cache_bytes: int = Field(default=4 << 30, ge=0)
    # fairness: a tenant's jobs waiting (more are a 429; the default admits the largest
    # simulated fleet) and running at once (more wait while other tenants' jobs go first);
    # the API and every worker must share these
    max_queued_jobs_per_tenant: int = Field(default=256, ge=1)
    max_running_jobs_per_tenant: int = Field(default=2, ge=1)
    # a fleet whose training file has more rows (or more than INLINE_SPLIT_BYTES) is
    # split into its devices' shards by a worker, not within its request
    fleet_inline_split_rows: int = Field(default=10_000, ge=0)
    # a dashboard sign-in ends at sign-out, when its key is revoked, or after this long
    session_ttl_s: int = Field(default=12 * 3600, ge=1, le=30 * 86400)
    # faults: a running job whose heartbeat is older than this has lost its worker; it is
    # re-queued (resuming from its last checkpoint) up to max_attempts times
    heartbeat_timeout_s: float = Field(default=30.0, ge=2)
    max_attempts: int = Field(default=3, ge=1, le=100)
    reconcile_interval_s: float = Field(default=5.0, gt=0)
    # a federated round with no job left running this long has lost its coordinator; a fleet
    # preparing this long whose preparation RQ no longer holds is asked again (max_attempts
    # tries in all)
    advance_grace_s: float = Field(default=30.0, ge=0)
    checkpoint_every: int = Field(default=25, ge=1, description="steps between checkpoints, "
                                  "unless the job sets its own")
    # the adapters a job keeps at its checkpoint steps, for download: the newest this many
    # (the oldest go as new ones are kept)
    max_checkpoints_per_job: int = Field(default=10, ge=1, le=10_000)
    # webhooks (service/webhooks.py): an attempt is cut after webhook_timeout_s; one that
    # failed for a reason that may pass (no answer, 408, 429, 5xx) is tried again after
    # webhook_retry_base_s, doubling up to webhook_retry_max_s, webhook_max_attempts in all
    # (with the defaults: over about 3 hours); due deliveries are looked for every
    # webhook_interval_s
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=300)
    webhook_retry_base_s: float = Field(default=30.0, gt=0, le=86400)
    webhook_retry_max_s: float = Field(default=3600.0, gt=0, le=86400)
    webhook_max_attempts: int = Field(default=10, ge=1, le=100)
    webhook_interval_s: float = Field(default=1.0, gt=0, le=3600)
    # at most webhook_max_in_flight attempts at once, webhook_max_in_flight_per_host of them
    # to one host (host:port), so one slow receiver holds neither the others nor all slots
    webhook_max_in_flight: int = Field(default=64, ge=1, le=1024)
    webhook_max_in_flight_per_host: int = Field(default=8, ge=1, le=1024)
    # a receiver resolving to a loopback, private, link-local (169.254.169.254, the cloud's
    # metadata), unique-local or unspecified address is refused unless this allows it
    webhook_allow_private: bool = False
    # after a rotation, the previous secret signs too (a second v1 signature) this long
    webhook_secret_grace_s: float = Field(default=86400.0, ge=0, le=30 * 86400)

    @property
    def model_root_paths(self) -> list[Path]:
        return [Path(part).resolve() for part in self.model_roots.split(os.pathsep) if part]

    @property
    def plan_threads(self) -> int:
        """The threads the API plans at: the setting, else every core (a free host; the
        worker that runs the job keeps the configuration, at the threads it takes)."""
        return self.threads or os.cpu_count() or 1

    @property
    def storage_root(self) -> Path:
        return self.storage_dir or self.data_dir / "storage"


def load_settings(**overrides) -> Settings:
    """The environment's settings with the command line's ``overrides`` (None: not given),
    the data directory made."""
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings
